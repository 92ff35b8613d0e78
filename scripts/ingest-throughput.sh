#!/usr/bin/env bash
# Ingest throughput of `lathe ingest CORPUS` into a fresh `lathe serve` per models.dense value:
# wall time of the ingest command (its upload ends with `wait`, so all of it is searchable), MB/s
# of the corpus's bytes, and the server's CPU seconds (user + system) during the ingest, which on
# a shared machine say more than the wall time, and the client's (`client_cpu_s=user+system`). With a model that runs ONNX Runtime (minilm) it also
# prints the server's seconds inside the runtime's runs (`lathe_inference_seconds_total`) and
# their share of the wall time; `cargo bench --bench inference -- CORPUS_DIR N` gives the raw
# runtime seconds of the same batches (writes of N documents: INGEST_ARGS="--batch N
# --first-batch-bytes 16777216 --batch-seconds 3600").
#
# Usage: scripts/ingest-throughput.sh LATHE_BINARY CORPUS_DIR [DENSE...]   (default: off static)
set -euo pipefail
binary="$1"; corpus="$2"; shift 2
modes=("$@"); [ ${#modes[@]} -eq 0 ] && modes=(off static)
bytes=$(cat "$corpus"/* | wc -c)
for dense in "${modes[@]}"; do
  data="$(mktemp -d)"
  LATHE_MODELS__DENSE="$dense" LATHE_SERVER__REQUEST_TIMEOUT_MS=3600000 \
    LATHE_SERVER__METRICS_LISTEN=127.0.0.1:0 "$binary" serve \
    --listen 127.0.0.1:0 --models-dir ./models --data-dir "$data/d" --log-format json 2>"$data/log" &
  pid=$!
  until grep -q "lathe serving" "$data/log"; do kill -0 "$pid"; sleep 0.1; done
  address=$(grep "lathe serving" "$data/log" | sed 's/.*"address":"\([^"]*\)".*/\1/')
  metrics=$(grep "metrics serving" "$data/log" | sed 's/.*"address":"\([^"]*\)".*/\1/')
  cpu_ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
  ticks_before=$(cpu_ticks)
  start=$(date +%s.%N)
  /usr/bin/time -f "client_cpu_s=%U+%S" -o "$data/client.time" "$binary" ingest "$corpus" -c t --addr "$address" ${INGEST_ARGS:-} >"$data/ingest.out" 2>&1
  end=$(date +%s.%N)
  cpu=$(echo "scale=2; ($(cpu_ticks) - $ticks_before) / $(getconf CLK_TCK)" | bc)
  rss=$(awk '/^VmRSS/{print $2}' /proc/$pid/status)
  peak=$(awk '/^VmHWM/{print $2}' /proc/$pid/status)
  seconds=$(echo "$end - $start" | bc)
  inference=$(curl -s "http://$metrics/metrics" | awk '$1 == "lathe_inference_seconds_total" {print $2}')
  inference_note=""
  if [ -n "$inference" ] && [ "$(echo "$inference > 0" | bc -l)" = 1 ]; then
    inference_note=" inference_s=$inference inference_share=$(echo "scale=3; $inference / $seconds" | bc -l)"
  fi
  echo "dense=$dense bytes=$bytes seconds=$seconds MB/s=$(echo "scale=3; $bytes / 1000000 / $seconds" | bc) server_cpu_s=$cpu MB/cpu_s=$(echo "scale=3; $bytes / 1000000 / $cpu" | bc) server_rss_after=$((rss/1024))MiB server_rss_peak=$((peak/1024))MiB $(cat "$data/client.time")$inference_note $(tail -1 "$data/ingest.out")"
  kill -TERM "$pid"; wait "$pid" || true
  rm -rf "$data"
done
