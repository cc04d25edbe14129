"""The SDK's own tests, run a second time against its compiled modules.

Goal: the wheel a user gets where a C compiler is present holds the SDK's
hot modules compiled by mypyc (build_support/oncelog_build.py), and compiled
code behaves differently in ways the pure modules cannot show: a native
class has no `__dict__` and cannot be patched, an attribute's declared type
is enforced when it is read, a list index too large for a C integer raises
OverflowError rather than IndexError. Every test of the SDK's producer path
and record codec must pass on both builds, in the default run.

Method: scripts/compiled-venv.sh keeps `.venv-compiled`, the locked packages
with oncelog installed from the compiled wheel, built from the current
sources (a stamp of their hash; a stale one fails here, naming the command
that rebuilds it). The files of SELECTION run there, in a pytest per
group, from this repository's root, so its `tests.*` and `services.*` imports come
from the tree while every `oncelog` import is the installed compiled package
(and LocalCluster's processes run its `oncelog_server`). The run first
checks that what it imports really is compiled.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv-compiled" / "bin" / "python"
# The tests of what is compiled (the record codec, the accumulator and its
# futures, the partitioner, sequencing, request streams, the producer and
# its transactions) and of the clients built on them, in three pytest runs
# (a run's start costs a few seconds): about 1 3/4 minutes of one worker here.
SELECTION = {
    "codec": (
        "tests/unit/test_records.py",
        "tests/unit/test_records_fast_path.py",
        "tests/unit/test_records_kafka_clients.py",
        "tests/unit/test_compression.py",
        "tests/unit/test_wire_kernel.py",
    ),
    "producer": (
        "tests/unit/test_accumulator.py",
        "tests/unit/test_partitioner.py",
        "tests/unit/test_sequencing.py",
        "tests/unit/test_request_streams.py",
        "tests/unit/test_sdk_stream_endings.py",
        "tests/unit/test_producer_send_many.py",
        "tests/unit/test_producer_sender.py",
        "tests/unit/test_producer_transactions.py",
        "tests/unit/test_producer_error_classes.py",
        "tests/unit/test_producer_ids.py",
        "tests/unit/test_txn_client_states.py",
        # Kafka's option names: kafka_names() wraps the compiled Producer's
        # __init__, whose keywords it reads from the shipped .py file.
        "tests/unit/test_keywords.py",
        # The options table against the compiled Producer's signature.
        "tests/unit/test_config_def.py",
        "tests/unit/test_consumer_fetch.py",
    ),
    "clients": (
        "tests/integration/test_client_contract.py",
        "tests/integration/test_produce_stream.py",
        "tests/integration/test_end_txn_stream.py",
        "tests/integration/test_aio_client.py",
        "tests/integration/test_lost_ack.py",
        # The consumer's columns come from the compiled record codec.
        "tests/integration/test_consumer_columns.py",
    ),
}
# The client contract runs against the coordinators' two placements; what
# is compiled is client code, the same under both, so here one is enough.
GROUP_OPTIONS = {"clients": ("-k", "not in-store")}

# Every module build_support/oncelog_build.py compiles.
COMPILED = ("oncelog.wire.records", "oncelog._batching", "oncelog._partitioner",
            "oncelog._request_streams", "oncelog._sender", "oncelog._sequencing",
            "oncelog.producer")
# Failure guards for the subprocesses, not expectations.
CHECK_TIMEOUT_S = 120.0
GROUP_TIMEOUT_S = 900.0


def _env() -> dict[str, str]:
    """This run's environment without its virtual environment."""
    return {key: value for key, value in os.environ.items()
            if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def compiled_python() -> Path:
    check = subprocess.run(["bash", "scripts/compiled-venv.sh", "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                           check=False)
    if check.returncode != 0:
        pytest.fail(f"{check.stdout}{check.stderr}")
    files = subprocess.run(
        [str(VENV_PYTHON), "-c",
         f"import importlib; print('\\n'.join(importlib.import_module(m).__file__ "
         f"for m in {COMPILED!r}))"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
        check=True).stdout.split()
    assert len(files) == len(COMPILED)
    for module, path in zip(COMPILED, files, strict=True):
        assert path.endswith(".so"), f"{module} is not compiled: {path}"
        assert Path(path).is_relative_to(REPO / ".venv-compiled"), path
    return VENV_PYTHON


def test_the_selection_names_existing_files() -> None:
    files = [f for group in SELECTION.values() for f in group]
    assert [f for f in files if not (REPO / f).is_file()] == []
    assert len(set(files)) == len(files)


@pytest.mark.timeout(GROUP_TIMEOUT_S + 60)
@pytest.mark.parametrize("group", sorted(SELECTION))
def test_passes_on_the_compiled_modules(compiled_python: Path, group: str) -> None:
    result = subprocess.run(
        [str(compiled_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow", *SELECTION[group], *GROUP_OPTIONS.get(group, ())],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=GROUP_TIMEOUT_S,
        check=False)
    if result.returncode != 0:
        pytest.fail(f"the {group} tests fail on the compiled modules:\n"
                    f"{result.stdout[-20_000:]}\n{result.stderr[-5_000:]}")
