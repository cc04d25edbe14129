"""Shared fixtures.

`cluster` starts a fresh LocalCluster (one partition store, one coordinator)
per test in a temporary directory; `shared_cluster` is one per test module for
tests that only add topics of their own. Processes die with the test run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster

_topic_counter = itertools.count()


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
