#!/usr/bin/env bash
# Reproduces the benchmark corpus: the first 100 Linux kernel .rst documents and the first 100
# Python 3.11 .rst.txt sources (each sorted by path, C locale) from Debian bookworm's
# linux-doc-6.1 and python3.11-doc packages, written as plain files into one folder.
#
# Usage: scripts/fetch-debian-docs.sh [OUT_DIR]   (default /tmp/lathe-debian-docs)
# Then:  LATHE_DEBIAN_DOCS=OUT_DIR cargo bench --bench chunking
set -euo pipefail
export LC_ALL=C
out_dir="${1:-/tmp/lathe-debian-docs}"
per_package="${PER_PACKAGE:-100}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
apt-get update -qq
apt-get download linux-doc-6.1 python3.11-doc
for deb in ./*.deb; do dpkg-deb -x "$deb" extracted; done

mkdir -p "$out_dir"
rm -f "$out_dir"/*.txt
index=0
while IFS= read -r path; do
  index=$((index + 1))
  gzip -dc "$path" > "$out_dir/$(printf 'linux-%03d' "$index").txt"
done < <(find extracted/usr/share/doc/linux-doc-6.1/Documentation -name '*.rst.gz' | sort | head -n "$per_package")
index=0
while IFS= read -r path; do
  index=$((index + 1))
  cp "$path" "$out_dir/$(printf 'python-%03d' "$index").txt"
done < <(find extracted/usr/share/doc/python3.11/html/_sources -name '*.rst.txt' | sort | head -n "$per_package")
echo "wrote $(ls "$out_dir" | wc -l) documents ($(cat "$out_dir"/*.txt | wc -c) bytes) to $out_dir"
