#!/usr/bin/env bash
# `lathe export` cost (BENCHMARKS.md, "Snapshots"), on release binaries:
#
#   scripts/bench-export.sh covid               covid-a ingested (default model, MiniLM) into a
#                                               fresh server, snapshotted, then exported
#   DATA=DIR COLLECTION=C scripts/bench-export.sh scale
#                                               a collection of an existing data dir, e.g. one
#                                               `lathe-bench --sizes 100000 --keep --work-dir W`
#                                               left (static vectors: LATHE_MODELS__DENSE=static)
#
# Measured: `lathe export SNAPSHOT --out FILE` run ROUNDS times (default 5) on the idle machine,
# each run's wall time and peak RSS (GNU time), the median of each, and the JSONL's size and lines.
# BIN (default target/release/lathe). Scratch: $WORK (default /tmp/bench-export).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/lathe}
COVID=../shared/eval/covid-a
WORK=${WORK:-/tmp/bench-export}
ROUNDS=${ROUNDS:-5}
PORT=50092; ADDR=127.0.0.1:$PORT
mkdir -p "$WORK"
start() { # data dir
  "$BIN" serve --listen $ADDR --data-dir "$1" --models-dir models --log-format json 2>"$WORK/server.log" &
  echo $! > "$WORK/server.pid"
  for _ in $(seq 1 600); do grep -q "lathe serving" "$WORK/server.log" && return 0; sleep 0.5; done
  echo "no serve"; return 1
}
stop() { kill -TERM "$(cat "$WORK/server.pid")"; wait "$(cat "$WORK/server.pid")" 2>/dev/null; }
snapshot() { # collection: downloads a fresh snapshot to $WORK/last.snapshot
  local listed name
  "$BIN" snapshot --addr $ADDR create "$1" --keep 1 > /dev/null
  listed=$("$BIN" snapshot --addr $ADDR list "$1" | head -1)
  name=${listed%% *}; name=${name#*/}
  "$BIN" snapshot --addr $ADDR download "$1" "$name" --out "$WORK/last.snapshot" > /dev/null
  "$BIN" snapshot --addr $ADDR delete "$1" "$name"
  echo "snapshot: $listed"
}
measure() {
  : > "$WORK/runs.txt"
  for _ in $(seq 1 "$ROUNDS"); do
    rm -f "$WORK/out.jsonl"
    /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$BIN" export "$WORK/last.snapshot" \
      --out "$WORK/out.jsonl" 2> "$WORK/export.log"
    cat "$WORK/time.txt" >> "$WORK/runs.txt"
  done
  tail -1 "$WORK/export.log"
  echo "jsonl: $(stat -c %s "$WORK/out.jsonl") bytes, $(wc -l < "$WORK/out.jsonl") documents"
  sort -n "$WORK/runs.txt" | awk -v n="$ROUNDS" '{ t[NR] = $1 } END {
    printf "export, %d runs: seconds median %.2f (min %.2f, max %.2f)\n", n, t[int((n + 1) / 2)], t[1], t[n] }'
  sort -n -k2 "$WORK/runs.txt" | awk -v n="$ROUNDS" '{ m[NR] = $2 } END {
    printf "peak RSS: median %.0f MiB\n", m[int((n + 1) / 2)] / 1024 }'
  rm -f "$WORK/out.jsonl" "$WORK/last.snapshot"
}
case "${1:-covid}" in
covid)
  rm -rf "$WORK/covid"; mkdir -p "$WORK/covid"
  start "$WORK/covid"
  "$BIN" ingest --addr $ADDR --collection covid $COVID/docs.jsonl > /dev/null
  snapshot covid
  stop
  measure;;
scale)
  start "$DATA"
  snapshot "$COLLECTION"
  stop
  measure;;
esac
