"""A rolling restart under load: every service of a replicated cluster
restarted one at a time with SIGTERM gives the clients retriable errors
only, and loses and duplicates nothing.

Goal: with 3 stores (RF 3, min.insync.replicas 2, etcd), while our SDK's
idempotent producer writes, our SDK's transactional copier copies with a
read_committed consumer (aborting one transaction in ten on purpose), a
read_committed reader follows the copier's output, and librdkafka's
idempotent producer writes through the Kafka listeners, each store in turn,
then the transaction coordinator, then the group coordinator, gets SIGTERM
and is started again (the next only once the restarted store reports
itself in sync and every replica is):
* every error any client met — inside our SDK (retried or not), raised to
  the application, or reported by librdkafka — is retriable (an
  out-of-order sequence our producer retries because an older batch had not
  arrived yet counts as such: had it been the oldest, the batch would have
  failed, and the application would have seen it);
* every record acknowledged to either producer is stored once, at its
  offset, and nothing else is; every copier transaction that committed is
  in the output whole, at the offsets its producer was told, none that
  aborted is visible to read_committed (no aborted read), none whose
  outcome the copier did not learn is torn — checked on what a reader finds
  at the end and on what the reader was given while the restarts ran,
  which must be the same records (a record read then and gone now was read
  uncommitted); the copier's output holds every input record exactly once,
  in order per key (read_committed);
* each store handed its leaderships over before it stopped (controlled
  shutdown): in etcd's history the first leader change of each partition
  it led keeps it in the ISR, which an election after its lease ended
  never does; the gRPC and the Kafka metadata of another store both name
  the new leaders.
How long leadership took to move (SIGTERM to new leaders in the gRPC and
the Kafka metadata), and the errors by client and kind, are printed for the
notes (docs/replication.md), never asserted.

Method: LocalCluster with Kafka listeners and the load of
tests/support/rolling.py in threads of the test process (so our SDK's
errors can be counted where it makes them); the checks read everything back
once the load has stopped and the copier has caught up, with the checkers
the chaos and partition soaks use (tests/support/partitioned_clients.py
check_exactly_once, tests/support/copier.py verify_exactly_once). A slow variant with
more rounds, and a kill -9 for comparison, is tests/chaos/
test_rolling_restart_soak.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster
from tests.support.copier import verify_exactly_once
from tests.support.rolling import (
    ErrorTally,
    RollingRestart,
    check_input,
    check_kafka_writes,
    check_output,
    start_load,
    stop_load,
    uncontrolled_moves,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path / "cluster", partition_stores=3, etcd_members=1, kafka_listener=True,
        transaction_state_partitions=2, consumer_offsets_partitions=2,
        extra_args={"group_coordinator": ["--initial-rebalance-delay-ms", "300"]},
    ) as c:
        yield c


def test_a_rolling_restart_under_load_gives_retriable_errors_only_and_loses_nothing(
        cluster: LocalCluster) -> None:
    tally = ErrorTally()
    load = start_load(cluster, tally)
    rolling = RollingRestart(cluster)
    try:
        rolling.round()
    finally:
        stop_load(load)
    print(f"\nrolling restart:\n{rolling.summary()}\nerrors the clients met "
          f"(client, kind, name, count):\n{tally.table()}\n"
          f"copier transactions: {load.copier.transactions} committed, "
          f"{load.copier.aborted} aborted")
    not_retriable = {key: n for key, n in tally.snapshot().items()
                     if key[1] != "retriable" and key[:2] != ("sdk", "retried")}
    assert not not_retriable, f"errors that are not retriable: {not_retriable}"
    uncontrolled = {stop.node: uncontrolled_moves(cluster, stop) for stop in rolling.stops}
    assert not any(uncontrolled.values()), \
        f"leaderships that did not move by a controlled shutdown: {uncontrolled}"
    assert all(stop.movable for stop in rolling.stops), "a store led nothing to hand over"
    # Without aborted transactions the aborted-read check would check nothing.
    assert load.copier.aborted > 0, "the copier aborted no transaction"
    check_input(cluster.bootstrap_servers, load.input)
    check_output(cluster.bootstrap_servers, load.copier, load.reader)
    verify_exactly_once(cluster.bootstrap_servers, "in", "out", 3)
    check_kafka_writes(cluster.bootstrap_servers, load.kafka)
