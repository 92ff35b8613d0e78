#!/usr/bin/env bash
# Run deploy/Dockerfile's build steps without a Docker engine, so CI can check they do not rot:
#
#   deploy/docker-build-steps.sh [OUT_DIR]          (default: deploy/out)
#
#   1. the build context (Dockerfile.dockerignore) holds every COPY source and every target that
#      Cargo.toml declares;
#   2. the release build (`cargo build --release --locked --bin lathe`, as the build stage);
#   3. the models stage: scripts/fetch-models.sh into OUT_DIR/models-stage (seeded from ./models
#      when present, so nothing is downloaded when the repo's models are already verified);
#   4. the runtime tree OUT_DIR/rootfs laid out like the image (/usr/local/bin/lathe,
#      /opt/lathe/models, /etc/lathe/lathe.toml, /var/lib/lathe), whose binary may need only
#      shared libraries that debian:bookworm-slim has;
#   5. a smoke run of that tree: `lathe serve --config rootfs/etc/lathe/lathe.toml` (paths
#      redirected into the tree) must load the config and models, report serving, and exit 0 on
#      SIGTERM.
#
# Re-running is cheap: cargo and fetch-models.sh skip what is done, the tree is refreshed in place.
#   CARGO_TARGET_DIR   cargo's target folder (default: <repo>/target)
#   BUILD_PROFILE      release (default, as the image) or debug (quicker rot check in CI)
#   SKIP_BUILD=1       use the binary already in the target folder
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/deploy/out}" && cd "${1:-$repo/deploy/out}" && pwd)"
profile="${BUILD_PROFILE:-release}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
dockerfile="$repo/deploy/Dockerfile"
step() { printf '== %s\n' "$*"; }

step "1/5 Dockerfile build context"
# COPY lines without --from copy from the build context (the repository root).
# Dockerfile.dockerignore excludes everything, then re-includes the build context with `!` lines.
context="$(sed -n 's|^!\(.*[^/]\)/\{0,1\}$|\1|p' "$repo/deploy/Dockerfile.dockerignore")"
missing=0
while read -r source; do
  [[ "$source" == "." ]] && continue
  if [[ ! -e "$repo/$source" ]]; then
    echo "missing COPY source: $source" >&2
    missing=1
  fi
  if ! grep -qxF "${source%/}" <<<"$context"; then
    echo "COPY source $source is not re-included in deploy/Dockerfile.dockerignore" >&2
    missing=1
  fi
done < <(awk '$1 == "COPY" && $2 !~ /^--from=/ { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "$dockerfile")
[[ $missing -eq 0 ]]
# The build stage gets only that context: every target Cargo.toml declares (benches, tests,
# examples, workspace members) must be inside it, or cargo refuses the manifest.
python3 - "$repo/Cargo.toml" "$context" <<'PY'
import sys, tomllib
manifest = tomllib.load(open(sys.argv[1], "rb"))
context = {entry.split("/")[0] for entry in sys.argv[2].split()}
paths = [target.get("path") or f"{folder}/{target.get('name', '')}.rs"
         for kind, folder in (("bench", "benches"), ("test", "tests"), ("example", "examples"))
         for target in manifest.get(kind, [])]
paths += [manifest.get("lib", {}).get("path", "src/lib.rs"), "build.rs", "Cargo.lock"]
paths += [target.get("path", "src/main.rs") for target in manifest.get("bin", [])]
paths += manifest.get("workspace", {}).get("members", [])
outside = [path for path in paths if path.split("/")[0] not in context]
if outside:
    sys.exit(f"Cargo.toml needs {outside}, outside the build context of deploy/Dockerfile.dockerignore")
PY

step "2/5 cargo build ($profile)"
if [[ "${SKIP_BUILD:-0}" != "1" ]]; then
  profile_flag=()
  [[ "$profile" == "release" ]] && profile_flag=(--release)
  (cd "$repo" && CARGO_TARGET_DIR="$target_dir" cargo build "${profile_flag[@]}" --locked --bin lathe)
fi
binary="$target_dir/$profile/lathe"
[[ -x "$binary" ]] || { echo "no binary at $binary" >&2; exit 1; }

step "3/5 models stage"
models_stage="$out/models-stage"
if [[ ! -d "$models_stage" && -d "$repo/models" ]]; then
  # Seed from the repo's models; fetch-models.sh re-verifies every sha256 and fetches the rest.
  mkdir -p "$models_stage"
  cp -a "$repo/models/." "$models_stage/"
fi
bash "$repo/scripts/fetch-models.sh" "$models_stage"

step "4/5 runtime tree"
rootfs="$out/rootfs"
install -d "$rootfs/usr/local/bin" "$rootfs/opt/lathe" "$rootfs/etc/lathe" "$rootfs/var/lib/lathe"
install -m 0755 "$binary" "$rootfs/usr/local/bin/lathe"
rm -rf "$rootfs/opt/lathe/models"
cp -a "$models_stage" "$rootfs/opt/lathe/models"
install -m 0644 "$repo/deploy/container/lathe.toml" "$rootfs/etc/lathe/lathe.toml"
# Shared libraries of debian:bookworm-slim (libc6, libgcc-s1, libstdc++6 are in the base image).
allowed='^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libstdc\+\+\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2)$'
for binary_file in "$rootfs/usr/local/bin/lathe" "$rootfs/opt/lathe/models/onnxruntime/libonnxruntime.so"; do
  while read -r library; do
    if [[ ! "$library" =~ $allowed ]]; then
      echo "$(basename "$binary_file") needs $library, which debian:bookworm-slim lacks: add it to the runtime stage" >&2
      exit 1
    fi
  done < <(readelf -d "$binary_file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
du -sh "$rootfs" | sed 's/^/rootfs: /'

step "5/5 smoke run"
smoke="$(mktemp -d)"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  rm -rf "$smoke"
}
trap cleanup EXIT
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# The server reads every LATHE_* variable as a config key: run it with none.
lathe_variables=()
while read -r name; do lathe_variables+=(-u "$name"); done < <(env | sed -n 's/^\(LATHE_[^=]*\)=.*/\1/p')
env "${lathe_variables[@]}" "$rootfs/usr/local/bin/lathe" serve --config "$rootfs/etc/lathe/lathe.toml" \
  --listen "127.0.0.1:$port" --data-dir "$smoke/data" --models-dir "$rootfs/opt/lathe/models" \
  >"$smoke/log" 2>&1 &
server_pid=$!
for _ in $(seq 1 600); do
  grep -q 'lathe serving' "$smoke/log" && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q 'lathe serving' "$smoke/log"; then
  cat "$smoke/log" >&2
  echo "smoke run: the server did not report serving" >&2
  exit 1
fi
grep -q '"level":"INFO"' "$smoke/log" || { cat "$smoke/log" >&2; echo "smoke run: expected JSON logs (log.format = json)" >&2; exit 1; }
kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
if [[ $status -ne 0 ]]; then
  cat "$smoke/log" >&2
  echo "smoke run: exit status $status after SIGTERM" >&2
  exit 1
fi
echo "docker build steps: ok ($rootfs)"
