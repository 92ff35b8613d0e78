#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 600), one after another, and
# prints one line per target: executions, executions per second, corpus size, peak RSS, result.
#
#   ./scripts/fuzz-all.sh [SECONDS] [TARGET ...]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly compiler; a stable toolchain works
# with RUSTC_BOOTSTRAP=1, which this script sets. Builds are optimised with debug assertions on
# (integer overflow and `debug_assert!` panic) and no sanitizer: the code under test is safe Rust,
# so throughput buys more than AddressSanitizer would. Seeds come from fuzz/seeds/<target>; the
# grown corpus goes to fuzz/corpus/<target> and crashes to fuzz/artifacts/<target> (both ignored).
set -euo pipefail

seconds=${1:-600}
shift || true
cd "$(dirname "$0")/../fuzz"
export RUSTC_BOOTSTRAP=1
flags=(-O -s none -a)

cargo fuzz build "${flags[@]}" >&2
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi
# Run copies of the binaries built now, so that edits to the sources during a long run neither
# trigger rebuilds nor change what is being fuzzed.
frozen=target/frozen
mkdir -p "$frozen"
for target in "${targets[@]}"; do
    cp "target/$(rustc -vV | sed -n 's/^host: //p')/release/$target" "$frozen/$target"
done

mkdir -p runs
status=0
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "seeds/$target" "artifacts/$target"
    log="runs/$target.log"
    if "$frozen/$target" "corpus/$target" "seeds/$target" -artifact_prefix="artifacts/$target/" \
        -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=4096 -timeout=30 \
        -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result="FAILED (see fuzz/$log and fuzz/artifacts/$target)"
        status=1
    fi
    executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    per_second=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    corpus=$(find "corpus/$target" -type f | wc -l)
    printf '%-22s %5ss %12s execs %7s/s corpus %6s peak %5s MB  %s\n' \
        "$target" "$seconds" "$executions" "$per_second" "$corpus" "$rss" "$result"
done
exit "$status"
