#!/usr/bin/env python3
"""Where a `lathe eval` run's misses lie, per system and budget.

    scripts/eval-miss-kinds.py DATASET_DIR RUN_JSONL

For every system and budget of the run file (`lathe eval --out DIR` writes DIR/run.jsonl) it
prints answer recall and doc hit (the metrics of ../shared/eval/README.md) three ways:
- over all questions;
- over the questions that name something: a word beyond stopwords and the generic vocabulary of
  papers ("study", "report", "conclusion", "authors"...);
- over the rest, the content-free ones ("What is the conclusion of this study?"), which no
  retrieval can tie to one paper of a collection: a system finds theirs only by chance, and the
  more papers its chunks spread over, the more often.

Then, with `--joined`, the answer recall the run would have if the returned chunks of one
document that only whitespace separates (chunks of neighbouring sections) were one chunk.

The word lists are a heuristic written for covid-a's questions, not part of any metric.
"""

import argparse
import collections
import json
import re

STOPWORDS = set(
    """what which who whom whose when where why how is are was were be been do does did the a an of
    in on for to by with this that these those from at as and or it its their they there can could
    may might will would should has have had being than then also about into over under not no yes
    many much most more some any all each other such only own same so too very s t just don now""".split()
)

GENERIC = set(
    """study studies report reports reported publication paper article review work survey analysis
    analyses author authors researchers investigators data trial result results finding findings
    conclusion conclusions concluded conclude method methods methodology suggest suggests suggested
    show shows showed shown present presented presents highlight highlighted include includes
    included including collected obtained sample samples main purpose aim goal objective describe
    described describes discussed discuss support supports supported conducted performed observed
    find found key important role use used using reason reasons outcome outcomes effect effects
    consequence consequences percentage population affected number cases case compiled complied
    drawn""".split()
)


def content_free(question):
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9\-]+", question)]
    return all(w in STOPWORDS or w in GENERIC for w in words)


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answered(query, chunks):
    """One returned chunk of the gold document holds a whole gold answer span."""
    return any(
        c["doc_id"] == query["doc_id"] and c["start"] <= a["start"] and c["end"] >= a["end"]
        for c in chunks
        for a in query["answers"]
    )


def doc_hit(query, chunks):
    return any(c["doc_id"] == query["doc_id"] for c in chunks)


def joined(chunks, texts):
    """The chunks with those of one document that only whitespace separates made one."""
    by_doc = collections.defaultdict(list)
    for c in chunks:
        by_doc[c["doc_id"]].append((c["start"], c["end"]))
    out = []
    for doc, spans in by_doc.items():
        spans.sort()
        start, end = spans[0]
        for s, e in spans[1:]:
            if s <= end or texts[doc][end:s].strip() == "":
                end = max(end, e)
            else:
                out.append({"doc_id": doc, "start": start, "end": end})
                start, end = s, e
        out.append({"doc_id": doc, "start": start, "end": end})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="folder with docs.jsonl and queries.jsonl")
    parser.add_argument("run", help="run.jsonl of `lathe eval`")
    parser.add_argument("--joined", action="store_true", help="also the recall with neighbouring chunks joined")
    args = parser.parse_args()
    queries = {q["qid"]: q for q in load_jsonl(f"{args.dataset}/queries.jsonl")}
    texts = {d["doc_id"]: d["text"] for d in load_jsonl(f"{args.dataset}/docs.jsonl")}
    runs = collections.defaultdict(dict)
    for row in load_jsonl(args.run):
        runs[(row["strategy"], row["budget"])][row["qid"]] = row["chunks"]
    free = {qid for qid, q in queries.items() if content_free(q["question"])}
    print(f"{len(queries)} questions, {len(free)} content-free")
    print("system | budget | recall / doc hit: all | naming something | content-free" + (" | recall joined" if args.joined else ""))
    for (system, budget), answers in sorted(runs.items()):
        groups = [list(answers), [k for k in answers if k not in free], [k for k in answers if k in free]]
        cells = []
        for keys in groups:
            n = max(len(keys), 1)
            recall = sum(answered(queries[k], answers[k]) for k in keys) / n
            hit = sum(doc_hit(queries[k], answers[k]) for k in keys) / n
            cells.append(f"{recall:.3f} / {hit:.3f} ({len(keys)})")
        if args.joined:
            recall = sum(answered(queries[k], joined(answers[k], texts)) for k in answers) / max(len(answers), 1)
            cells.append(f"{recall:.3f}")
        print(f"{system} | {budget} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
