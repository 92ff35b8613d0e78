#!/usr/bin/env bash
# Test the Python client against a real `lathe serve`.
#
#   clients/python/run-tests.sh [PYTEST_ARGS...]
#
# Creates (once) a venv with the pinned packages of requirements-test.txt, installs lathe_client,
# checks the committed stubs against proto/ (generate.sh --check), makes sure the models are
# there (scripts/fetch-models.sh, a no-op when they are), and runs pytest.
#
#   CLIENT_VENV     venv folder (default: clients/python/.venv; reused while the pins are unchanged)
#   LATHE_BIN         server binary (default: target/release/lathe, else target/debug/lathe)
#   LATHE_MODELS_DIR  models folder (default: <repo>/models)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${CLIENT_VENV:-$here/.venv}"
python="$venv/bin/python"

# Reinstall only when the pins or the package metadata change.
stamp="$venv/.lathe-client-installed"
wanted="$(cat "$here/requirements-test.txt" "$here/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$python" ]]; then
  python3 -m venv "$venv"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]]; then
  "$python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements-test.txt"
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$here"
  echo "$wanted" >"$stamp"
fi

PYTHON="$python" "$here/generate.sh" --check

export LATHE_MODELS_DIR="${LATHE_MODELS_DIR:-$repo/models}"
PYTHON="$python" "$repo/scripts/fetch-models.sh" "$LATHE_MODELS_DIR"

cd "$here"
exec "$python" -m pytest -q -rs "$@"
