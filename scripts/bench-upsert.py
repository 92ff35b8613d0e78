#!/usr/bin/env python3
# Run by scripts/bench-writes.sh python: ADDR DOCS_JSONL.
"""Python client upsert of all covid-a papers with default settings: time to the answer, time to
applied, and every document retrievable."""
import json, sys, time
from lathe_client import Lathe, Document

addr = sys.argv[1]
docs = [json.loads(l) for l in open(sys.argv[2])]
client = Lathe(addr)
client.create_collection("covid", exist_ok=True)
documents = [Document(id=d["doc_id"], title=d["title"], text=d["text"]) for d in docs]
t0 = time.monotonic()
result = client.upsert("covid", documents)
answered = time.monotonic() - t0
op = result.operation
print(f"answered in {answered:.3f} s: operation {op.id} {op.state.name} {op.documents_total} documents {op.bytes_total/1e6:.2f} MB")
last = [0.0]
def progress(o):
    now = time.monotonic() - t0
    if now - last[0] > 10:
        last[0] = now
        print(f"  {now:6.1f} s {o.state.name} {o.documents_done}/{o.documents_total} docs, {o.bytes_done/1e6:.2f} MB, {o.bytes_per_second/1e3:.1f} KB/s, eta {o.eta_seconds}")
final = client.wait_operation(op.id, progress=progress)
applied = time.monotonic() - t0
print(f"applied in {applied:.1f} s: {final.state.name}, {final.sections} sections, {final.bytes_total/applied/1e3:.1f} KB/s")
missing = [d["doc_id"] for d in docs if not client.retrieve("covid", d["title"], budget=256, doc_ids=[d["doc_id"]]).chunks]
print(f"documents not retrievable: {len(missing)} {missing[:5]}")
