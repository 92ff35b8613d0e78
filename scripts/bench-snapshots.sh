#!/usr/bin/env bash
# Snapshot cost (BENCHMARKS.md, "Snapshots"), on release binaries:
#
#   scripts/bench-snapshots.sh covid            covid-a ingested (default model, MiniLM) into a
#                                               fresh server, then measured
#   DATA=DIR COLLECTION=C scripts/bench-snapshots.sh scale
#                                               an existing data dir, e.g. one `lathe-bench
#                                               --sizes 100000 --keep --work-dir W` left (static
#                                               vectors: LATHE_MODELS__DENSE=static)
#
# Measured: 4 lathe-load readers of cache misses for 30 s idle, then 30 s (a fresh process, so the
# same request sequence misses the cache again) while `lathe snapshot create C --keep 1` runs
# back to back; each snapshot's time and size; then a download and a restore of the last one
# (uploaded, into a new collection) on the idle server.
# BIN (default target/release/lathe) is measured; LATHE_* variables reach its server. Scratch:
# $WORK (default /tmp/bench-snapshots).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/lathe}; LOAD=target/release/lathe-load
COVID=../shared/eval/covid-a
WORK=${WORK:-/tmp/bench-snapshots}
PORT=50091; ADDR=127.0.0.1:$PORT
out=$WORK/out; mkdir -p $out
start() { # data dir
  "$BIN" serve --listen $ADDR --data-dir "$1" --models-dir models --log-format json 2>"$WORK/server.log" &
  echo $! > "$WORK/server.pid"
  for i in $(seq 1 600); do grep -q "lathe serving" "$WORK/server.log" && return 0; sleep 0.5; done
  echo "no serve"; return 1
}
stop() { kill -TERM $(cat "$WORK/server.pid"); wait $(cat "$WORK/server.pid") 2>/dev/null; }
now() { date +%s.%N; }
measure() { # data dir, collection
  local data=$1 c=$2
  $LOAD $COVID --addr $ADDR --collection $c --clients 4 --mode miss --seconds 30 > $out/idle.txt 2>&1
  stop; start "$data"
  : > $out/snapshots.txt
  ( end=$(echo "$(now) + 31" | bc)
    while [ "$(echo "$(now) < $end" | bc)" = 1 ]; do
      t0=$(now); "$BIN" snapshot --addr $ADDR create $c --keep 1 >> $out/snapshot-lines.txt
      echo "$(now) - $t0" | bc >> $out/snapshots.txt
    done ) &
  local snaps=$!
  $LOAD $COVID --addr $ADDR --collection $c --clients 4 --mode miss --seconds 30 > $out/during.txt 2>&1
  wait $snaps
  local listed; listed=$("$BIN" snapshot --addr $ADDR list $c | head -1)
  local name=${listed%% *}; name=${name#*/}
  t0=$(now); "$BIN" snapshot --addr $ADDR download $c "$name" --out $WORK/last.snapshot > /dev/null
  local t_download; t_download=$(echo "$(now) - $t0" | bc)
  t0=$(now); "$BIN" restore --addr $ADDR --collection $c-restored $WORK/last.snapshot
  local t_restore; t_restore=$(echo "$(now) - $t0" | bc)
  echo "snapshot: $listed"
  echo "snapshots taken during the readers (CLI process included): $(sort -n $out/snapshots.txt |
    awk '{ t[NR] = $1 } END { printf "%d, seconds each: median %.3f, p90 %.3f, max %.3f", NR, t[int((NR + 1) / 2)], t[int(NR * 0.9 + 0.5)], t[NR] }')"
  echo "download: $t_download s; restore (upload, check, open): $t_restore s"
  echo "--- readers idle"; tail -1 $out/idle.txt; echo "--- readers during snapshots"; tail -1 $out/during.txt
  "$BIN" snapshot --addr $ADDR delete $c "$name"
  rm -f $WORK/last.snapshot
}
case "${1:-covid}" in
covid)
  rm -rf $WORK/covid; mkdir -p $WORK/covid
  start $WORK/covid
  t0=$(now); "$BIN" ingest --addr $ADDR --collection covid $COVID/docs.jsonl > /dev/null
  echo "ingest: $(echo "$(now) - $t0" | bc) s"
  measure $WORK/covid covid
  stop;;
scale)
  start "$DATA"
  measure "$DATA" "$COLLECTION"
  stop
  # The restored copy goes (the server is stopped: nothing else holds the folder).
  rm -rf "$DATA/collections/$COLLECTION-restored";;
esac
