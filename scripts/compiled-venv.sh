#!/usr/bin/env bash
# Makes .venv-compiled: the packages of uv.lock, as in .venv, with oncelog
# installed from the compiled wheel (the SDK's hot modules built by mypyc;
# build_support/oncelog_build.py) instead of the source tree. The default
# test run runs the SDK's own tests there too
# (tests/integration/test_compiled_sdk.py), so both flavours are tested.
#
# Rebuilt only when the lock or anything the wheel is built from changed
# (the stamp .venv-compiled/.oncelog-build holds their hash), so it is a
# no-op on an unchanged tree and the compiled modules never run older code
# than the .py files. Called by scripts/setup.sh.
#
#   bash scripts/compiled-venv.sh           # build it if it is stale
#   bash scripts/compiled-venv.sh --check   # exit 1 if it is stale (the tests ask)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/uv.sh
ensure_uv

venv=".venv-compiled"
stamp="$venv/.oncelog-build"
# What the wheel is built from (tests/integration/test_packaging.py builds
# from the same list) and what the environment is installed from.
inputs=(pyproject.toml setup.py MANIFEST.in README.md LICENSE build_support sdk spark services)

fingerprint() {
  {
    cat uv.lock requirements/uv.txt
    find "${inputs[@]}" -type f \( -name '*.py' -o -name '*.pyi' -o -name 'py.typed' \
         -o -name '*.toml' -o -name '*.in' -o -name '*.md' -o -name LICENSE \) \
         -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

want="$(fingerprint)"
fresh() { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if [ "${1:-}" = "--check" ]; then
  if fresh; then exit 0; fi
  echo "$venv is missing or older than the sources: run bash scripts/compiled-venv.sh" \
       "(or scripts/setup.sh)" >&2
  exit 1
fi
# One build at a time.
exec 9>".venv-compiled.lock"
flock 9
if fresh; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  echo ".venv is missing: run bash scripts/setup.sh first" >&2
  exit 1
fi
echo "== building the compiled wheel into $venv (mypyc; about a minute)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Built from a copy: the build never writes into the source tree.
mkdir "$work/src"
for name in "${inputs[@]}"; do
  cp -r "$name" "$work/src/"
done
find "$work/src" \( -name '__pycache__' -o -name '*.egg-info' \) -prune -exec rm -rf {} +
# ONCELOG_COMPILE=1: a missing compiler fails here instead of quietly
# testing the pure modules twice. .venv's locked mypy compiles.
ONCELOG_COMPILE=1 "$UV" build --quiet --wheel --no-build-isolation --python .venv/bin/python \
  --out-dir "$work/dist" "$work/src"
wheel="$(ls "$work"/dist/oncelog-*.whl)"

rm -rf "$venv"
# Every package of the lock but the project itself, then the wheel alone.
UV_PROJECT_ENVIRONMENT="$venv" "$UV" sync --quiet --frozen --all-extras --no-install-project \
  --python "$PYTHON_BIN"
"$UV" pip install --quiet --python "$venv/bin/python" --no-deps "$wheel"
# Kept for tests/integration/test_packaging.py, which installs it afresh.
mkdir -p "$venv/dist"
cp "$wheel" "$venv/dist/"
"$venv/bin/python" - <<'EOF'
import oncelog.producer, oncelog.wire.records
for module in (oncelog.producer, oncelog.wire.records):
    assert module.__file__.endswith(".so"), f"{module.__name__} is not compiled: {module.__file__}"
EOF
echo "$want" > "$stamp"
