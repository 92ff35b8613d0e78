#!/usr/bin/env bash
# The Python client's tests against a real `lathe serve` (the debug binary built by cargo test).
set -euo pipefail
LATHE_BIN="$PWD/target/debug/lathe" bash clients/python/run-tests.sh
