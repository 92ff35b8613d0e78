#!/usr/bin/env bash
# Make sure `nats-server` (with JetStream) is installed: the replication tests (tests/replication.rs)
# start it on loopback. Debian's package (2.9.10 on bookworm) is what CI uses; returns at once when
# a nats-server is already on the PATH or in /usr/sbin.
#
#   scripts/install-nats-server.sh
set -euo pipefail

found="$(command -v nats-server || true)"
[[ -z "$found" && -x /usr/sbin/nats-server ]] && found=/usr/sbin/nats-server
if [[ -n "$found" ]]; then
  echo "nats-server: $("$found" --version) at $found"
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "nats-server is missing: install Debian's package (sudo apt-get install nats-server), or put a nats-server 2.9+ binary on the PATH" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q nats-server >/dev/null 2>&1 || {
  apt-get update -q >/dev/null
  apt-get install -y -q nats-server >/dev/null
}
echo "nats-server: $(/usr/sbin/nats-server --version) installed"
