#!/usr/bin/env bash
# What a full replay of a collection's dense index costs at open: the collection's dense/ folder
# is moved aside (as after a lost manifest, or the first open of an index of an older format),
# so the server inserts every stored section vector again before it serves. Prints the seconds
# to "lathe serving" and the server's peak and current RSS then; kills it (kill -9, so no merge
# starts) and puts the dense/ folder back, so the data dir is as it was.
#
#   scripts/replay-rss.sh LATHE_BINARY DATA_DIR [COLLECTION]   (default collection: bench,
#                                                               lathe-bench's)
# Run from the repository root (./models). The data dir of a lathe-bench size is
# WORK_DIR/size-N (`lathe-bench --keep`).
set -euo pipefail
binary="$1"; data="$2"; collection="${3:-bench}"
folder="$data/collections/$collection"
[ -d "$folder/dense" ] || { echo "no dense index in $folder" >&2; exit 1; }
[ ! -e "$folder/dense.aside" ] || { echo "$folder/dense.aside exists: a run was interrupted" >&2; exit 1; }
mv "$folder/dense" "$folder/dense.aside"
log="$(mktemp)"
restore() {
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$folder/dense"
  mv "$folder/dense.aside" "$folder/dense"
  rm -f "$log"
}
start=$(date +%s.%N)
LATHE_MODELS__DENSE="${LATHE_MODELS__DENSE:-static}" "$binary" serve --listen 127.0.0.1:0 \
  --models-dir ./models --data-dir "$data" >"$log" 2>&1 &
pid=$!
trap restore EXIT
until grep -q "lathe serving" "$log"; do kill -0 "$pid"; sleep 0.2; done
end=$(date +%s.%N)
peak=$(awk '/^VmHWM/{print $2}' /proc/$pid/status)
rss=$(awk '/^VmRSS/{print $2}' /proc/$pid/status)
echo "serving_s=$(echo "$end - $start" | bc) peak_rss=$((peak / 1024))MiB rss=$((rss / 1024))MiB"
