#!/usr/bin/env python3
"""Turn the Debian-docs slice written by scripts/fetch-debian-docs.sh into a dataset folder that
`lathe-load` and `lathe eval` read (docs.jsonl, queries.jsonl).

Queries are the documents' own reStructuredText section titles (a title line underlined with
=, -, ~, ^ or *), the way a user searches technical docs by topic. They carry no answer spans, so
the folder is for latency and load, not for answer recall.

    scripts/debian-docs-dataset.py /tmp/lathe-debian-docs /tmp/lathe-debian-dataset
"""
import json
import pathlib
import re
import sys

source, target = map(pathlib.Path, sys.argv[1:3])
target.mkdir(parents=True, exist_ok=True)
underline = re.compile(r"^([=\-~^*])\1{2,}\s*$")
with open(target / "docs.jsonl", "w") as docs, open(target / "queries.jsonl", "w") as queries:
    count = 0
    for path in sorted(source.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.write(json.dumps({"doc_id": path.stem, "title": path.stem, "text": text}) + "\n")
        lines = text.splitlines()
        for previous, line in zip(lines, lines[1:]):
            title = previous.strip()
            if underline.match(line) and len(title) >= 8 and not underline.match(previous):
                count += 1
                queries.write(json.dumps({"qid": f"{path.stem}-{count}", "question": title, "doc_id": path.stem, "answers": []}) + "\n")
print(f"{target}: {len(list(source.glob('*.txt')))} documents, {count} title queries")
