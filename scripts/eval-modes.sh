#!/usr/bin/env bash
# Answer recall on a dataset for each neural mode of the server, in one run:
# lexical only, hybrid with (a) per-sentence vectors, hybrid with (b) late chunking, and static
# (wordllama) vectors. Each mode runs its own `lathe serve` (configured through LATHE_* variables)
# and `lathe eval --addr` against it.
#
#   scripts/eval-modes.sh [DATASET] [MAX_QUERIES]    (defaults: ../shared/eval/squad-a 500)
set -euo pipefail
dataset="${1:-../shared/eval/squad-a}"
max_queries="${2:-500}"
lathe="${LATHE_BIN:-target/release/lathe}"
out="${OUT:-eval-out/modes}"
mkdir -p "$out"
./scripts/fetch-models.sh >/dev/null

run_mode() {
  local name="$1" dense="$2" fine="$3" port="$4"
  local data; data="$(mktemp -d)"
  LATHE_MODELS__DENSE="$dense" LATHE_MODELS__FINE_MODE="$fine" \
    "$lathe" serve --listen "127.0.0.1:$port" --data-dir "$data" --log-format json >"$out/$name.server.log" 2>&1 &
  local server=$!
  for _ in $(seq 100); do grep -q '"address"' "$out/$name.server.log" 2>/dev/null && break; sleep 0.2; done
  "$lathe" eval "$dataset" --addr "127.0.0.1:$port" --max-queries "$max_queries" \
    --strategies sentence --max-tokens 64 --out "$out/$name" >"$out/$name.log" 2>&1
  kill "$server"; wait "$server" 2>/dev/null || true
  rm -rf "$data"
  local row
  row="$(grep -E '^\| sentence/64 \|' "$out/$name/results.md" | head -1 | cut -d'|' -f3-6)"
  echo "| $name |$row|"
}

echo "| mode | recall@128 | recall@256 | recall@512 | recall@1024 |"
echo "|---|---:|---:|---:|---:|"
run_mode lexical off late 50561
run_mode hybrid-per-sentence minilm sentence 50562
run_mode hybrid-late-chunking minilm late 50563
run_mode static static late 50564
