#!/usr/bin/env bash
# Creates .venv and installs oncelog with its development tools into it.
# Safe to run again: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN="${PYTHON_BIN:-python3}"
if ! "$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "oncelog needs Python 3.11 or newer as '$PYTHON_BIN'" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON_BIN" -m venv .venv 2>/dev/null; then
    # Debian splits venv out of the interpreter package.
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    "$PYTHON_BIN" -m venv .venv
  fi
fi
# Prometheus and promtool (Debian's package) for the dashboard and alert
# tests, which start their own Prometheus. The package would also start (and
# enable at boot) a system Prometheus on :9090: a policy-rc.d denying every
# start keeps it from starting now (one that is already there is left
# alone), and the service is disabled at boot.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing prometheus (Debian package)"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus >/dev/null
    update-rc.d prometheus disable >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  else
    echo "prometheus/promtool missing: install Debian's prometheus package (as root)" >&2
  fi
fi

stamp=".venv/.oncelog-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== installing oncelog and its tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import oncelog, services, rocksdict, grpc' 
  echo "$want" > "$stamp"
fi
