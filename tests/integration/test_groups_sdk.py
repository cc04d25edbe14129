"""Consumer groups through the SDK, against the real group coordinator.

Goal: bad input — an unknown group, a stale generation, an unknown member,
offsets for a partition the member does not own, a negative offset, outside
changes to a group in use, transactional offsets from a fenced member — gets
a clear error and stores nothing; Admin lists, describes, shows lag, resets
and deletes groups. The read-process-write guarantees (a copier with
send_offsets_to_transaction writing every record exactly once across
aborted transactions; a pending transactional offset invisible until its
commit) are the client contract, tested against the threaded and the
asyncio client alike in test_client_contract.py.

Method: one LocalCluster (one store, one transaction coordinator, one group
coordinator) for the module, a topic per test; Consumer, Producer and Admin
as an application uses them. Waits are bounded loops on observable state.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from oncelog import (
    Admin,
    Consumer,
    ConsumerRecord,
    GroupMetadata,
    Producer,
    TopicPartition,
    errors,
)
from oncelog.testing import LocalCluster

_ids = itertools.count()
WAIT_S = 30.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("groups-sdk") / "cluster",
                      consumer_offsets_partitions=2) as c:
        yield c


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap=cluster.bootstrap) as a:
        yield a


def new_topic(admin: Admin, partitions: int) -> str:
    name = f"gs-{next(_ids)}"
    admin.create_topic(name, partitions=partitions)
    return name


def produce(cluster: LocalCluster, topic: str, values_by_partition: dict[int, list[bytes]]
            ) -> None:
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for p, values in values_by_partition.items():
            for v in values:
                producer.send(topic, value=v, partition=p)
        producer.flush()


def eventually(value: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = value()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {got!r}")
        time.sleep(0.02)


def poll_until_assigned(consumer: Consumer, count: int) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + WAIT_S
    while len(consumer.assignment()) != count:
        assert time.monotonic() < deadline, consumer.assignment()
        got += consumer.poll(timeout=0.1)
    return got


# ------------------------------------------------------------------ bad input


def test_bad_input_gets_clear_errors_and_stores_nothing(
        cluster: LocalCluster, admin: Admin) -> None:
    topic = new_topic(admin, 2)
    produce(cluster, topic, {0: [b"x"] * 5, 1: [b"y"] * 5})
    group = f"bad-{topic}"
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    unknown = f"never-used-{topic}"
    with pytest.raises(errors.GroupIdNotFoundError, match=unknown):
        admin.describe_group(unknown)
    with pytest.raises(errors.GroupIdNotFoundError, match=unknown):
        admin.delete_group(unknown)
    assert admin.list_group_offsets(unknown) == {}
    with Consumer(bootstrap=cluster.bootstrap, group_id=unknown) as nobody:
        assert nobody.committed([t0]) == {t0: None}
    with pytest.raises(ValueError, match="group_id"):
        admin.describe_group("")

    a = Consumer(bootstrap=cluster.bootstrap, group_id=group, session_timeout_ms=3_000)
    b = Consumer(bootstrap=cluster.bootstrap, group_id=group, session_timeout_ms=3_000)
    with a, b, Producer(bootstrap=cluster.bootstrap, transactional_id=f"bad-{topic}") as producer:
        a.subscribe([topic])
        poll_until_assigned(a, 2)
        a.commit({t0: 2, t1: 2})
        stored = {t0: 2, t1: 2}
        b.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while not (len(a.assignment()) == 1 and len(b.assignment()) == 1):
            assert time.monotonic() < deadline, (a.assignment(), b.assignment())
            a.poll(timeout=0.05)
            b.poll(timeout=0.05)
        (mine,) = a.assignment()
        (theirs,) = b.assignment()
        meta = a.group_metadata()

        # Offsets for a partition this member does not own.
        with pytest.raises(errors.StaleMemberEpochError, match=f"{theirs.topic}-"):
            a.commit({mine: 4, theirs: 4})
        # A negative offset (refused before it is sent; the coordinator
        # refuses it too, see test_group_coordinator.py).
        with pytest.raises(ValueError, match="int >= 0"):
            a.commit({mine: -1})
        with pytest.raises(ValueError, match="int >= 0"):
            admin.alter_group_offsets(group, {mine: -1})
        # Changes from outside while the group has members.
        with pytest.raises(errors.UnknownMemberIdError, match="has members"):
            admin.alter_group_offsets(group, {mine: 0})
        with pytest.raises(errors.NonEmptyGroupError):
            admin.delete_group(group)

        # Transactional offsets with a stale generation or an unknown member:
        # the transaction must be aborted; nothing is stored.
        producer.init_transactions()
        cases: list[tuple[GroupMetadata, TopicPartition, type[errors.OncelogError]]] = [
            (GroupMetadata(group, meta.generation_id + 5, meta.member_id), mine,
             errors.FencedMemberEpochError),
            (GroupMetadata(group, meta.generation_id, "no-such-member"), mine,
             errors.UnknownMemberIdError),
            (meta, theirs, errors.StaleMemberEpochError),
        ]
        for bad_meta, tp, error in cases:
            producer.begin_transaction()
            with pytest.raises(errors.TransactionAbortableError) as raised:
                producer.send_offsets_to_transaction({tp: 5}, bad_meta)
            assert isinstance(raised.value.__cause__, error), raised.value
            with pytest.raises(errors.TransactionAbortableError):
                producer.commit_transaction()
            producer.abort_transaction()
        assert a.committed([t0, t1]) == stored
        assert admin.list_group_offsets(group) == admin.list_group_offsets(group, [t0, t1])
        assert {tp: o.offset for tp, o in admin.list_group_offsets(group).items()} == stored


# ------------------------------------------------------------------ admin


def test_admin_lists_describes_shows_lag_resets_and_deletes(
        cluster: LocalCluster, admin: Admin) -> None:
    topic = new_topic(admin, 2)
    before_ms = int(time.time() * 1000)
    produce(cluster, topic, {0: [b"a"] * 4, 1: [b"b"] * 6})
    group = f"admin-{topic}"
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Consumer(bootstrap=cluster.bootstrap, group_id=group, group_instance_id="instance-1",
                  session_timeout_ms=2_000) as consumer:
        consumer.subscribe([topic])
        poll_until_assigned(consumer, 2)
        consumer.commit({t0: 1, t1: 6})
        assert (group, "Stable") in [(g.group_id, g.state) for g in eventually(
            admin.list_groups, lambda gs: (group, "Stable") in [(g.group_id, g.state)
                                                                for g in gs], "Stable")]
        assert group in [g.group_id for g in admin.list_groups(["Stable"])]
        assert group not in [g.group_id for g in admin.list_groups(["Empty"])]
        d = admin.describe_group(group)
        (member,) = d.members
        assert (d.state, member.group_instance_id, member.subscribed_topics) == (
            "Stable", "instance-1", (topic,))
        assert member.assignment == (t0, t1)
        assert member.member_id == consumer.group_metadata().member_id
        offsets = admin.list_group_offsets(group)
        assert {tp: (o.offset, o.end_offset, o.lag) for tp, o in offsets.items()} == {
            t0: (1, 4, 3), t1: (6, 6, 0)}
        with pytest.raises(errors.UnknownMemberIdError):
            admin.reset_group_offsets(group, to="earliest")
    # The static member left for a restart (epoch -2): it stays until its
    # session times out, so the group is not empty yet.
    eventually(lambda: admin.describe_group(group).members, lambda ms: not ms, "empty group")
    assert admin.reset_group_offsets(group, to="earliest", dry_run=True) == {t0: 0, t1: 0}
    assert admin.list_group_offsets(group)[t0].offset == 1, "a dry run commits nothing"
    assert admin.reset_group_offsets(group, to="earliest") == {t0: 0, t1: 0}
    assert admin.reset_group_offsets(group, [t1], to="latest") == {t1: 6}
    assert admin.reset_group_offsets(group, [t0], offset=2) == {t0: 2}
    with pytest.raises(errors.OffsetOutOfRangeError, match="outside"):
        admin.reset_group_offsets(group, [t0], offset=99)
    assert admin.reset_group_offsets(group, [t0, t1], timestamp_ms=before_ms) == {t0: 0, t1: 0}
    assert admin.reset_group_offsets(group, [t0], timestamp_ms=before_ms + 10**9) == {t0: 4}
    with pytest.raises(ValueError, match="exactly one"):
        admin.reset_group_offsets(group, to="latest", offset=1)
    assert {tp: o.offset for tp, o in admin.list_group_offsets(group).items()} == {t0: 4, t1: 0}
    admin.delete_group(group)
    assert group not in [g.group_id for g in admin.list_groups()]
    assert admin.list_group_offsets(group) == {}
