#!/usr/bin/env bash
# The write path's figures in BENCHMARKS.md ("Writes"), on release binaries, MiniLM, covid-a:
#
#   scripts/bench-writes.sh python      the Python client's upsert of all 49 papers with default
#                                       settings: time to the answer, to applied, all retrievable
#   OLD=BINARY scripts/bench-writes.sh ingest
#                                       `lathe ingest` of covid-a, two rounds alternating OLD and
#                                       BIN on fresh servers
#   scripts/bench-writes.sh isolation   4 lathe-load readers of cache misses for 60 s, idle, then
#                                       during a `lathe ingest` of covid-a into another collection;
#                                       and that ingest's time against the same ingest alone
#
# READ_ARGS: more lathe-load arguments for the readers, e.g. `--rate 25` (each reader sends 25
# requests a second on a fixed schedule, an open loop, instead of the next as soon as the last is
# answered). BIN (default target/release/lathe) is the binary measured; LATHE_* variables reach its server
# (e.g. LATHE_INGEST__WORKER_NICE=0). Scratch files go to $WORK (default /tmp/bench-writes).
# `python` needs clients/python/.venv (clients/python/run-tests.sh makes it).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/lathe}; OLD=${OLD:-}; LOAD=target/release/lathe-load
COVID=../shared/eval/covid-a
WORK=${WORK:-/tmp/bench-writes}
out=$WORK/out; mkdir -p $out
serve() { # bin port dir: a fresh data dir
  rm -rf "$3"; mkdir -p "$3"
  start "$@"
}
start() { # bin port dir: the data dir as it is
  "$1" serve --listen 127.0.0.1:$2 --data-dir "$3" --models-dir models --log-format json 2>"$3.log" &
  echo $! > "$3.pid"
  for i in $(seq 1 120); do grep -q "lathe serving" "$3.log" && return 0; sleep 0.5; done
  echo "no serve"; return 1
}
stop() { kill -TERM $(cat "$1.pid"); wait $(cat "$1.pid") 2>/dev/null; }
quiet() { # dir: waits (up to 120 s) until the server has used under 0.1 s of CPU in 2 s, so that
  # merges and seals left by an ingest do not run under the readers of the idle run
  local pid=$(cat "$1.pid") before after
  for i in $(seq 1 60); do
    before=$(awk '{ print $14 + $15 }' /proc/$pid/stat); sleep 2
    after=$(awk '{ print $14 + $15 }' /proc/$pid/stat)
    [ $((after - before)) -lt 10 ] && return 0
  done
}
ingest() { # bin port collection -> seconds
  local t0=$(date +%s.%N)
  "$1" ingest --addr 127.0.0.1:$2 --collection "$3" $COVID/docs.jsonl >/dev/null 2>>$out/ingest-$3.err
  echo "$(date +%s.%N) - $t0" | bc
}
op_megabytes() { # done|total: the MB of `lathe ops` lines ("…, 1.2 KB/47.7 KB, …") on stdin
  python3 -c '
import re, sys
unit = {"B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
which = 1 if sys.argv[1] == "done" else 3
total = 0.0
for line in sys.stdin:
    m = re.search(r"documents, ([\d.]+) (\w+)/([\d.]+) (\w+),", line)
    if m:
        total += float(m.group(which)) * unit[m.group(which + 1)]
print(f"{total:.3f}")' "$1"
}
case "${1:-all}" in
ingest)
  for round in 1 2; do
    if [ -n "$OLD" ]; then serve $OLD 50081 $WORK/old; echo "old ingest $round: $(ingest $OLD 50081 c) s"; stop $WORK/old; fi
    serve $BIN 50082 $WORK/new; echo "new ingest $round: $(ingest $BIN 50082 c) s"; stop $WORK/new
  done;;
python)
  serve $BIN 50083 $WORK/py
  clients/python/.venv/bin/python scripts/bench-upsert.py 127.0.0.1:50083 $COVID/docs.jsonl
  stop $WORK/py;;
isolation)
  serve $BIN 50084 $WORK/iso
  ingest $BIN 50084 base >/dev/null
  t_alone=$(ingest $BIN 50084 alone)
  total=$($BIN ops --addr 127.0.0.1:50084 -c alone --limit 1000 | op_megabytes total)
  quiet $WORK/iso
  $LOAD $COVID --addr 127.0.0.1:50084 --collection base --clients 4 --mode miss --seconds 60 ${READ_ARGS:-} > $out/idle.txt 2>&1
  # A fresh process, so that the second run's requests (the same sequence) meet an empty cache.
  stop $WORK/iso; start $BIN 50084 $WORK/iso
  ( ingest $BIN 50084 during > $out/during-ingest.txt ) &
  ing=$!
  sleep 2
  t_readers=$(date +%s.%N)
  $LOAD $COVID --addr 127.0.0.1:50084 --collection base --clients 4 --mode miss --seconds 60 ${READ_ARGS:-} > $out/during.txt 2>&1
  # The ingest outlasts the readers: what it applied while they ran is its rate "during".
  overlap=$(echo "$(date +%s.%N) - $t_readers + 2" | bc)
  $BIN ops --addr 127.0.0.1:50084 -c during --limit 1000 > $out/during-ops.txt
  applied=$(op_megabytes done < $out/during-ops.txt)
  wait $ing
  # Its rate while the readers ran: what it applied over the time it ran beside them (all of its
  # own time when it ended before they did).
  t_during=$(cat $out/during-ingest.txt)
  echo "ingest alone: $t_alone s for $total MB; ingest during reads: $t_during s in all," \
    "$applied MB applied in the first $overlap s (while the readers ran): $(awk -v a=$applied -v o=$overlap -v d=$t_during -v t=$total -v s=$t_alone 'BEGIN { if (d < o) o = d; printf "%.3f", (a / o) / (t / s) }')x the rate alone"
  echo "--- idle"; cat $out/idle.txt; echo "--- during"; cat $out/during.txt
  stop $WORK/iso;;
esac
