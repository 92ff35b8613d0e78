#!/usr/bin/env bash
# What one huge token costs (issue 11, item 7): a collection holding `"zebra " + "b" x 10,000,000`
# and `"yak " + "😀" x 1,310,720` (5 MB), queried for `zebra` and `yak` with a budget of 256.
#
#   scripts/bench-huge-token.sh BINARY [DENSE] [TOKENIZER] [RUNS]
#
# BINARY: a release `lathe`; DENSE: `off` (default) or `minilm`; TOKENIZER: `minilm` (default),
# `cl100k_base` or `o200k_base`; RUNS: fresh-server query runs per document (default 3).
#
# For the ingest (one upload of both documents) and for each query it prints the server's CPU
# seconds (utime + stime from /proc, so only the server's own work), its peak RSS (VmHWM) and
# the wall time; each query runs on a freshly started server (no cached section, no cached
# answer), RUNS times, and the median is printed with every run. Also the bytes returned and
# the tokens used. Needs python3 (to write the documents and read the JSON answer).
set -euo pipefail

binary="$(realpath "$1")"
dense="${2:-off}"
tokenizer="${3:-minilm}"
runs="${4:-3}"
models="$(realpath "${LATHE_MODELS_DIR:-models}")"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/docs.jsonl", "w") as out:
    out.write(json.dumps({"id": "letters", "text": "zebra " + "b" * 10_000_000}) + "\n")
    out.write(json.dumps({"id": "emoji", "text": "yak " + "\U0001F600" * (5 << 18)}) + "\n")
PY

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
address="127.0.0.1:$port"
ticks_per_second="$(getconf CLK_TCK)"

start_server() {
  : >"$work/server.log"
  LATHE_MODELS__DENSE="$dense" LATHE_SERVER__CPU_THREADS=2 "$binary" serve --listen "$address" \
    --data-dir "$work/data" --models-dir "$models" 2>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 600); do
    grep -q "lathe serving" "$work/server.log" && return 0
    sleep 0.1
  done
  echo "the server did not start:" >&2; cat "$work/server.log" >&2; exit 1
}

stop_server() {
  kill -TERM "$server_pid"; wait "$server_pid" || true; server_pid=""
}

cpu_seconds() { # utime + stime of the server
  awk -v tps="$ticks_per_second" '{ sub(/^.*\) /, ""); split($0, f, " "); printf "%.2f", (f[12] + f[13]) / tps }' "/proc/$server_pid/stat"
}

peak_rss_mib() { awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$server_pid/status"; }

now() { date +%s.%N; }

median() { python3 -c 'import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

echo "binary $binary, dense $dense, tokenizer $tokenizer, $(date -u +%Y-%m-%dT%H:%MZ)"
start_server
started="$(now)"
"$binary" ingest -c huge --addr "$address" --tokenizer "$tokenizer" "$work/docs.jsonl" >/dev/null
echo "ingest: server cpu $(cpu_seconds) s (including start), peak rss $(peak_rss_mib) MiB, wall $(python3 -c "print(round($(now) - $started, 2))") s"
stop_server

for query in zebra yak; do
  cpus=(); walls=(); rss=()
  for _ in $(seq "$runs"); do
    start_server
    cpu_before="$(cpu_seconds)"
    started="$(now)"
    "$binary" query -c huge --addr "$address" --budget 256 --json "$query" >"$work/answer.json"
    walls+=("$(python3 -c "print(round($(now) - $started, 3))")")
    cpus+=("$(python3 -c "print(round($(cpu_seconds) - $cpu_before, 2))")")
    rss+=("$(peak_rss_mib)")
    stop_server
  done
  returned="$(python3 -c '
import json, sys
answer = json.load(open(sys.argv[1]))
chunks = answer.get("chunks", [])
text = sum(len(c.get("text", "").encode()) + len(c.get("context", "").encode()) for c in chunks)
used = answer.get("tokensUsed", 0)
print(f"{text} bytes in {len(chunks)} chunks, {used} tokens used")
' "$work/answer.json")"
  echo "query $query: server cpu median $(median "${cpus[@]}") s (${cpus[*]}), peak rss median $(median "${rss[@]}") MiB (${rss[*]}), wall median $(median "${walls[@]}") s (${walls[*]}); $returned"
done
