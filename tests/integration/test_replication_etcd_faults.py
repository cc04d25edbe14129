"""A replicated cluster when its metadata store (etcd) fails.

Goal: etcd is where leaders, epochs and ISRs are decided, never the data
path. With three etcd members, losing one changes nothing (etcd keeps its
quorum: a store failover still works). With etcd unreachable, the stores
keep serving with the leaders they have — produce and consume go on — and no
leader can change, so nothing unsafe can happen; when etcd returns, a leader
that died meanwhile is replaced and nothing acknowledged is lost.

Method: LocalCluster with three stores and an etcd of three members (or one),
an idempotent producer, kill -9 of etcd members and of a store leader, then
every record read back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.integration.test_replication import LAG_MAX_MS, LEASE_TTL_S, _describe, _wait
from tests.support.reading import read_all

pytestmark = pytest.mark.timeout(300)

ENV = {"ONCELOG_LEASE_TTL_S": str(LEASE_TTL_S),
       "ONCELOG_REPLICA_LAG_TIME_MAX_MS": str(LAG_MAX_MS)}


def _send(bootstrap: str, topic: str, values: range, *, timeout_s: float = 60) -> None:
    with Producer(bootstrap=bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic, value=b"%d" % i, partition=0) for i in values]
        for future in futures:
            future.result(timeout=timeout_s)


def _values(bootstrap: str, topic: str) -> list[int]:
    return [int(r.value) for r in read_all(bootstrap, topic, 1)
            if r.value is not None and r.value.isdigit()]


def test_one_of_three_etcd_members_down_changes_nothing(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, partition_stores=3, group_coordinators=0, etcd_members=3,
                      env=ENV) as cluster:
        bootstrap = cluster.bootstrap_servers
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic("quorum", partitions=1, replication_factor=3)
        _send(bootstrap, "quorum", range(0, 100))
        cluster.kill("etcd", 0)
        _send(bootstrap, "quorum", range(100, 200))
        # Leader election still works: etcd has its quorum.
        leader, epoch, _r, _i = _describe(cluster, "quorum")[0]
        cluster.kill("partition_store", leader)
        _wait("a new leader", lambda: _describe(cluster, "quorum")[0][1] > epoch)
        _send(bootstrap, "quorum", range(200, 300))
        cluster.restart("partition_store", leader)
        cluster.restart("etcd", 0)
        _wait("all replicas in sync", lambda: len(_describe(cluster, "quorum")[0][3]) == 3)
        assert _values(bootstrap, "quorum") == list(range(300))


def test_without_etcd_the_data_path_goes_on_and_no_leader_changes(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, partition_stores=3, group_coordinators=0, etcd_members=1,
                      env=ENV) as cluster:
        bootstrap = cluster.bootstrap_servers
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic("steady", partitions=1, replication_factor=3)
        _send(bootstrap, "steady", range(0, 100))
        before = _describe(cluster, "steady")[0]
        cluster.kill("etcd", 0)
        # Well past the lease TTL: leaders keep serving, replicas keep copying.
        time.sleep(LEASE_TTL_S * 2)
        _send(bootstrap, "steady", range(100, 200))
        assert _values(bootstrap, "steady") == list(range(200))
        assert _describe(cluster, "steady")[0] == before
        # The leader dies while etcd is away: nobody can take over (no
        # acknowledgement can come from anywhere) until etcd returns.
        leader, epoch = before[0], before[1]
        cluster.kill("partition_store", leader)
        with Producer(bootstrap=bootstrap, linger_ms=0, delivery_timeout_ms=3_000,
                      request_timeout_ms=1_000) as producer:
            stuck = producer.send("steady", value=b"stuck", partition=0)
            with pytest.raises(Exception):  # noqa: B017 - any failure: nothing acknowledged
                stuck.result(timeout=20)
        cluster.restart("etcd", 0)
        _wait("a new leader once etcd is back",
              lambda: _describe(cluster, "steady")[0][1] > epoch, timeout_s=60)
        _send(bootstrap, "steady", range(200, 300))
        cluster.restart("partition_store", leader)
        _wait("all replicas in sync", lambda: len(_describe(cluster, "steady")[0][3]) == 3)
        assert _values(bootstrap, "steady") == list(range(300))
