"""The group consumer against the real group coordinator.

Goal: subscribe() joins and poll() applies what the coordinator assigns, in
the application's thread: newly assigned partitions start at the group's
committed offset (waiting while a transactional offset is pending) or at
auto_offset_reset; revoked ones are auto-committed, handed to on_revoke and
forgotten — no record of theirs comes out after on_revoke, and the
coordinator hears of the revocation only after on_revoke returned; partitions
lost to a removal go to on_lost (or on_revoke) without any commit, and the
member joins again; commit()/committed()/seek_to_committed()/group_metadata()
carry the member's identity; close() leaves (epoch -1, or -2 for a static
member); a coordinator that moves is found again; fatal errors surface from
poll(); bad usage fails before anything is sent.

Method: tests/support/inprocess_cluster.InProcessCluster, the real store,
transaction coordinator and group coordinator in this process, handing out
heartbeat intervals of 20 ms. Assignments come from the coordinator's own
assignor: a member alone in its group gets every partition of its topic (so
each test sizes topic "t" to what the consumer should own), and a second
member joining through the protocol (`join_member`) takes a share, which the
consumer must revoke first. A member is removed as a session timeout
removes it: the fault layer keeps its heartbeats from the coordinator until
its session ends. Committed offsets are set beforehand with
Admin.alter_group_offsets and a pending transactional offset by a real
transactional producer. Every RPC is recorded, so the tests read what the
consumer told the coordinator and when. Waits poll until a condition holds,
with generous bounds as failure guards only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

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
from oncelog import records as codec
from oncelog.errors import ErrorCode
from tests.support.inprocess_cluster import UNREACHABLE, InProcessCluster

GROUP = "g"
T0, T1 = (TopicPartition("t", p) for p in range(2))
# A partition of a topic the consumer does not subscribe to.
U0 = TopicPartition("u", 0)


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster(min_session_timeout_ms=100, max_heartbeat_interval_ms=20,
                          session_check_interval_ms=20) as s:
        s.create_topic("u", 1)
        yield s


def fill(store: InProcessCluster, partition: int, count: int, *, first: int = 0) -> None:
    store.append_raw("t", partition, codec.encode_batch(
        [(None, f"p{partition}-{first + i}".encode(), None, 100 + i) for i in range(count)]))


def consumer_for(store: InProcessCluster, **kwargs: object) -> Consumer:
    return Consumer(bootstrap=store.address, group_id=GROUP, fetch_max_wait_ms=20,
                    **kwargs)  # type: ignore[arg-type]


def commit_beforehand(store: InProcessCluster, offsets: dict[TopicPartition, int]) -> None:
    """Offsets committed while the group has no members."""
    with Admin(bootstrap=store.address) as admin:
        admin.alter_group_offsets(GROUP, offsets)


def poll_until(consumer: Consumer, done: Callable[[list[ConsumerRecord]], bool],
               *, max_polls: int = 600) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    for _ in range(max_polls):
        got.extend(consumer.poll(timeout=0.05))
        if done(got):
            return got
    raise AssertionError(f"condition not met after {max_polls} polls; got {got}")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Events:
    """What the callbacks saw, in order, and on which thread."""

    def __init__(self) -> None:
        self.log: list[tuple[str, list[TopicPartition]]] = []
        self.threads: set[int] = set()
        # Records returned by the polls that took the first assignment on.
        self.first_records: list[ConsumerRecord] = []

    def callback(self, kind: str) -> Callable[[list[TopicPartition]], None]:
        def record(tps: list[TopicPartition]) -> None:
            self.threads.add(threading.get_ident())
            self.log.append((kind, tps))
        return record

    def subscribe(self, consumer: Consumer, *, lost: bool = True) -> None:
        consumer.subscribe(["t"], on_assign=self.callback("assign"),
                           on_revoke=self.callback("revoke"),
                           on_lost=self.callback("lost") if lost else None)


def joined(consumer: Consumer, events: Events, partitions: set[TopicPartition], *,
           lost: bool = True) -> str:
    """Subscribes to "t" (of exactly `partitions`, all of which the
    coordinator gives a member alone in its group) and polls until on_assign
    ran; returns the member id (records already returned are in
    events.first_records)."""
    events.subscribe(consumer, lost=lost)
    events.first_records = poll_until(consumer, lambda _got: consumer.assignment() == partitions)
    return consumer.group_metadata().member_id


def owned_reports(store: InProcessCluster) -> list[set[TopicPartition]]:
    return [{TopicPartition(p.topic, p.partition) for p in hb.owned_partitions}
            for hb in store.calls_named("ConsumerGroupHeartbeat") if hb.member_epoch > 0]


def lose_session(store: InProcessCluster, member_id: str) -> None:
    """The member's heartbeats no longer reach the coordinator until its
    session there has timed out (the consumer, hearing nothing back, knows
    it has lost its partitions too)."""
    store.coordinator_fault = lambda name, req: (
        UNREACHABLE if name == "ConsumerGroupHeartbeat" and req.member_id == member_id
        and member_id in store.members(GROUP) else None)


# ------------------------------------------------------------------ assignment


def test_assigned_partitions_start_at_the_committed_offset_and_callbacks_run_in_poll(
        store: InProcessCluster) -> None:
    store.create_topic("t", 2)
    commit_beforehand(store, {T0: 2})
    fill(store, 0, 4)
    fill(store, 1, 2)
    events = Events()
    with consumer_for(store) as consumer:
        events.subscribe(consumer)
        assert consumer.poll(timeout=0) == []  # nothing assigned yet: no error, no records
        wait_for(lambda: bool(store.calls_named("ConsumerGroupHeartbeat")), "the join")
        join = store.calls_named("ConsumerGroupHeartbeat")[0]
        assert (join.member_epoch, list(join.subscribed_topics)) == (0, ["t"])
        assert join.member_id  # chosen by the member (KIP-1082)
        got = poll_until(consumer, lambda got: len(got) >= 4)
        assert sorted((r.partition, r.offset) for r in got) == [(0, 2), (0, 3), (1, 0), (1, 1)]
        assert events.log == [("assign", [T0, T1])]
        assert events.threads == {threading.get_ident()}
        assert consumer.assignment() == {T0, T1}
        (member,) = store.members(GROUP).values()
        assert consumer.group_metadata() == GroupMetadata(GROUP, member.member_epoch,
                                                          join.member_id)
        assert member.member_id == join.member_id
        # The coordinator was asked for stable offsets.
        assert all(f.require_stable for f in store.calls_named("OffsetFetch"))
        wait_for(lambda: {T0, T1} in owned_reports(store), "the assignment to be reported")


def test_revocation_is_acknowledged_only_after_on_revoke_and_nothing_of_it_comes_after(
        store: InProcessCluster) -> None:
    store.create_topic("t", 2)
    fill(store, 0, 3)
    fill(store, 1, 3)
    events = Events()
    seen_at_revoke: list[list[set[TopicPartition]]] = []
    with consumer_for(store, max_poll_records=1) as consumer:
        joined(consumer, events, {T0, T1})

        def on_revoke(tps: list[TopicPartition]) -> None:
            seen_at_revoke.append(owned_reports(store))
            consumer.commit()  # still the owner: the commit is accepted
            events.log.append(("revoke", tps))

        consumer.subscribe(["t"], on_assign=events.callback("assign"), on_revoke=on_revoke)
        poll_until(consumer, lambda got: len(got) >= 2)  # data of both is buffered now
        store.join_member(GROUP, ["t"])  # takes one of the two
        after: list[ConsumerRecord] = []
        for _ in range(600):
            got = consumer.poll(timeout=0.05)
            if any(kind == "revoke" for kind, _tps in events.log):
                after += got  # returned by the poll that ran on_revoke
                break
        [revoked] = [tps for kind, tps in events.log if kind == "revoke"]
        assert len(revoked) == 1
        (kept,) = {T0, T1} - set(revoked)
        assert consumer.assignment() == {kept}
        # Records returned by the poll that ran on_revoke, and every later
        # one, are of the kept partition only.
        fill(store, 0, 3, first=3)
        fill(store, 1, 3, first=3)
        after += poll_until(consumer, lambda _got: consumer.position(kept) >= 6)
        assert {r.partition for r in after} == {kept.partition}
        # Once reported as owned, the revoked partition stayed in every
        # heartbeat until on_revoke ran; one soon after left it out.
        reports = seen_at_revoke[0]
        first = next(i for i, owned in enumerate(reports) if revoked[0] in owned)
        assert all(revoked[0] in owned for owned in reports[first:])
        wait_for(lambda: owned_reports(store)[-1] == {kept}, "the revocation to be reported")
        # on_revoke's commit() was taken.
        assert (revoked[0].topic, revoked[0].partition) in store.committed_offsets(GROUP)


# ------------------------------------------------------------------ commits


def test_commit_committed_and_their_checks(store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    fill(store, 0, 5)
    with consumer_for(store) as consumer:
        member_id = joined(consumer, Events(), {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 5)
        wait_for(lambda: {T0} in owned_reports(store), "the assignment to be reported")
        consumer.commit()
        request = store.calls_named("OffsetCommit")[-1]
        assert (request.member_id, request.generation_id) == (
            member_id, consumer.group_metadata().generation_id)
        assert store.committed_offsets(GROUP) == {("t", 0): 5}
        consumer.commit({T0: 3})
        assert consumer.committed([T0, U0]) == {T0: 3, U0: None}
        # A partition this member does not own: refused, nothing stored.
        with pytest.raises(errors.StaleMemberEpochError, match="u-0"):
            consumer.commit({T0: 4, U0: 1})
        with pytest.raises(ValueError, match="must be an int >= 0"):
            consumer.commit({T0: -1})
        assert store.committed_offsets(GROUP) == {("t", 0): 3}


def test_seek_to_committed_rewinds_every_assigned_partition(store: InProcessCluster) -> None:
    store.create_topic("t", 2)
    commit_beforehand(store, {T0: 1})
    fill(store, 0, 4)
    with consumer_for(store) as consumer:
        events = Events()
        joined(consumer, events, {T0, T1})
        first = events.first_records + poll_until(
            consumer, lambda _got: consumer.position(T0) >= 4)
        assert [r.offset for r in first] == [1, 2, 3]
        assert consumer.seek_to_committed() == {T0: 1, T1: None}
        assert consumer.position(T0) == 1
        again = poll_until(consumer, lambda got: len(got) >= 3)
        assert [r.offset for r in again] == [1, 2, 3]


def test_an_assigned_partition_waits_for_a_pending_transactional_offset(
        store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    commit_beforehand(store, {T0: 1})
    fill(store, 0, 5)
    with Producer(bootstrap=store.address, transactional_id="copier") as copier, \
            consumer_for(store) as consumer:
        # A transaction that commits offset 3 of T0 (as a group-less copier
        # would) stays open.
        copier.init_transactions()
        copier.begin_transaction()
        copier.send_offsets_to_transaction({T0: 3}, GroupMetadata(GROUP, -1, ""))
        joined(consumer, Events(), {T0})
        # While the offset is pending, nothing of T0 is read (neither from
        # the old committed offset nor from auto_offset_reset).
        for _ in range(5):
            assert consumer.poll(timeout=0.02) == []
        fetches_before = len(store.calls_named("OffsetFetch"))
        assert fetches_before >= 2  # asked again while unstable
        copier.commit_transaction()  # its marker lands: the offset is committed
        got = poll_until(consumer, lambda got: len(got) >= 2)
        assert [r.offset for r in got] == [3, 4]


def test_auto_commit_on_the_interval_before_revocation_and_on_close(
        store: InProcessCluster) -> None:
    store.create_topic("t", 2)
    fill(store, 0, 3)
    fill(store, 1, 2)
    committed_at_revoke: list[dict[tuple[str, int], int]] = []
    revoked: list[TopicPartition] = []

    def on_revoke(tps: list[TopicPartition]) -> None:
        committed_at_revoke.append(store.committed_offsets(GROUP))
        revoked.extend(tps)

    with consumer_for(store, enable_auto_commit=True, auto_commit_interval_ms=1) as consumer:
        consumer.subscribe(["t"], on_revoke=on_revoke)
        poll_until(consumer, lambda got: len(got) >= 5)
        wait_for(lambda: {T0, T1} in owned_reports(store), "the assignment to be reported")
        time.sleep(0.01)  # let the 1 ms interval pass
        consumer.poll(timeout=0)
        assert store.committed_offsets(GROUP) == {("t", 0): 3, ("t", 1): 2}
        fill(store, 0, 1, first=3)
        poll_until(consumer, lambda got: len(got) >= 1)
        positions = {("t", 0): 4, ("t", 1): 2}
        store.join_member(GROUP, ["t"])  # takes one of the two
        poll_until(consumer, lambda _got: bool(committed_at_revoke))
        # Committed before on_revoke ran.
        (gone,) = revoked
        assert committed_at_revoke[0][(gone.topic, gone.partition)] == positions[
            (gone.topic, gone.partition)]
        (kept,) = {T0, T1} - {gone}
        fill(store, kept.partition, 1, first=positions[(kept.topic, kept.partition)])
        poll_until(consumer, lambda got: len(got) >= 1)
    # On close.
    assert store.committed_offsets(GROUP)[(kept.topic, kept.partition)] == positions[
        (kept.topic, kept.partition)] + 1


# ------------------------------------------------------------------ losing them


@pytest.mark.parametrize("with_on_lost", [True, False])
def test_lost_partitions_are_not_committed_and_the_member_joins_again(
        store: InProcessCluster, with_on_lost: bool) -> None:
    store.create_topic("t", 1)
    fill(store, 0, 3)
    events = Events()
    with consumer_for(store, enable_auto_commit=True, auto_commit_interval_ms=3_600_000,
                      session_timeout_ms=300) as consumer:
        member_id = joined(consumer, events, {T0}, lost=with_on_lost)
        poll_until(consumer, lambda _got: consumer.position(T0) >= 3)
        lose_session(store, member_id)
        # Records from here on are read again after the member joined again.
        again_read = poll_until(consumer, lambda _got: len(events.log) >= 2)
        # The member may already have joined again and been given T0 by the
        # poll that handed the loss over (a third event, checked below).
        assert events.log[:2] == [("assign", [T0]),
                                  ("lost" if with_on_lost else "revoke", [T0])]
        assert store.committed_offsets(GROUP) == {}  # auto-commit left them alone
        (again,) = store.wait_for_members(GROUP, 1, but_not=[member_id])
        rejoin = [hb for hb in store.calls_named("ConsumerGroupHeartbeat")
                  if hb.member_epoch == 0][-1]
        assert list(rejoin.owned_partitions) == []
        assert rejoin.member_id not in ("", member_id)
        assert again.member_id == rejoin.member_id
        again_read += poll_until(consumer, lambda got: len(again_read) + len(got) >= 3)
        # Nothing was committed: from the start.
        assert [r.offset for r in again_read] == [0, 1, 2]
        assert events.log[2:] == [("assign", [T0])]


def test_commit_after_the_partitions_were_lost_is_refused(store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    fill(store, 0, 2)
    events = Events()
    with consumer_for(store, session_timeout_ms=300) as consumer:
        member_id = joined(consumer, events, {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 2)
        lost_commit: list[BaseException] = []

        def on_lost(tps: list[TopicPartition]) -> None:
            try:
                consumer.commit({T0: 2})
            except errors.OncelogError as exc:
                lost_commit.append(exc)

        consumer.subscribe(["t"], on_lost=on_lost)
        lose_session(store, member_id)
        poll_until(consumer, lambda _got: bool(lost_commit))
        assert isinstance(lost_commit[0], errors.UnknownMemberIdError)
        assert store.committed_offsets(GROUP) == {}


def test_a_coordinator_that_moves_is_found_again_without_losing_partitions(
        store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    fill(store, 0, 1)
    events = Events()
    with consumer_for(store) as consumer:
        joined(consumer, events, {T0})
        finds = len(store.calls_named("FindCoordinator"))
        failures = iter([ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS])
        store.coordinator_fault = (
            lambda name, _req: next(failures, None) if name == "ConsumerGroupHeartbeat" else None)
        wait_for(lambda: len(store.calls_named("FindCoordinator")) >= finds + 2,
                 "the coordinator to be looked up again")
        beats = len(store.calls_named("ConsumerGroupHeartbeat"))
        wait_for(lambda: len(store.calls_named("ConsumerGroupHeartbeat")) >= beats + 2,
                 "heartbeats to go on")
        poll_until(consumer, lambda _got: consumer.position(T0) >= 1)
        assert events.log == [("assign", [T0])]


def test_fenced_instance_id_is_fatal(store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    events = Events()
    with consumer_for(store, group_instance_id="node-1") as consumer:
        joined(consumer, events, {T0})
        store.coordinator_fault = lambda name, req: (
            ErrorCode.FENCED_INSTANCE_ID
            if name == "ConsumerGroupHeartbeat" and req.member_epoch > 0 else None)
        with pytest.raises(errors.FencedInstanceIdError):
            poll_until(consumer, lambda _got: False)
        assert events.log == [("assign", [T0]), ("lost", [T0])]
        with pytest.raises(errors.FencedInstanceIdError):
            consumer.poll(timeout=0)


def test_a_failing_callback_is_raised_after_the_assignment_changed(
        store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    with consumer_for(store) as consumer:
        def on_assign(tps: list[TopicPartition]) -> None:
            raise RuntimeError("application bug")

        consumer.subscribe(["t"], on_assign=on_assign)
        with pytest.raises(RuntimeError, match="application bug"):
            poll_until(consumer, lambda _got: False)
        assert consumer.assignment() == {T0}
        wait_for(lambda: {T0} in owned_reports(store), "the assignment to be reported")


# ------------------------------------------------------------------ leaving


@pytest.mark.parametrize(("instance_id", "leave_epoch"), [(None, -1), ("node-1", -2)])
def test_close_revokes_and_leaves(store: InProcessCluster, instance_id: str | None,
                                  leave_epoch: int) -> None:
    store.create_topic("t", 1)
    events = Events()
    consumer = consumer_for(store, group_instance_id=instance_id)
    member_id = joined(consumer, events, {T0})
    consumer.close()
    assert events.log == [("assign", [T0]), ("revoke", [T0])]
    last = store.calls_named("ConsumerGroupHeartbeat")[-1]
    assert (last.member_id, last.member_epoch) == (member_id, leave_epoch)
    assert last.group_instance_id == (instance_id or "")
    members = store.members(GROUP)
    if instance_id is None:
        assert members == {}
    else:
        # A static member's slot is kept until its session times out.
        assert [m.left_temporarily for m in members.values()] == [True]


def test_unsubscribe_leaves_and_allows_assign(store: InProcessCluster) -> None:
    store.create_topic("t", 2)
    events = Events()
    with consumer_for(store) as consumer:
        joined(consumer, events, {T0, T1})
        consumer.unsubscribe()
        assert events.log[-1] == ("revoke", [T0, T1])
        assert store.members(GROUP) == {} and consumer.assignment() == set()
        consumer.assign([T1])
        assert consumer.group_metadata() == GroupMetadata(GROUP, -1, "")


# ------------------------------------------------------------------ transactions


def test_group_metadata_goes_into_the_transactional_offset_commit(
        store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    store.create_topic("out", 1)
    fill(store, 0, 2)
    with consumer_for(store, group_instance_id="node-3") as consumer, Producer(
            bootstrap=store.address, transactional_id="copier") as producer:
        joined(consumer, Events(), {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 2)
        wait_for(lambda: {T0} in owned_reports(store), "the assignment to be reported")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("out", value=b"out", partition=0)
        meta = consumer.group_metadata()
        producer.send_offsets_to_transaction({T0: consumer.position(T0)}, meta)
        producer.commit_transaction()
        (txn_commit,) = store.calls_named("TxnOffsetCommit")
        assert (txn_commit.member_id, txn_commit.generation_id, txn_commit.group_instance_id) == (
            meta.member_id, meta.generation_id, "node-3")
        assert consumer.committed([T0]) == {T0: 2}


# ------------------------------------------------------------------ bad usage


def test_bad_usage_fails_before_anything_is_sent(store: InProcessCluster) -> None:
    store.create_topic("t", 1)
    with pytest.raises(ValueError, match="group_id"):
        Consumer(bootstrap=store.address, group_id="")
    with pytest.raises(ValueError, match="needs a group_id"):
        Consumer(bootstrap=store.address, enable_auto_commit=True)
    with pytest.raises(ValueError, match="needs a group_id"):
        Consumer(bootstrap=store.address, group_instance_id="x")
    with Consumer(bootstrap=store.address) as no_group:
        for call in (lambda: no_group.subscribe(["t"]), lambda: no_group.commit({T0: 1}),
                     lambda: no_group.committed([T0]), no_group.group_metadata):
            with pytest.raises(errors.InvalidGroupIdError, match="group_id"):
                call()
    with consumer_for(store) as consumer:
        with pytest.raises(TypeError, match="list of topic names"):
            consumer.subscribe("t")
        with pytest.raises(ValueError, match="topic names"):
            consumer.subscribe(["t", ""])
        with pytest.raises(errors.IllegalStateError, match="assign\\(\\) or subscribe\\(\\)"):
            consumer.poll(timeout=0)
        consumer.assign([T0])
        with pytest.raises(errors.IllegalStateError, match="assigned partitions"):
            consumer.subscribe(["t"])
        consumer.unsubscribe()
        consumer.subscribe(["t"])
        with pytest.raises(errors.IllegalStateError, match="unsubscribe"):
            consumer.assign([T0])
    assert store.calls_named("OffsetCommit") == []


def test_a_cluster_without_a_group_coordinator_fails_poll_clearly() -> None:
    with InProcessCluster(group_coordinator=False) as bare, Consumer(
            bootstrap=bare.address, group_id=GROUP) as consumer:
        bare.create_topic("t", 1)
        consumer.subscribe(["t"])
        with pytest.raises(errors.CoordinatorNotAvailableError, match="no group coordinator"):
            poll_until(consumer, lambda _got: False)
