#!/usr/bin/env python3
"""Replay the score and pack stages offline, from the candidates a server traced, with other weights.

    scripts/eval-pack-replay.py DATASET_DIR SERVER_LOG [--run RUN_JSONL] [--weights B,S,D ...]

The server writes each Retrieve's scored candidates when its log is JSON and the trace target is
on (`query::score::trace_candidates`):

    LATHE_LOG__FORMAT=json LATHE_LOG__FILTER=info,lathe::candidates=trace lathe serve ... 2> LOG
    lathe eval DATASET_DIR --addr ... --strategies "" --budgets ... --out OUT

Each candidate carries its raw signals (chunk BM25 with the candidates' idf, the section's coarse
score relative to the best, the pooled cosine), so a fusion of other weights can be tried in
seconds instead of a build and an eval run per setting. For each weight set (`--weights
bm25,section,dense`; the server's defaults are 1,0.5,1) the script fuses the signals as the score
stage does (BM25 over the largest, cosine min–max over the candidates), packs greedily and
prints answer recall per budget (the metric of ../shared/eval/README.md). The first line replays
the server's own order, so its distance from the eval's figures is the replay's error.

The pack is an approximation of `query::pack`: a candidate costs its tokens times the share of
its bytes not yet taken, one that would start a span of its own is skipped when it holds fewer
tokens than `pack::least_new_span_tokens` asks (8, an eighth of the budget or half the largest
candidate, whichever is least; whole sections are not told apart), and it stops with under 4
tokens left; the expand and join stages are not replayed. On covid-a it lands within 0.007 of the server's recall at every budget from 128 to
4,096. The server's order is after any MMR it applied (`diversified` in the log); a weight set
sorts by its fused score alone, so it replays those queries without MMR.
"""

import argparse
import collections
import json


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def byte_offsets(text):
    """The UTF-8 byte offset of each code point of `text`, and of its end."""
    offsets = [0]
    for char in text:
        offsets.append(offsets[-1] + len(char.encode("utf-8")))
    return offsets


def traced_retrieves(log_path, questions_by_text, offsets):
    """(budget, candidates, gold answer byte spans, gold doc) of each traced Retrieve."""
    rows = []
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            if '"lathe::candidates"' not in line:
                continue
            fields = json.loads(line)["fields"]
            candidates = json.loads(fields["candidates"])
            for q in questions_by_text.get(fields["query"], []):
                doc = offsets[q["doc_id"]]
                spans = [(doc[a["start"]], doc[a["end"]]) for a in q["answers"]]
                rows.append((int(fields["budget"]), candidates, spans, q["doc_id"]))
    return rows


def fuse(candidates, weights):
    """The score stage's fusion of the raw signals with `weights` (bm25, section, dense)."""
    w_bm25, w_section, w_dense = weights
    top_bm25 = max(c["bm25"] for c in candidates) or 1.0
    low = min(c["dense"] for c in candidates)
    spread = (max(c["dense"] for c in candidates) - low) or 1.0
    return [
        w_bm25 * c["bm25"] / top_bm25 + w_section * c["section"] + w_dense * (c["dense"] - low) / spread
        for c in candidates
    ]


def blank(text, start, end):
    """Only whitespace lies between byte `start` and byte `end` (true when they touch)."""
    return start <= end and not text[start:end].strip()


def pack(candidates, order, budget, texts):
    """Byte spans taken per document, greedily in `order` (see the module's docs)."""
    taken = collections.defaultdict(list)
    left = budget
    least = min(8, budget // 8, max(c["tokens"] for c in candidates) // 2)
    for i in order:
        c = candidates[i]
        start, end, spans = c["start"], c["end"], taken[c["doc_id"]]
        covered = sum(max(0, min(end, e) - max(start, s)) for s, e in spans)
        if covered >= end - start:
            continue
        text = texts[c["doc_id"]]
        touches = any(
            (s <= end and start <= e) or blank(text, e, start) or blank(text, end, s) for s, e in spans
        )
        if not touches and c["tokens"] < least:
            continue
        cost = c["tokens"] * (1 - covered / (end - start))
        if cost <= left + 0.5:
            left -= cost
            spans.append((start, end))
        if left < 4:
            break
    return taken


def answered(taken, doc_id, answer_spans, text):
    """One span, the taken spans that only whitespace separates made one, holds an answer."""
    merged = []
    for s, e in sorted(taken[doc_id]):
        if merged and (s <= merged[-1][1] or blank(text, merged[-1][1], s)):
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return any(s <= a and b <= e for s, e in merged for a, b in answer_spans)


def share_by_budget(rows, holds):
    """Per budget, the share of traced Retrieves for which `holds(budget, candidates, spans,
    doc_id)` is true."""
    hits, counts = collections.Counter(), collections.Counter()
    for row in rows:
        counts[row[0]] += 1
        hits[row[0]] += bool(holds(*row))
    return {b: hits[b] / counts[b] for b in sorted(counts)}


def recall_by_budget(rows, order_of, texts):
    """Answer recall per budget when each Retrieve's candidates are packed in `order_of` them."""

    def packed_answer(budget, candidates, spans, doc_id):
        taken = pack(candidates, order_of(candidates), budget, texts)
        return answered(taken, doc_id, spans, texts[doc_id])

    return share_by_budget(rows, packed_answer)


def a_candidate_holds_one(budget, candidates, spans, doc_id):
    """Some candidate of the gold document holds a whole gold answer: the score stage's ceiling."""
    return any(c["doc_id"] == doc_id and c["start"] <= a and b <= c["end"] for c in candidates for a, b in spans)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="folder with docs.jsonl and queries.jsonl")
    parser.add_argument("log", help="the server's JSON log with lathe::candidates at trace level")
    parser.add_argument("--run", help="run.jsonl of the eval: only its questions are replayed")
    parser.add_argument("--weights", action="append", default=[], help="bm25,section,dense (repeatable)")
    args = parser.parse_args()
    queries = load_jsonl(f"{args.dataset}/queries.jsonl")
    if args.run:
        asked = {row["qid"] for row in load_jsonl(args.run)}
        queries = [q for q in queries if q["qid"] in asked]
    by_text = collections.defaultdict(list)
    for q in queries:
        by_text[q["question"]].append(q)
    documents = load_jsonl(f"{args.dataset}/docs.jsonl")
    offsets = {d["doc_id"]: byte_offsets(d["text"]) for d in documents}
    texts = {d["doc_id"]: d["text"].encode("utf-8") for d in documents}
    rows = traced_retrieves(args.log, by_text, offsets)
    if not rows:
        raise SystemExit("no traced Retrieve in the log: is lathe::candidates at trace level?")

    def report(name, recall):
        print(f"{name:<24} " + " ".join(f"{b}: {r:.3f}" for b, r in recall.items()))

    report("server's order", recall_by_budget(rows, lambda c: range(len(c)), texts))
    for text in args.weights:
        weights = tuple(float(w) for w in text.split(","))
        if len(weights) != 3:
            raise SystemExit(f"--weights {text}: give three numbers, bm25,section,dense")

        def by_score(candidates, weights=weights):
            scores = fuse(candidates, weights)
            return sorted(range(len(candidates)), key=lambda i: -scores[i])

        report(f"weights {text}", recall_by_budget(rows, by_score, texts))
    report("a candidate holds one", share_by_budget(rows, a_candidate_holds_one))


if __name__ == "__main__":
    main()
