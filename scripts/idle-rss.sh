#!/usr/bin/env bash
# Resident memory of an idle `lathe serve` on a fresh data dir: VmRSS (and RssAnon/RssFile) 5 s
# after it logs "lathe serving", for each models.dense value given, ROUNDS times alternating.
#
# Usage: scripts/idle-rss.sh [LATHE_BINARY] [DENSE...]   (default target/release/lathe minilm static off)
# Extra LATHE_* variables in the environment reach the server (e.g. LATHE_MODELS__INFERENCE_THREADS).
set -euo pipefail
binary="${1:-target/release/lathe}"
shift || true
modes=("${@:-minilm static off}")
[ $# -eq 0 ] && modes=(minilm static off)
rounds="${ROUNDS:-3}"
for round in $(seq 1 "$rounds"); do
  for dense in "${modes[@]}"; do
    data="$(mktemp -d)"
    log="$data/log"
    LATHE_MODELS__DENSE="$dense" "$binary" serve --listen 127.0.0.1:0 --models-dir ./models \
      --data-dir "$data/d" --log-format json 2>"$log" &
    pid=$!
    until grep -q "lathe serving" "$log"; do
      kill -0 "$pid" 2>/dev/null || { echo "lathe exited:"; cat "$log"; exit 1; }
      sleep 0.1
    done
    sleep 5
    rss=$(awk '/^VmRSS/{print $2}' /proc/$pid/status)
    anon=$(awk '/^RssAnon/{print $2}' /proc/$pid/status)
    file=$(awk '/^RssFile/{print $2}' /proc/$pid/status)
    threads=$(awk '/^Threads/{print $2}' /proc/$pid/status)
    echo "round $round dense=$dense VmRSS=$((rss/1024)) MiB RssAnon=$((anon/1024)) MiB RssFile=$((file/1024)) MiB threads=$threads"
    kill -TERM "$pid"; wait "$pid" || true
    rm -rf "$data"
  done
done
