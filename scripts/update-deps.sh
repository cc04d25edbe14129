#!/usr/bin/env bash
# Refreshes the lock (uv.lock) that scripts/setup.sh installs from.
#
#   bash scripts/update-deps.sh                 # re-lock after editing pyproject.toml; keeps every
#                                               #   locked version that still fits
#   bash scripts/update-deps.sh --upgrade       # every package to the newest version pyproject.toml allows
#   bash scripts/update-deps.sh --upgrade-package grpcio [--upgrade-package ...]
#   bash scripts/update-deps.sh --uv 0.14.0     # move uv itself (requirements/uv.txt) to another release
#
# Then run `bash scripts/test.sh` (it rebuilds .venv from the new lock) and
# commit uv.lock (and requirements/uv.txt) with pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

lock_args=()
uv_version=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --upgrade) lock_args+=(--upgrade); shift ;;
    --upgrade-package) lock_args+=(--upgrade-package "$2"); shift 2 ;;
    --uv) uv_version="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see: bash $0 --help)" >&2; exit 2 ;;
  esac
done

# The uv that scripts/setup.sh installs (.uv-tool), without touching .venv.
. scripts/lib/uv.sh
ensure_uv

if [ -n "$uv_version" ]; then
  header="$(grep '^#' requirements/uv.txt)"
  pinned="$(echo "uv==$uv_version" | "$UV" pip compile --quiet --generate-hashes --no-header \
            --universal --no-annotate - )"
  printf '%s\n%s\n' "$header" "$pinned" > requirements/uv.txt
  echo "requirements/uv.txt: uv $uv_version"
  ensure_uv
fi

"$UV" lock --python "$PYTHON_BIN" "${lock_args[@]+"${lock_args[@]}"}"
echo "uv.lock refreshed; now run: bash scripts/test.sh"
