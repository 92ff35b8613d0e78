#!/usr/bin/env python3
"""Embed reuse: wall time of a first upsert of a long document, of a re-upsert of identical
content, and of an upsert with one paragraph edited, against a running `lathe serve`.

    scripts/bench-reuse.py [--addr 127.0.0.1:50051] [--runs 5] [--docs ../shared/eval/covid-a/docs.jsonl]

Each run uses a new collection: first upsert (everything embedded), the same again (everything
reused), then paragraph k of the text changed (one section embedded). Prints the medians.
Needs the Python client (clients/python) installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

from lathe_client import Document, DocumentFormat, Lathe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--docs", default="../shared/eval/covid-a/docs.jsonl")
    parser.add_argument("--min-bytes", type=int, default=20_000)
    args = parser.parse_args()

    with open(args.docs, encoding="utf-8") as file:
        documents = [json.loads(line) for line in file if line.strip()]
    long_enough = [d for d in documents if len(d["text"].encode()) >= args.min_bytes]
    document = min(long_enough, key=lambda d: len(d["text"]))
    text = document["text"]
    paragraphs = text.split("\n\n")
    print(f"document {document.get('id') or document.get('doc_id')}: {len(text.encode())} bytes, {len(paragraphs)} paragraphs")

    timings: dict[str, list[float]] = {"first": [], "identical": [], "one paragraph edited": []}
    with Lathe(args.addr, timeout=600) as lathe:
        for run in range(args.runs):
            name = f"bench-reuse-{uuid.uuid4().hex[:8]}"
            lathe.create_collection(name)

            def timed(label: str, body: str) -> int:
                started = time.perf_counter()
                written = lathe.upsert(name, [Document(id="long", text=body, format=DocumentFormat.PLAIN)], wait=True)
                timings[label].append(time.perf_counter() - started)
                return written.sections

            sections = timed("first", text)
            timed("identical", text)
            edited = list(paragraphs)
            k = (run * 7 + len(paragraphs) // 2) % len(paragraphs)
            edited[k] = edited[k] + " This sentence was added by the edit."
            timed("one paragraph edited", "\n\n".join(edited))
            lathe.delete_collection(name)
    print(f"{sections} sections; medians of {args.runs} runs:")
    first = statistics.median(timings["first"])
    for label, values in timings.items():
        median = statistics.median(values)
        print(f"  {label:22s} {median * 1000:9.1f} ms  ({median / first:.3f} of first)  runs: {', '.join(f'{v:.3f}' for v in values)}")


if __name__ == "__main__":
    main()
