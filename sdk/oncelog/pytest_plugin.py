"""pytest fixtures for testing code that uses oncelog against a real cluster.

Installed with the SDK and loaded by pytest on its own (the `pytest11` entry
point), so a user's tests just name the fixtures:

    def test_sends(oncelog_bootstrap: str, oncelog_topic: str) -> None:
        with Producer(bootstrap=oncelog_bootstrap) as producer:
            producer.send(oncelog_topic, value=b"x").result()

* `oncelog_cluster` — one `LocalCluster` for the whole test session, in a
  temporary directory, started when a test first needs it and stopped at the
  end of the session (needs the services: `pip install 'oncelog[server]'`);
* `oncelog_bootstrap` — the address clients connect to: that cluster's, or
  the one given with `--oncelog-bootstrap` (then nothing is started);
* `oncelog_admin` — an `Admin` connected to it, closed after the test;
* `oncelog_topic` — a topic made for this test alone (a unique name), with
  one partition unless the test is marked
  `@pytest.mark.oncelog_topic(partitions=3, config={...})`.

Loading the plugin starts nothing and imports no more than the SDK's client
needs: a run that uses none of the fixtures costs nothing, and the plugin
loads where only the SDK is installed. docs/testing.md, "Testing your own
code", has an example to copy.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from oncelog.admin import Admin
    from oncelog.testing import LocalCluster

BOOTSTRAP_OPTION = "--oncelog-bootstrap"
TOPIC_MARKER = "oncelog_topic"
# Kafka's rules for a topic name: these characters, at most 249 of them.
_NOT_IN_TOPIC_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# How much of the test's name goes into its topic's name.
_TOPIC_NAME_TEST_CHARS = 120
_topic_numbers = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oncelog")
    group.addoption(
        BOOTSTRAP_OPTION, dest="oncelog_bootstrap", default=None, metavar="HOST:PORT",
        help="run the oncelog fixtures against this running cluster instead of starting "
             "a LocalCluster (oncelog_cluster is then unavailable)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{TOPIC_MARKER}(partitions=1, config=None): the partition count and topic config "
        f"of the test's oncelog_topic",
    )


@pytest.fixture(scope="session")
def oncelog_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalCluster]:
    """One LocalCluster (a partition store, a transaction coordinator and a
    group coordinator, each its own process) for the whole session."""
    if request.config.getoption("oncelog_bootstrap") is not None:
        pytest.fail(f"oncelog_cluster starts a cluster of its own, but {BOOTSTRAP_OPTION} "
                    f"names one to use: a test that needs the cluster object (to kill or "
                    f"restart a service) cannot run against a cluster given by address",
                    pytrace=False)
    # Imported here: loading the plugin must not need the services.
    from oncelog.testing import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("oncelog-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def oncelog_bootstrap(request: pytest.FixtureRequest) -> str:
    """The cluster's address for clients' `bootstrap=`: every partition
    store's (comma-separated), so that a client of a replicated cluster
    starts while any one store is down."""
    given = request.config.getoption("oncelog_bootstrap")
    if given is not None:
        return str(given)
    # By name, not as a parameter: with --oncelog-bootstrap no cluster starts.
    cluster: LocalCluster = request.getfixturevalue("oncelog_cluster")
    return cluster.bootstrap_servers


@pytest.fixture
def oncelog_admin(oncelog_bootstrap: str) -> Iterator[Admin]:
    """An Admin client of the cluster, closed after the test."""
    from oncelog.admin import Admin

    with Admin(bootstrap=oncelog_bootstrap) as admin:
        yield admin


@pytest.fixture
def oncelog_topic(request: pytest.FixtureRequest, oncelog_admin: Admin) -> str:
    """The name of a topic created for this test alone. The topic is left
    in place after the test, so its records can be read when it fails."""
    partitions, config = _topic_settings(request.node.get_closest_marker(TOPIC_MARKER))
    name = topic_name_for(request.node.name)
    oncelog_admin.create_topic(name, partitions=partitions, config=config)
    return name


def topic_name_for(test_name: str) -> str:
    """A topic name made from a test's name, unique within this process and
    across processes (another run, another xdist worker, the same cluster)."""
    readable = _NOT_IN_TOPIC_NAME.sub("-", test_name).strip("-.")[:_TOPIC_NAME_TEST_CHARS]
    return f"test-{readable}-{next(_topic_numbers)}-{uuid.uuid4().hex[:8]}"


def _topic_settings(marker: pytest.Mark | None) -> tuple[int, dict[str, str]]:
    if marker is None:
        return 1, {}
    if marker.args:
        pytest.fail(
            f"@pytest.mark.{TOPIC_MARKER} takes keyword arguments only "
            f"(partitions=..., config=...), got {marker.args!r}", pytrace=False)
    unknown = set(marker.kwargs) - {"partitions", "config"}
    if unknown:
        pytest.fail(
            f"@pytest.mark.{TOPIC_MARKER} got {sorted(unknown)}; it takes partitions and config",
            pytrace=False)
    partitions: Any = marker.kwargs.get("partitions", 1)
    if type(partitions) is not int or partitions < 1:
        pytest.fail(
            f"@pytest.mark.{TOPIC_MARKER}(partitions=...) must be an int >= 1, "
            f"got {partitions!r}", pytrace=False)
    config: Any = marker.kwargs.get("config") or {}
    if not isinstance(config, Mapping):
        pytest.fail(
            f"@pytest.mark.{TOPIC_MARKER}(config=...) must be a mapping of topic configs, "
            f"got {config!r}", pytrace=False)
    return partitions, {str(key): str(value) for key, value in config.items()}
