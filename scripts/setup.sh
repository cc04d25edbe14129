#!/usr/bin/env bash
# Creates .venv and installs oncelog with its development tools into it.
# Safe to run again: .venv is rebuilt only when uv.lock changed, and synced
# to the lock (in a second or so) on every run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN="${PYTHON_BIN:-python3}"
if ! "$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "oncelog needs Python 3.11 or newer as '$PYTHON_BIN'" >&2
  exit 1
fi
# Debian splits venv and ensurepip out of the interpreter package; the uv
# tool environment below needs them.
if ! "$PYTHON_BIN" -c 'import venv, ensurepip' 2>/dev/null; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  fi
fi
# Spark (oncelog_spark, the tests in tests/spark) runs on a JVM: Java 17 from
# Debian when there is none.
if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
  if command -v apt-get >/dev/null; then
    echo "== installing Java 17 for Spark"
    # Debian's JRE packages fail to configure on images without man pages.
    mkdir -p /usr/share/man/man1
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "Spark needs Java 17 or newer: install it or set JAVA_HOME" >&2
    exit 1
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

# etcd (Debian's etcd-server) holds a replicated cluster's metadata; the tests
# and LocalCluster(etcd_members=...) start their own members on free ports
# (sdk/oncelog_local/etcd.py). The package would also start (and enable at boot) a
# system etcd on :2379: as for prometheus, a policy-rc.d denying every start
# keeps it from starting now (one that is already there is left alone; ours
# is removed after the install), and the service is disabled at boot.
if ! command -v etcd >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing etcd (Debian's etcd-server package)"
    etcd_policy_created=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d
      etcd_policy_created=1
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      etcd-server >/dev/null
    update-rc.d etcd disable >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
      systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    if [ -n "$etcd_policy_created" ]; then
      rm -f /usr/sbin/policy-rc.d
    fi
  else
    echo "etcd missing: install Debian's etcd-server package (as root)" >&2
  fi
fi

# Python packages: every version comes from uv.lock (pinned, with hashes),
# never from a resolution made today (docs/testing.md, "Dependencies").
. scripts/lib/uv.sh
ensure_uv
# A bound changed in pyproject.toml without a new lock fails here, before
# anything installs.
check_lock

# .venv is exactly the lock: made anew when the lock changed (a .venv made
# from another lock is never reused), and synced on every run, which also
# removes what was installed by hand. --frozen installs what the lock holds
# without resolving anything.
stamp=".venv/.oncelog-lock"
want="$(cat uv.lock requirements/uv.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== installing oncelog and its tools into .venv (uv.lock)"
  rm -rf .venv
fi
"$UV" sync --quiet --frozen --all-extras --python "$PYTHON_BIN"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -c 'import oncelog, oncelog_spark, oncelog_server, rocksdict, grpc, pyarrow'
  echo "$want" > "$stamp"
fi

# The Node.js examples (examples/node: a gRPC client from the protos;
# examples/kafkajs: KafkaJS against the Kafka listener) and their tests need
# node and npm. Their packages are installed here, from the committed
# lockfiles, so the tests themselves need no network; again only when a
# lockfile changed.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "== installing nodejs and npm"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "warning: node and npm are missing (examples/node, examples/kafkajs and their tests need them)" >&2
  fi
fi
if command -v npm >/dev/null; then
  for example in examples/node examples/kafkajs; do
    node_stamp="$example/node_modules/.oncelog-installed"
    node_want="$(sha256sum "$example/package-lock.json" | cut -d' ' -f1)"
    if [ ! -f "$node_stamp" ] || [ "$(cat "$node_stamp")" != "$node_want" ]; then
      echo "== installing $example's packages (npm ci)"
      # No install scripts: the examples have no native code to build.
      (cd "$example" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
      echo "$node_want" > "$node_stamp"
    fi
  done
fi

# kcat (Debian's package): a Kafka command-line client the Kafka-protocol
# tests run against the stores' Kafka listener.
if ! command -v kcat >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing kcat (Debian package)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kcat >/dev/null
  else
    echo "kcat missing: install Debian's kcat package (as root)" >&2
  fi
fi
