"""Writes tests/fixtures/reference_vectors.json: reference sentence vectors computed with Python
onnxruntime 1.31.1 + tokenizers over the same model files, for the Rust embedders to match.

Run: /work/scratch/pyref/bin/python scripts/reference_vectors.py
"""
import json, struct
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

M = "/work/main/models"
SENTENCES = [
    "The cat sits on the mat",
    "A kitten is resting on a rug",
    "Quarterly revenue grew 12 percent",
    "Super Bowl 50 was an American football game to determine the champion of the National Football League (NFL) for the 2015 season.",
]

tok = Tokenizer.from_file(f"{M}/minilm/tokenizer.json")
tok.no_padding(); tok.no_truncation()
sess = ort.InferenceSession(f"{M}/minilm/model.onnx", providers=["CPUExecutionProvider"])
minilm = []
for s in SENTENCES:
    e = tok.encode(s, add_special_tokens=True)
    ids = np.array([e.ids], dtype=np.int64)
    mask = np.ones_like(ids)
    out = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0][0]
    v = out.mean(axis=0); v = v / np.linalg.norm(v)
    minilm.append([float(x) for x in v])

# Static (wordllama): mean of float16 rows of the tokens (no special tokens), L2-normalised.
raw = open(f"{M}/wordllama/l2_supercat_256.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
info = header["embedding.weight"]
a, b = info["data_offsets"]
table = np.frombuffer(raw[8 + n + a: 8 + n + b], dtype=np.float16).reshape(info["shape"]).astype(np.float32)
wtok = Tokenizer.from_file(f"{M}/wordllama/tokenizer.json")
wtok.no_padding(); wtok.no_truncation()
static = []
for s in SENTENCES:
    ids = wtok.encode(s, add_special_tokens=False).ids
    v = table[ids].mean(axis=0); v = v / np.linalg.norm(v)
    static.append([float(x) for x in v])

def cos(a, b): return float(np.dot(a, b))
print("minilm cat/kitten", cos(minilm[0], minilm[1]), "cat/revenue", cos(minilm[0], minilm[2]), "kitten/revenue", cos(minilm[1], minilm[2]))
json.dump({"sentences": SENTENCES, "minilm": minilm, "static": static}, open("tests/fixtures/reference_vectors.json", "w"))
