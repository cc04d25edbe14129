"""Rolling restarts under load, round after round (not in the default test
run: `bash scripts/chaos.sh -k rolling`), and a kill -9 of each store to
compare with.

Goal: what tests/integration/test_rolling_restart.py checks for one round
holds for ONCELOG_ROLLING_ROUNDS rounds (default 5) of SIGTERM and restart
of every store, the transaction coordinator and the group coordinator: the
clients meet retriable errors only, nothing acknowledged is lost, nothing is
duplicated, the copier's output holds its input exactly once, and every
store's leaderships move by its controlled shutdown. Then each store is
killed with kill -9 under the same load, so the figures printed at the end
compare how long leadership takes to move either way (docs/replication.md
quotes them).

Method: the same load, restarts and checks as the default-run test
(tests/support/rolling.py), for longer.

    ONCELOG_ROLLING_ROUNDS=10 bash scripts/chaos.sh -k rolling
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster
from tests.support.copier import verify_exactly_once
from tests.support.rolling import (
    ErrorTally,
    RollingRestart,
    StoreStop,
    check_input,
    check_kafka_writes,
    check_output,
    start_load,
    stop_load,
    uncontrolled_moves,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROUNDS = int(os.environ.get("ONCELOG_ROLLING_ROUNDS", "5"))


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path / "cluster", partition_stores=3, etcd_members=1, kafka_listener=True,
        transaction_state_partitions=2, consumer_offsets_partitions=2,
        extra_args={"group_coordinator": ["--initial-rebalance-delay-ms", "300"]},
    ) as c:
        yield c


def _spread(stops: list[StoreStop], what: str) -> str:
    values = [getattr(s, what) for s in stops]
    return (f"median {statistics.median(values):.2f} s, {min(values):.2f}-{max(values):.2f} s "
            f"over {len(values)}")


def test_rolling_restarts_round_after_round_then_kill_9_to_compare(
        cluster: LocalCluster) -> None:
    tally = ErrorTally()
    load = start_load(cluster, tally)
    rolling = RollingRestart(cluster)
    try:
        for _ in range(ROUNDS):
            rolling.round()
        for node in range(len(cluster.processes["partition_store"])):
            rolling.store(node, kill=True)
    finally:
        stop_load(load)
    controlled = [s for s in rolling.stops if s.how == "SIGTERM"]
    killed = [s for s in rolling.stops if s.how != "SIGTERM"]
    print(f"\n{ROUNDS} rounds:\n{rolling.summary()}\n"
          f"leadership moved (gRPC metadata), SIGTERM: {_spread(controlled, 'moved_grpc_s')}; "
          f"kill -9: {_spread(killed, 'moved_grpc_s')}\n"
          f"(Kafka metadata), SIGTERM: {_spread(controlled, 'moved_kafka_s')}; "
          f"kill -9: {_spread(killed, 'moved_kafka_s')}\n"
          f"SIGTERM to exit: {_spread(controlled, 'exited_s')}\n"
          f"errors the clients met (client, kind, name, count):\n{tally.table()}\n"
          f"copier transactions: {load.copier.transactions} committed, "
          f"{load.copier.aborted} aborted")
    not_retriable = {key: n for key, n in tally.snapshot().items()
                     if key[1] != "retriable" and key[:2] != ("sdk", "retried")}
    assert not not_retriable, f"errors that are not retriable: {not_retriable}"
    uncontrolled = {(s.node, i): uncontrolled_moves(cluster, s)
                    for i, s in enumerate(controlled)}
    assert not any(uncontrolled.values()), \
        f"leaderships that did not move by a controlled shutdown: {uncontrolled}"
    check_input(cluster.bootstrap_servers, load.input)
    check_output(cluster.bootstrap_servers, load.copier, load.reader)
    verify_exactly_once(cluster.bootstrap_servers, "in", "out", 3)
    check_kafka_writes(cluster.bootstrap_servers, load.kafka)
