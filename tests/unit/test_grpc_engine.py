"""The services run on gRPC's classic TCP client and listener
(services/common/kernel/grpc_engine.py): chosen by each service's entry
point before grpc is imported, since gRPC reads the choice then, and never
over GRPC_EXPERIMENTS already set. The SDK keeps gRPC's default."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from services.common.kernel.grpc_engine import (
    CLASSIC_TCP_EXPERIMENTS,
    GRPC_EXPERIMENTS_ENV,
    use_classic_tcp,
)


def test_chooses_the_classic_tcp_when_nothing_is_set() -> None:
    environ: dict[str, str] = {}
    assert use_classic_tcp(environ, modules={})
    assert environ == {GRPC_EXPERIMENTS_ENV: CLASSIC_TCP_EXPERIMENTS}


@pytest.mark.parametrize("operators", ["", "-event_engine_client"])
def test_keeps_what_an_operator_set(operators: str) -> None:
    # The empty string is gRPC's own default: kept too.
    environ = {GRPC_EXPERIMENTS_ENV: operators}
    assert not use_classic_tcp(environ, modules={"grpc": object()})
    assert environ == {GRPC_EXPERIMENTS_ENV: operators}


def test_leaves_a_process_that_imported_grpc_first_alone() -> None:
    # Too late to apply: gRPC has read its settings.
    environ: dict[str, str] = {}
    assert not use_classic_tcp(environ, modules={"grpc": object()})
    assert environ == {}


# Runs `what` (Python) in a fresh interpreter and prints what
# GRPC_EXPERIMENTS held when grpc was first imported.
_FIRST_GRPC_IMPORT_PROBE = textwrap.dedent("""
    import importlib.abc, os, sys
    seen = []
    class FirstGrpcImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "grpc" and not seen:
                seen.append(os.environ.get("GRPC_EXPERIMENTS", "<unset>"))
            return None
    sys.meta_path.insert(0, FirstGrpcImport())
    try:
        exec(sys.argv[1])
    except SystemExit:
        pass
    sys.stderr.write("GRPC_EXPERIMENTS at import: " + (seen[0] if seen else "<no import>") + "\\n")
""")


def _at_first_grpc_import(what: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    done = subprocess.run([sys.executable, "-c", _FIRST_GRPC_IMPORT_PROBE, what], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    return done.stderr


@pytest.mark.parametrize("service", ["partition_store", "coordinator", "group_coordinator"])
def test_each_service_chooses_before_grpc_is_imported(service: str) -> None:
    # Its entry point, as `python -m oncelog_server.<service> --help` runs it.
    stderr = _at_first_grpc_import(
        "import runpy; sys.argv = ['x', '--help']; "
        f"runpy.run_module('oncelog_server.{service}', run_name='__main__', alter_sys=True)")
    assert f"GRPC_EXPERIMENTS at import: {CLASSIC_TCP_EXPERIMENTS}\n" in stderr, stderr


def test_the_sdk_leaves_grpc_on_its_default() -> None:
    # The sync client on the classic TCP failed against TLS listeners.
    stderr = _at_first_grpc_import("from oncelog import Producer")
    assert "GRPC_EXPERIMENTS at import: <unset>\n" in stderr, stderr
