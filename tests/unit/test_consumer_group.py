"""The group consumer against a scripted group coordinator.

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

Method: tests/support/fake_store.FakeStore with its group side: the test
assigns partitions to members itself (set_assignment) and removes them
(remove_member); every RPC is recorded, so the tests read what the consumer
told the coordinator and when. Waits poll until a condition holds, with
generous bounds as failure guards only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from oncelog import Consumer, ConsumerRecord, GroupMetadata, Producer, TopicPartition, errors
from oncelog import records as codec
from oncelog.errors import ErrorCode
from tests.support.fake_store import FakeStore

GROUP = "g"
T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


@pytest.fixture
def store() -> Iterator[FakeStore]:
    with FakeStore(workers=8, group_coordinator=True) as s:
        s.create_topic("t", 3)
        yield s


def fill(store: FakeStore, partition: int, count: int, *, first: int = 0) -> None:
    store.append_raw("t", partition, codec.encode_batch(
        [(None, f"p{partition}-{first + i}".encode(), None, 100 + i) for i in range(count)]))


def consumer_for(store: FakeStore, **kwargs: object) -> Consumer:
    return Consumer(bootstrap=store.address, group_id=GROUP, fetch_max_wait_ms=20,
                    **kwargs)  # type: ignore[arg-type]


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


def joined(store: FakeStore, consumer: Consumer, events: Events,
           partitions: set[TopicPartition], *, lost: bool = True) -> str:
    """Subscribes, waits for the join, assigns `partitions`, and polls until
    on_assign ran; returns the member id (records already returned are in
    events.first_records)."""
    events.subscribe(consumer, lost=lost)
    (member,) = store.wait_for_members(GROUP, 1)
    store.set_assignment(GROUP, member.member_id, {(tp.topic, tp.partition) for tp in partitions})
    events.first_records = poll_until(consumer, lambda _got: consumer.assignment() == partitions)
    return member.member_id


def owned_reports(store: FakeStore) -> list[set[TopicPartition]]:
    return [{TopicPartition(p.topic, p.partition) for p in hb.owned_partitions}
            for hb in store.calls_named("ConsumerGroupHeartbeat") if hb.member_epoch > 0]


# ------------------------------------------------------------------ assignment


def test_assigned_partitions_start_at_the_committed_offset_and_callbacks_run_in_poll(
        store: FakeStore) -> None:
    store.committed_offsets[GROUP] = {("t", 0): 2}
    fill(store, 0, 4)
    fill(store, 1, 2)
    events = Events()
    with consumer_for(store) as consumer:
        events.subscribe(consumer)
        assert consumer.poll(timeout=0) == []  # nothing assigned yet: no error, no records
        (member,) = store.wait_for_members(GROUP, 1)
        join = store.calls_named("ConsumerGroupHeartbeat")[0]
        assert (join.member_epoch, list(join.subscribed_topics)) == (0, ["t"])
        assert join.member_id  # chosen by the member (KIP-1082)
        epoch = store.set_assignment(GROUP, member.member_id, {("t", 0), ("t", 1)})
        got = poll_until(consumer, lambda got: len(got) >= 4)
        assert sorted((r.partition, r.offset) for r in got) == [(0, 2), (0, 3), (1, 0), (1, 1)]
        assert events.log == [("assign", [T0, T1])]
        assert events.threads == {threading.get_ident()}
        assert consumer.assignment() == {T0, T1}
        assert consumer.group_metadata() == GroupMetadata(GROUP, epoch, member.member_id)
        # The coordinator was asked for stable offsets.
        assert all(f.require_stable for f in store.calls_named("OffsetFetch"))
        wait_for(lambda: {T0, T1} in owned_reports(store), "the assignment to be reported")


def test_revocation_is_acknowledged_only_after_on_revoke_and_nothing_of_it_comes_after(
        store: FakeStore) -> None:
    fill(store, 0, 3)
    fill(store, 1, 3)
    events = Events()
    seen_at_revoke: list[list[set[TopicPartition]]] = []
    with consumer_for(store, max_poll_records=1) as consumer:
        member_id = joined(store, consumer, events, {T0, T1})

        def on_revoke(tps: list[TopicPartition]) -> None:
            seen_at_revoke.append(owned_reports(store))
            consumer.commit()  # still the owner: the commit is accepted
            events.log.append(("revoke", tps))

        consumer.subscribe(["t"], on_assign=events.callback("assign"), on_revoke=on_revoke)
        poll_until(consumer, lambda got: len(got) >= 2)  # data of both is buffered now
        store.set_assignment(GROUP, member_id, {("t", 1)})
        after: list[ConsumerRecord] = []
        for _ in range(600):
            got = consumer.poll(timeout=0.05)
            if ("revoke", [T0]) in events.log:
                after += got  # returned by the poll that ran on_revoke
                break
        assert consumer.assignment() == {T1}
        # Records returned by the poll that ran on_revoke, and every later
        # one, are of T1 only.
        fill(store, 0, 3, first=3)
        fill(store, 1, 3, first=3)
        after += poll_until(consumer, lambda _got: consumer.position(T1) >= 6)
        assert {r.partition for r in after} == {1}
        # Once reported as owned, T0 stayed in every heartbeat until
        # on_revoke ran; one soon after left it out.
        reports = seen_at_revoke[0]
        first = next(i for i, owned in enumerate(reports) if T0 in owned)
        assert all(T0 in owned for owned in reports[first:])
        wait_for(lambda: owned_reports(store)[-1] == {T1}, "the revocation to be reported")
        # on_revoke's commit() was taken.
        assert ("t", 0) in store.committed_offsets[GROUP]


# ------------------------------------------------------------------ commits


def test_commit_committed_and_their_checks(store: FakeStore) -> None:
    fill(store, 0, 5)
    with consumer_for(store) as consumer:
        member_id = joined(store, consumer, Events(), {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 5)
        wait_for(lambda: {T0} in owned_reports(store), "the assignment to be reported")
        consumer.commit()
        request = store.calls_named("OffsetCommit")[-1]
        assert (request.member_id, request.generation_id) == (
            member_id, consumer.group_metadata().generation_id)
        assert store.committed_offsets[GROUP] == {("t", 0): 5}
        consumer.commit({T0: 3})
        assert consumer.committed([T0, T2]) == {T0: 3, T2: None}
        # A partition this member does not own: refused, nothing stored.
        with pytest.raises(errors.StaleMemberEpochError, match="t-2"):
            consumer.commit({T0: 4, T2: 1})
        with pytest.raises(ValueError, match="must be an int >= 0"):
            consumer.commit({T0: -1})
        assert store.committed_offsets[GROUP] == {("t", 0): 3}


def test_seek_to_committed_rewinds_every_assigned_partition(store: FakeStore) -> None:
    store.committed_offsets[GROUP] = {("t", 0): 1}
    fill(store, 0, 4)
    with consumer_for(store) as consumer:
        events = Events()
        joined(store, consumer, events, {T0, T1})
        first = events.first_records + poll_until(
            consumer, lambda _got: consumer.position(T0) >= 4)
        assert [r.offset for r in first] == [1, 2, 3]
        assert consumer.seek_to_committed() == {T0: 1, T1: None}
        assert consumer.position(T0) == 1
        again = poll_until(consumer, lambda got: len(got) >= 3)
        assert [r.offset for r in again] == [1, 2, 3]


def test_an_assigned_partition_waits_for_a_pending_transactional_offset(
        store: FakeStore) -> None:
    store.committed_offsets[GROUP] = {("t", 0): 1}
    store.pending_offsets[(GROUP, 77)] = {("t", 0): 3}
    fill(store, 0, 5)
    with consumer_for(store) as consumer:
        joined(store, consumer, Events(), {T0})
        # While the offset is pending, nothing of T0 is read (neither from
        # the old committed offset nor from auto_offset_reset).
        for _ in range(5):
            assert consumer.poll(timeout=0.02) == []
        fetches_before = len(store.calls_named("OffsetFetch"))
        assert fetches_before >= 2  # asked again while unstable
        with store.lock:  # the transaction commits: its marker lands
            del store.pending_offsets[(GROUP, 77)]
            store.committed_offsets[GROUP][("t", 0)] = 3
        got = poll_until(consumer, lambda got: len(got) >= 2)
        assert [r.offset for r in got] == [3, 4]


def test_auto_commit_on_the_interval_before_revocation_and_on_close(store: FakeStore) -> None:
    fill(store, 0, 3)
    fill(store, 1, 2)
    committed_at_revoke: list[dict[tuple[str, int], int]] = []
    with consumer_for(store, enable_auto_commit=True, auto_commit_interval_ms=1) as consumer:
        consumer.subscribe(["t"], on_revoke=lambda _tps: committed_at_revoke.append(
            dict(store.committed_offsets.get(GROUP, {}))))
        (member,) = store.wait_for_members(GROUP, 1)
        store.set_assignment(GROUP, member.member_id, {("t", 0), ("t", 1)})
        poll_until(consumer, lambda got: len(got) >= 5)
        wait_for(lambda: {T0, T1} in owned_reports(store), "the assignment to be reported")
        time.sleep(0.01)  # let the 1 ms interval pass
        consumer.poll(timeout=0)
        assert store.committed_offsets[GROUP] == {("t", 0): 3, ("t", 1): 2}
        fill(store, 0, 1, first=3)
        poll_until(consumer, lambda got: len(got) >= 1)
        store.set_assignment(GROUP, member.member_id, {("t", 1)})
        poll_until(consumer, lambda _got: bool(committed_at_revoke))
        # Committed before on_revoke ran.
        assert committed_at_revoke[0][("t", 0)] == 4
        fill(store, 1, 1, first=2)
        poll_until(consumer, lambda got: len(got) >= 1)
    assert store.committed_offsets[GROUP][("t", 1)] == 3  # on close


# ------------------------------------------------------------------ losing them


@pytest.mark.parametrize("with_on_lost", [True, False])
def test_lost_partitions_are_not_committed_and_the_member_joins_again(
        store: FakeStore, with_on_lost: bool) -> None:
    fill(store, 0, 3)
    events = Events()
    with consumer_for(store, enable_auto_commit=True, auto_commit_interval_ms=3_600_000
                      ) as consumer:
        member_id = joined(store, consumer, events, {T0}, lost=with_on_lost)
        poll_until(consumer, lambda _got: consumer.position(T0) >= 3)
        store.remove_member(GROUP, member_id)  # its session timed out
        poll_until(consumer, lambda _got: len(events.log) >= 2)
        assert events.log == [("assign", [T0]), ("lost" if with_on_lost else "revoke", [T0])]
        assert consumer.assignment() == set()
        assert GROUP not in store.committed_offsets  # auto-commit left them alone
        (again,) = store.wait_for_members(GROUP, 1)
        assert again.member_id != member_id
        rejoin = [hb for hb in store.calls_named("ConsumerGroupHeartbeat")
                  if hb.member_epoch == 0][-1]
        assert list(rejoin.owned_partitions) == []
        assert rejoin.member_id not in ("", member_id)
        store.set_assignment(GROUP, again.member_id, {("t", 0)})
        got = poll_until(consumer, lambda got: len(got) >= 3)
        assert [r.offset for r in got] == [0, 1, 2]  # nothing was committed: from the start
        assert events.log[-1] == ("assign", [T0])


def test_commit_after_the_partitions_were_lost_is_refused(store: FakeStore) -> None:
    fill(store, 0, 2)
    events = Events()
    with consumer_for(store, session_timeout_ms=60_000) as consumer:
        member_id = joined(store, consumer, events, {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 2)
        lost_commit: list[BaseException] = []

        def on_lost(tps: list[TopicPartition]) -> None:
            try:
                consumer.commit({T0: 2})
            except errors.OncelogError as exc:
                lost_commit.append(exc)

        consumer.subscribe(["t"], on_lost=on_lost)
        store.remove_member(GROUP, member_id)
        poll_until(consumer, lambda _got: bool(lost_commit))
        assert isinstance(lost_commit[0], errors.UnknownMemberIdError)
        assert GROUP not in store.committed_offsets


def test_a_coordinator_that_moves_is_found_again_without_losing_partitions(
        store: FakeStore) -> None:
    fill(store, 0, 1)
    events = Events()
    with consumer_for(store) as consumer:
        joined(store, consumer, events, {T0})
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


def test_fenced_instance_id_is_fatal(store: FakeStore) -> None:
    events = Events()
    with consumer_for(store, group_instance_id="node-1") as consumer:
        joined(store, consumer, events, {T0})
        store.coordinator_fault = lambda name, req: (
            ErrorCode.FENCED_INSTANCE_ID
            if name == "ConsumerGroupHeartbeat" and req.member_epoch > 0 else None)
        with pytest.raises(errors.FencedInstanceIdError):
            poll_until(consumer, lambda _got: False)
        assert events.log == [("assign", [T0]), ("lost", [T0])]
        with pytest.raises(errors.FencedInstanceIdError):
            consumer.poll(timeout=0)


def test_a_failing_callback_is_raised_after_the_assignment_changed(store: FakeStore) -> None:
    with consumer_for(store) as consumer:
        def on_assign(tps: list[TopicPartition]) -> None:
            raise RuntimeError("application bug")

        consumer.subscribe(["t"], on_assign=on_assign)
        (member,) = store.wait_for_members(GROUP, 1)
        store.set_assignment(GROUP, member.member_id, {("t", 2)})
        with pytest.raises(RuntimeError, match="application bug"):
            poll_until(consumer, lambda _got: False)
        assert consumer.assignment() == {T2}
        wait_for(lambda: {T2} in owned_reports(store), "the assignment to be reported")


# ------------------------------------------------------------------ leaving


@pytest.mark.parametrize(("instance_id", "leave_epoch"), [(None, -1), ("node-1", -2)])
def test_close_revokes_and_leaves(store: FakeStore, instance_id: str | None,
                                  leave_epoch: int) -> None:
    events = Events()
    consumer = consumer_for(store, group_instance_id=instance_id)
    member_id = joined(store, consumer, events, {T0})
    consumer.close()
    assert events.log == [("assign", [T0]), ("revoke", [T0])]
    last = store.calls_named("ConsumerGroupHeartbeat")[-1]
    assert (last.member_id, last.member_epoch) == (member_id, leave_epoch)
    assert last.group_instance_id == (instance_id or "")
    assert store.members(GROUP) == {}


def test_unsubscribe_leaves_and_allows_assign(store: FakeStore) -> None:
    events = Events()
    with consumer_for(store) as consumer:
        joined(store, consumer, events, {T0})
        consumer.unsubscribe()
        assert events.log[-1] == ("revoke", [T0])
        assert store.members(GROUP) == {} and consumer.assignment() == set()
        consumer.assign([T1])
        assert consumer.group_metadata() == GroupMetadata(GROUP, -1, "")


# ------------------------------------------------------------------ transactions


def test_group_metadata_goes_into_the_transactional_offset_commit(store: FakeStore) -> None:
    fill(store, 0, 2)
    with consumer_for(store, group_instance_id="node-3") as consumer, Producer(
            bootstrap=store.address, transactional_id="copier") as producer:
        joined(store, consumer, Events(), {T0})
        poll_until(consumer, lambda _got: consumer.position(T0) >= 2)
        wait_for(lambda: {T0} in owned_reports(store), "the assignment to be reported")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"out", partition=2)
        meta = consumer.group_metadata()
        producer.send_offsets_to_transaction({T0: consumer.position(T0)}, meta)
        producer.commit_transaction()
        (txn_commit,) = store.calls_named("TxnOffsetCommit")
        assert (txn_commit.member_id, txn_commit.generation_id, txn_commit.group_instance_id) == (
            meta.member_id, meta.generation_id, "node-3")
        assert consumer.committed([T0]) == {T0: 2}


# ------------------------------------------------------------------ bad usage


def test_bad_usage_fails_before_anything_is_sent(store: FakeStore) -> None:
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
    with FakeStore(group_coordinator=False) as bare, Consumer(
            bootstrap=bare.address, group_id=GROUP) as consumer:
        bare.create_topic("t", 1)
        consumer.subscribe(["t"])
        with pytest.raises(errors.CoordinatorNotAvailableError, match="no group coordinator"):
            poll_until(consumer, lambda _got: False)
