#!/usr/bin/env bash
# Checks that the eval baseline splitter (crates/lathe-tools/src/eval/splitter.rs) cuts exactly like LangChain's
# RecursiveCharacterTextSplitter: same chunks, byte for byte, on every squad-a article and a few
# adversarial texts, at chunk_size/overlap 400/0, 1000/200, 100/30 and 50/0.
# Needs python3 (a venv with langchain-text-splitters is made under $WORK) and rustc.
# Usage: scripts/check-baseline-splitter.sh [path/to/squad-a]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
squad="${1:-$repo/../shared/eval/squad-a}"
WORK="${WORK:-$(mktemp -d)}"
mkdir -p "$WORK" && cd "$WORK"
[ -x venv/bin/python ] || { python3 -m venv venv && venv/bin/pip install -q "langchain-text-splitters==1.1.3"; }
venv/bin/python - "$squad/docs.jsonl" <<'PY'
import json, sys
from langchain_text_splitters import RecursiveCharacterTextSplitter as R
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
texts += ["a" * 1500, "word " * 500, "x\n\n\n\ny\n \n z" * 50, "line one\nline two\n\n" * 100,
          "  lead and trail  \n\n" * 60, "héllo wörld ünïcode café " * 80]
with open("texts.bin", "w", encoding="utf-8") as f:
    for t in texts:
        f.write(f"{len(t.encode('utf-8'))}\n{t}")
with open("expected.txt", "w") as out:
    for size, overlap in [(400, 0), (1000, 200), (100, 30), (50, 0)]:
        splitter = R(chunk_size=size, chunk_overlap=overlap)
        for i, t in enumerate(texts):
            for c in splitter.split_text(t):
                out.write(f"{size} {overlap} {i} {c.encode('utf-8').hex()}\n")
PY
cat > check.rs <<RS
#[path = "$repo/crates/lathe-tools/src/eval/splitter.rs"]
mod splitter;
use std::io::Read;
fn main() {
    let mut data = Vec::new();
    std::fs::File::open("texts.bin").unwrap().read_to_end(&mut data).unwrap();
    let (mut texts, mut i) = (Vec::new(), 0);
    while i < data.len() {
        let nl = data[i..].iter().position(|&b| b == b'\n').unwrap() + i;
        let len: usize = std::str::from_utf8(&data[i..nl]).unwrap().parse().unwrap();
        texts.push(String::from_utf8(data[nl + 1..nl + 1 + len].to_vec()).unwrap());
        i = nl + 1 + len;
    }
    for (size, overlap) in [(400, 0), (1000, 200), (100, 30), (50, 0)] {
        let splitter = splitter::RecursiveCharacterSplitter::new(size, overlap);
        for (i, t) in texts.iter().enumerate() {
            for r in splitter.split_bytes(t) {
                let hex: String = t[r].bytes().map(|b| format!("{b:02x}")).collect();
                println!("{size} {overlap} {i} {hex}");
            }
        }
    }
}
RS
rustc --edition 2021 -O -A dead_code check.rs -o check
./check > actual.txt
if cmp -s actual.txt expected.txt; then
  echo "identical: $(wc -l < expected.txt) chunks"
else
  echo "DIFFERENT from LangChain (see $WORK/actual.txt vs expected.txt)"; exit 1
fi
