#!/usr/bin/env bash
# Regenerates the Python code for protos/ into sdk/oncelog/v1/ (package
# oncelog.v1), with typed stubs. The tool versions are pinned in pyproject.toml
# (dev extra); tests/unit/test_protos_fresh.py fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
out="${1:-sdk}"
rm -f "$out"/oncelog/v1/*_pb2*.py "$out"/oncelog/v1/*_pb2*.pyi
mkdir -p "$out/oncelog/v1"
PATH="$(dirname "$PY"):$PATH" "$PY" -m grpc_tools.protoc -I protos \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out="$out" --mypy_grpc_out="$out" \
  protos/oncelog/v1/*.proto
touch "$out/oncelog/v1/__init__.py"
