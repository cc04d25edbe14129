"""Shared fixtures, and which tests run alone.

`cluster` starts a fresh LocalCluster (one partition store, one coordinator)
per test in a temporary directory; `shared_cluster` is one per test module for
tests that only add topics of their own. Processes die with the test run.

scripts/test.sh runs the default suite on two workers (pytest-xdist), a test
file per worker, except the tests marked `serial`, which it runs afterwards
on their own: those of SERIAL_FILES, which kill, pause and restart services
against leases and deadlines, and whose waits were sized for a machine that
is not also running a second test file.

A test that fails while it holds a LocalCluster (as any fixture) gets the
last lines of each of the cluster's service logs in its report: the logs
live in the test's temporary directory, which a CI run does not keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster

_topic_counter = itertools.count()

SERIAL_FILES = frozenset({
    "tests/integration/test_copier.py",
    "tests/integration/test_disk_faults.py",
    "tests/integration/test_network_partitions.py",
    "tests/integration/test_replication.py",
    "tests/integration/test_replication_etcd_faults.py",
    "tests/integration/test_rolling_restart.py",
    "tests/integration/test_etcd_cluster.py",
    "tests/integration/test_monitoring_prometheus.py",
    "tests/spark/test_payments_pipeline.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        if item.path.relative_to(root).as_posix() in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)


# Lines of each service's log in a failed test's report.
FAILURE_LOG_LINES = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, LocalCluster):
                report.sections.append(("the cluster's service logs", _log_tails(value)))
    return report


def _log_tails(cluster: LocalCluster) -> str:
    parts = []
    for kind, procs in cluster.processes.items():
        for proc in procs:
            path = proc.log_path
            lines = (path.read_text(errors="replace").splitlines()[-FAILURE_LOG_LINES:]
                     if path.exists() else ["(no log)"])
            parts.append(f"== {kind} {proc.node_id}: {path}\n" + "\n".join(lines))
    return "\n".join(parts)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("shared") / "cluster") as c:
        yield c


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique within the test run."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:80]
    return f"t{next(_topic_counter)}-{base}"
