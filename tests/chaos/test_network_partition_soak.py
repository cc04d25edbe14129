"""Every kind of network partition, in rounds, under transactional and
idempotent writers (slow: not in the default test run).

Goal: through each kind of cut — one leader isolated; a majority/minority
split with one etcd member on the leader's side; a one-way loss (the
leader's packets to its followers dropped); a leader cut from etcd but not
from its followers and clients; a leader cut from its followers but not from
etcd; the clients cut from the leader only — and each heal, nothing
acknowledged is lost or moved, nothing is written twice, no aborted or torn
transaction is visible, order per partition holds, and writes flow again
after every heal (during the cut too, where the leadership can move).

Method: LocalCluster(network="namespaces") with three stores (RF 3, min ISR
2), a three-member etcd and a transaction coordinator; the client streams
of tests/support/partitioned_clients.py write to three partitions
throughout. Each round applies every kind of cut to the leader of one
partition (a different one each round), waits for progress where writes
must go on (or holds the cut HOLD_S where they may not), heals, waits until
every partition is in sync and the writers progress. The final read is held
against the writers' logs.

    ONCELOG_PARTITION_ROUNDS=3 .venv/bin/pytest -m slow tests/chaos/test_network_partition_soak.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster
from tests.support.partitioned_clients import (
    ClientStreams,
    check_exactly_once,
    create_topic,
    read_committed,
)

TOPIC = "soak"
PARTITIONS = 3
STORES = 3
ETCD_MEMBERS = 3
LEASE_TTL_S = 2
LAG_MAX_MS = 3_000
# How long a cut that stops writes (no leader change) is held.
HOLD_S = 8.0

Member = tuple[str, int]
# A cut applied to the leader of a partition: (name, does the leadership
# move so that writes go on during it, apply(cluster, leader)).
Cut = tuple[str, bool, Callable[[LocalCluster, int], None]]


def _others(leader: int) -> list[Member]:
    return [("partition_store", i) for i in range(STORES) if i != leader]


def _etcd() -> list[Member]:
    return [("etcd", i) for i in range(ETCD_MEMBERS)]


CUTS: list[Cut] = [
    ("isolate the leader", True,
     lambda c, leader: c.isolate("partition_store", leader)),
    ("majority/minority split", True,
     lambda c, leader: c.cut([("partition_store", leader), ("etcd", 0)],
                             [*_others(leader), ("etcd", 1), ("etcd", 2), ("coordinator", 0),
                              ("client", 0)])),
    ("leader cut from etcd only", True,
     lambda c, leader: c.cut([("partition_store", leader)], _etcd())),
    ("leader's packets to its followers lost (one way)", False,
     lambda c, leader: c.cut([("partition_store", leader)], _others(leader), one_way=True)),
    ("leader cut from its followers only", False,
     lambda c, leader: c.cut([("partition_store", leader)], _others(leader))),
    ("clients cut from the leader only", False,
     lambda c, leader: c.cut([("client", 0)], [("partition_store", leader)])),
]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_kind_of_partition_in_rounds(tmp_path: Path) -> None:
    rounds = int(os.environ.get("ONCELOG_PARTITION_ROUNDS", "3"))
    started = time.monotonic()
    with LocalCluster(
        tmp_path / "cluster", partition_stores=STORES, group_coordinators=0,
        etcd_members=ETCD_MEMBERS, network="namespaces",
        env={"ONCELOG_LEASE_TTL_S": str(LEASE_TTL_S),
             "ONCELOG_REPLICA_LAG_TIME_MAX_MS": str(LAG_MAX_MS)},
    ) as cluster:
        cluster.client_call(create_topic, cluster.bootstrap_servers, TOPIC, PARTITIONS)
        cluster.wait_in_sync()
        streams = ClientStreams(cluster, TOPIC, PARTITIONS, tmp_path / "clients")
        figures: list[str] = []
        try:
            streams.wait_progress("before the first cut")
            for round_number in range(rounds):
                for name, moves, apply in CUTS:
                    partition = round_number % PARTITIONS
                    state = cluster.partition_states([TOPIC])[(TOPIC, partition)]
                    cut_at = time.monotonic()
                    apply(cluster, state.leader)
                    if moves:
                        took_s = streams.wait_progress(f"round {round_number}: {name}")
                        figures.append(f"{name}: writes flowing {took_s:.1f} s into the cut")
                    else:
                        time.sleep(HOLD_S)
                    cluster.heal()
                    cluster.wait_in_sync(timeout_s=120)
                    streams.wait_progress(f"round {round_number}: after healing {name}")
                    figures.append(f"{name}: healed and flowing "
                                   f"{time.monotonic() - cut_at:.1f} s after the cut")
        finally:
            log = streams.stop()
        records = cluster.client_call(read_committed, cluster.bootstrap_servers, TOPIC,
                                      PARTITIONS)
    check_exactly_once(log, records)
    print(f"\n{rounds} rounds of {len(CUTS)} cuts in {time.monotonic() - started:.0f} s; "
          f"{len(log.acked)} idempotent records and {log.committed()} transactions "
          f"acknowledged, {len(records)} records read back")
    for line in figures:
        print(" ", line)
