#!/usr/bin/env bash
# Make sure `promtool` is installed: deploy/validate.sh runs `promtool check rules` on the chart's
# rendered alert rules. Debian ships it in the `prometheus` package (2.42 on bookworm; the server
# comes with it, and is not started where no init system runs, as in CI). Returns at once when a
# promtool is already on the PATH.
#
#   scripts/install-promtool.sh
set -euo pipefail

if command -v promtool >/dev/null; then
  echo "promtool: $(promtool --version 2>&1 | head -1) at $(command -v promtool)"
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "promtool is missing: install Debian's package (sudo apt-get install --no-install-recommends prometheus), or put a promtool 2.x binary on the PATH" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# --no-install-recommends: not the node exporter it recommends.
apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends prometheus >/dev/null
}
echo "promtool: $(promtool --version 2>&1 | head -1) installed"
