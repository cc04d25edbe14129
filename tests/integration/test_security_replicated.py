"""A secured, replicated cluster: LocalCluster(security=True, etcd_members=1).

Goal: replication, the controller's calls, leader moves and the ACL RPCs
all work over mutual TLS between the services (the stores' own principal is
a super user), with etcd's traffic left plain; LocalCluster's own health
checks and `partition_states`/`wait_in_sync` work on a secured cluster; an
ACL created through one store is in effect at every service and described
the same by every store, also after the store that led `__acls` is killed;
and `env` and `extra_args` still apply on top of the security flags.

Method: three partition stores, one etcd, a coordinator and a group
coordinator as OS processes; raw stubs over TLS (tests/support/tls.py). The
store leading `__acls` is killed and the ACLs are read from the new
leader. Waits are bounded polls; no assertion depends on timing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.status import error_from_rpc
from tests.support.polling import retrying, wait_until
from tests.support.tls import CHANNEL_OPTIONS, Principal, credentials, wait_acls_applied

TOPIC = "replicated"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("secure-rep") / "cluster", partition_stores=3,
                      etcd_members=1, security=True, transaction_state_partitions=1,
                      consumer_offsets_partitions=1,
                      env={"ONCELOG_LOG_FORMAT": "json"},
                      extra_args={"coordinator": ["--acl-refresh-interval-ms", "300"]}) as c:
        yield c


def _produce(store: ps_grpc.PartitionStoreStub) -> ps.ProduceResponse:
    batch = encode_batch([(b"k", b"v", None, int(time.time() * 1000))])
    reply: ps.ProduceResponse = store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=batch)], timeout_ms=10_000),
        timeout=30)
    return reply


def _store_stub(cluster: LocalCluster, index: int, name: str) -> tuple[grpc.Channel,
                                                                      ps_grpc.PartitionStoreStub]:
    channel = grpc.secure_channel(cluster.address("partition_store", index),
                                  credentials(cluster, name), options=CHANNEL_OPTIONS)
    return channel, ps_grpc.PartitionStoreStub(channel)


def test_replication_and_acls_over_mutual_tls(cluster: LocalCluster) -> None:
    with Principal(cluster, "admin") as admin:
        created = retrying(lambda: admin.store.CreateTopics(ps.CreateTopicsRequest(
            topics=[ps.TopicSpec(name=TOPIC, partitions=1, replication_factor=3)])))
        assert created.results[0].error.code == 0, created
        cluster.wait_in_sync([TOPIC, "__acls"])
        placement = cluster.partition_states([TOPIC])[(TOPIC, 0)]
        assert sorted(placement.replicas) == [0, 1, 2]

        # An ACL created through store 1 reaches every service, and every
        # store describes it.
        channel, store1 = _store_stub(cluster, 1, "admin")
        with channel:
            reply = store1.CreateAcls(ps.CreateAclsRequest(creations=[ps.AclBinding(
                principal="User:writer", host="*", resource_type="topic", resource_name=TOPIC,
                pattern_type="literal", operation="write", permission="allow")]))
            assert reply.results[0].code == 0
        wait_acls_applied(admin)
        for index in range(3):
            channel, store = _store_stub(cluster, index, "admin")
            with channel:
                bindings = store.DescribeAcls(ps.DescribeAclsRequest()).bindings
            assert [(b.principal, b.operation) for b in bindings] == [("User:writer", "write")]

        leader = placement.leader
        channel, writer = _store_stub(cluster, leader, "writer")
        with channel:
            [result] = _produce(writer).results
            assert result.error.code == 0, result.error

        # The store leading __acls goes away; the ACLs are read from the new leader.
        acls_leader = cluster.partition_states(["__acls"])[("__acls", 0)].leader
        cluster.kill("partition_store", acls_leader)
        survivors = [i for i in range(3) if i != acls_leader]

        def acls_moved() -> bool:
            state = cluster.partition_states(["__acls"], stores=survivors).get(("__acls", 0))
            return state is not None and state.leader in survivors

        wait_until("__acls gets a new leader", acls_moved, deadline_s=120)
        channel, store = _store_stub(cluster, survivors[0], "admin")
        with channel:
            # Still described by the survivors: their ACLs outlive the leader.
            # Retried: the store asked may learn of the new leader only when
            # its first read of __acls fails at the old one (retriable).
            bindings = retrying(lambda: store.DescribeAcls(ps.DescribeAclsRequest()),
                                timeout_s=90).bindings
            assert [b.principal for b in bindings] == ["User:writer"]
            # Retried while the partition's in-sync replicas shrink to the
            # survivors (a retry after a timed-out but applied delete finds
            # nothing left to delete).
            retrying(lambda: store.DeleteAcls(ps.DeleteAclsRequest(
                filters=[ps.AclBindingFilter(principal="User:writer")])), timeout_s=90)
        for index in survivors:
            channel, store = _store_stub(cluster, index, "admin")
            with channel:
                def gone(store: ps_grpc.PartitionStoreStub = store) -> bool:
                    return not store.DescribeAcls(ps.DescribeAclsRequest()).bindings

                wait_until(f"store {index} no longer describes the ACL", gone)

        def refused_everywhere() -> bool:
            # The writer is refused by whichever store leads TOPIC now.
            for index in survivors:
                channel, stub = _store_stub(cluster, index, "writer")
                with channel:
                    try:
                        results = _produce(stub).results
                    except grpc.RpcError as exc:
                        code = ErrorCode.from_wire(error_from_rpc(exc).code)
                        if code is not ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                            return False
                        continue
                    if results[0].error.code == 0:
                        raise AssertionError(f"store {index} took a write after the ACL "
                                             "was deleted")
                    if results[0].error.code != ErrorCode.NOT_LEADER_OR_FOLLOWER:
                        return False
            return True

        wait_until("every store refuses the writer", refused_everywhere, deadline_s=60)
        cluster.restart("partition_store", acls_leader)
        cluster.wait_in_sync([TOPIC, "__acls"], timeout_s=120)


def test_env_and_extra_args_apply_on_top_of_security(cluster: LocalCluster) -> None:
    lines = [json.loads(line) for line in cluster.log_tail("coordinator", lines=10_000).splitlines()
             if line.startswith("{")]
    messages = [entry["msg"] for entry in lines]
    assert any("refreshed every 300 ms" in m for m in messages), messages[:20]
    store_lines = cluster.log_tail("partition_store", 0, lines=10_000).splitlines()
    assert any("refreshed every 200 ms" in line for line in store_lines)
