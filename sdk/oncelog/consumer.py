"""The consumer: manual assignment (`assign`) or a consumer group (`subscribe`).

`poll()` fetches from every store node that owns assigned partitions in
parallel (one Fetch in flight per node, long-polling up to fetch_max_wait_ms),
keeps what it fetched as encoded batches, and decodes records only as it hands
them out, at most max_poll_records per call; the rest stays buffered for the
next poll. A partition is fetched again from where its buffer ends once less
than max_partition_fetch_bytes of it is left unread (ahead, so the next
records arrive while these are handed out; `_fetcher`); after the buffer is
used up the position moves to the store's `next_fetch_offset`, past batches
the store filtered out (aborted transactions, control batches), so a
read_committed consumer never stalls on them. Fetches stay in flight between
polls, so poll(timeout=0) picks up their answers later.

In a group (`subscribe`), a background thread heartbeats to the group's
coordinator (`_group.HeartbeatThread`), which assigns the partitions; the
assignment is applied here, in the application's thread, inside poll():
partitions lost first (on_lost, no commit), then revoked ones (auto-commit,
on_revoke, then forgotten), then new ones (on_assign; they start at the
group's committed offset, fetched with OffsetFetch(require_stable)). The
state machine in `_membership` decides what to apply and when.

`key_deserializer`/`value_deserializer` turn each record's key and value
bytes into what poll() returns, as records are handed out; a record one of
them fails on stops its partition there (errors.DeserializationError) until
the application seeks past it.

Timeouts mean what they say: poll(timeout) returns within its timeout (a
call it must make first gets at least POLL_CALL_MIN_MS), and every other
blocking method within its `timeout` argument or default_api_timeout_ms
(Kafka's default.api.timeout.ms), connecting included; a cluster that does
not answer makes them raise KafkaTimeoutError naming the addresses, or makes
poll() return nothing and log that once.

Not thread-safe, like Kafka's consumer: use one consumer from one thread.

This class is the facade: it checks arguments, runs poll()'s loop and the
group's side (with `_group` and `_membership`), and leaves the assignment
and positions to `_subscription.SubscriptionState` and the fetching,
decoding and ListOffsets to `_fetcher.Fetcher`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TypeVar

from oncelog._client import ClusterClient, remaining_ms
from oncelog._config import DEFAULT_CLIENT_ID
from oncelog._fetcher import Fetcher
from oncelog._group import (
    GroupClient,
    HeartbeatThread,
    PendingOffsetFetch,
    check_offsets,
    now_ms,
    partition_names,
    unstable_offset_backoff_ms,
)
from oncelog._keywords import kafka_names
from oncelog._membership import GroupMembership, MemberState, Plan
from oncelog._security import PLAINTEXT, TokenProvider

# The reset policies' names stay importable from here, where they were defined.
from oncelog._subscription import COMMITTED, SubscriptionState
from oncelog._subscription import EARLIEST as EARLIEST
from oncelog._subscription import LATEST as LATEST
from oncelog._subscription import NONE as NONE
from oncelog.config_def import CONSUMER, validate
from oncelog.serializers import Deserializer
from oncelog.types import (
    ConsumerRecord,
    GroupMetadata,
    OffsetAndTimestamp,
    PartitionRecords,
    ThrottleTime,
    TopicPartition,
)
from oncelog.v1 import records_pb2
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.vocabulary import IsolationLevel, OffsetReset

log = logging.getLogger("oncelog.consumer")
# What a poll hands out: ConsumerRecord (poll) or PartitionRecords (poll_columns).
_Out = TypeVar("_Out")

_ISOLATION = {
    IsolationLevel.READ_COMMITTED: records_pb2.IsolationLevel.READ_COMMITTED,
    IsolationLevel.READ_UNCOMMITTED: records_pb2.IsolationLevel.READ_UNCOMMITTED,
}
# Revoke, then assign, then perhaps a fence that came meanwhile: the plans one
# poll() applies at most before it goes on reading.
MAX_PLANS_PER_POLL = 4
# What poll() must ask before it can fetch (metadata, a position reset's
# ListOffsets, finding the group's coordinator, an auto-commit) gets at least
# this long together, even from poll(timeout=0): a shorter deadline could
# never be met, and the consumer would never start. It stays inside the
# margin poll's timeout allows (the larger of 10 % and 200 ms).
POLL_CALL_MIN_MS = 150

# on_assign / on_revoke / on_lost: called with the partitions, sorted.
RebalanceCallback = Callable[[list[TopicPartition]], None]


@kafka_names
class Consumer:
    """Reads records from assigned partitions, or from the partitions a
    consumer group assigns (subscribe)."""

    def __init__(
        self,
        *,
        bootstrap: str,
        group_id: str | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = EARLIEST,
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: int = 5_000,
        max_poll_records: int = 500,
        session_timeout_ms: int = 10_000,
        group_instance_id: str | None = None,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        default_api_timeout_ms: int = 60_000,
        check_crcs: bool = True,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        security_protocol: str = PLAINTEXT,
        ssl_cafile: str | os.PathLike[str] | None = None,
        ssl_certfile: str | os.PathLike[str] | None = None,
        ssl_keyfile: str | os.PathLike[str] | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: TokenProvider | None = None,
        client_id: str = DEFAULT_CLIENT_ID,
    ) -> None:
        """Options as Kafka's consumer has them (in Python spelling); a wrong
        one is a ValueError naming it.

        `client_id` (Kafka's client.id): this consumer's name in the
        stores' quotas, with its principal. A store that answers a Fetch
        with a throttle time (its quota is exceeded) is not fetched from
        again until it has passed; `fetch_throttle_time` sums what they
        answered.

        `security_protocol`, `ssl_*` and `sasl_*` (kafka-python's names):
        how to connect to a secured cluster (oncelog._security).

        `key_deserializer`/`value_deserializer` (kafka-python's hooks):
        callables that turn a fetched record's key and value bytes into what
        poll() returns; a None key or value is not passed to them
        (oncelog.serializers has ready ones)."""
        # Every option checked against the table (oncelog.config_def), and
        # what ties them together (a group for auto-commit, the security settings).
        options = validate(CONSUMER, {
            "bootstrap": bootstrap, "group_id": group_id, "isolation_level": isolation_level,
            "auto_offset_reset": auto_offset_reset, "enable_auto_commit": enable_auto_commit,
            "auto_commit_interval_ms": auto_commit_interval_ms,
            "max_poll_records": max_poll_records, "session_timeout_ms": session_timeout_ms,
            "group_instance_id": group_instance_id, "fetch_max_wait_ms": fetch_max_wait_ms,
            "fetch_min_bytes": fetch_min_bytes, "fetch_max_bytes": fetch_max_bytes,
            "max_partition_fetch_bytes": max_partition_fetch_bytes,
            "request_timeout_ms": request_timeout_ms, "retry_backoff_ms": retry_backoff_ms,
            "retry_backoff_max_ms": retry_backoff_max_ms,
            "default_api_timeout_ms": default_api_timeout_ms, "check_crcs": check_crcs,
            "key_deserializer": key_deserializer, "value_deserializer": value_deserializer,
            "security_protocol": security_protocol, "ssl_cafile": ssl_cafile,
            "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile,
            "sasl_mechanism": sasl_mechanism,
            "sasl_oauth_token_provider": sasl_oauth_token_provider, "client_id": client_id,
        })
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.isolation_level = IsolationLevel(isolation_level)
        self.auto_offset_reset = OffsetReset(auto_offset_reset)
        self.session_timeout_ms = session_timeout_ms
        self._max_poll_records = max_poll_records
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._default_api_timeout_ms = default_api_timeout_ms
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            security=options.security,
        )
        # Fetch answers arrive on gRPC threads and membership news on the
        # heartbeat thread; poll() waits on this. The lock also guards the
        # membership, which both threads use.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # The assigned partitions and their positions; the fetcher reads them.
        self._subscription = SubscriptionState(
            auto_offset_reset=self.auto_offset_reset, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
        )
        self._fetcher = Fetcher(
            self._client, self._subscription, wake=self._wake, client_id=client_id,
            isolation=_ISOLATION[self.isolation_level], fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_min_bytes=fetch_min_bytes, fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms, check_crcs=check_crcs,
            key_deserializer=key_deserializer, value_deserializer=value_deserializer,
        )
        # The OffsetFetch poll() sent for partitions a group assigned, until
        # a later poll() takes its answer.
        self._offset_fetch: PendingOffsetFetch | None = None
        self._closed = False
        # The group's offsets (with a group_id); the membership and its
        # heartbeat thread once subscribe() is called.
        self._group = None if group_id is None else GroupClient(self._client, group_id)
        self._membership: GroupMembership | None = None
        self._heartbeat: HeartbeatThread | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._next_auto_commit_s = time.monotonic() + auto_commit_interval_ms / 1000

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Reads exactly these partitions from now on (replacing any earlier
        assignment). A newly assigned partition starts per auto_offset_reset
        unless seek() says otherwise; kept ones keep their positions."""
        self._check_open()
        if self._subscription.subscribed:
            raise errors.IllegalStateError(
                "assign() on a consumer subscribed to group "
                f"{self.group_id!r}; call unsubscribe() first"
            )
        wanted: list[TopicPartition] = []
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartition values, got {tp!r}")
            if tp.partition < 0:
                raise ValueError(f"partition must be >= 0, got {tp}")
            if tp not in wanted:
                wanted.append(tp)
        self._subscription.assign(wanted)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now (in a group: those it owns)."""
        return set(self._subscription.partitions())

    # ------------------------------------------------------------ groups

    def subscribe(
        self,
        topics: Iterable[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Joins the consumer group `group_id` for these topics (replacing an
        earlier subscription); the group's coordinator assigns the partitions.
        Nothing is read until poll(), which also applies assignment changes
        and calls the callbacks, with the partitions, in this thread:

        * on_revoke — before the partitions go to another member: commit
          what was processed here (auto-commit has already run when enabled);
        * on_assign — after new partitions are taken on, before their first
          records; they start at the group's committed offset unless the
          callback seek()s;
        * on_lost — the member was removed (session timeout, fenced) and the
          partitions may already be another member's: do not commit them.
          Without on_lost, on_revoke is called instead (commit() raises then).
        """
        self._check_open()
        group = self._require_group("subscribe")
        if isinstance(topics, str):
            raise TypeError(f"subscribe() takes a list of topic names, got the str {topics!r}")
        names: list[str] = []
        for topic in topics:
            if not isinstance(topic, str) or not topic:
                raise ValueError(f"topic names must be non-empty str, got {topic!r}")
            if topic not in names:
                names.append(topic)
        if not names:
            self.unsubscribe()
            return
        if not self._subscription.subscribed and self._subscription.has_partitions:
            raise errors.IllegalStateError(
                "subscribe() on a consumer with assigned partitions; call assign([]) or "
                "unsubscribe() first"
            )
        for name, callback in (("on_assign", on_assign), ("on_revoke", on_revoke),
                               ("on_lost", on_lost)):
            if callback is not None and not callable(callback):
                raise TypeError(f"{name} must be callable, got {callback!r}")
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        topics = self._subscription.topics = tuple(sorted(names))
        with self._lock:
            if self._membership is None or self._heartbeat is None:
                self._membership = GroupMembership(
                    group.group_id, session_timeout_ms=self.session_timeout_ms,
                    group_instance_id=self.group_instance_id,
                )
                self._heartbeat = HeartbeatThread(
                    group, self._membership, self._lock, self._changed.notify_all,
                    request_timeout_ms=self._request_timeout_ms,
                )
            self._membership.subscribe(topics, now_ms())
            self._heartbeat.wake()

    def subscription(self) -> set[str]:
        """The topics subscribed to (empty without subscribe())."""
        return set(self._subscription.topics or ())

    def unsubscribe(self) -> None:
        """Leaves the group (after on_revoke and auto-commit for the partitions
        it owns), or, with assign(), drops the assignment."""
        self._check_open()
        if not self._subscription.subscribed:
            self._subscription.clear()
            return
        self._leave_group(self._request_timeout_ms / 1000)
        self._subscription.topics = None

    def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, *,
        timeout: float | None = None,
    ) -> None:
        """Commits offsets for the group, synchronously: `offsets` (each the
        next offset to read), or the position of every partition read now;
        within `timeout` seconds (default default_api_timeout_ms).

        In a group, only partitions this member owns can be committed (the
        coordinator answers StaleMemberEpochError for others), and a member
        that lost its partitions gets UnknownMemberIdError. With assign(),
        the commit is accepted only while the group has no members."""
        self._check_open()
        group = self._require_group("commit")
        wanted = self._subscription.positions() if offsets is None else check_offsets(offsets)
        if not wanted:
            return
        generation_id, member_id = self._commit_identity()
        group.commit(wanted, generation_id=generation_id, member_id=member_id,
                     budget_ms=self._budget_ms(timeout))

    def committed(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing
        committed). Waits while a transactional offset is pending (its
        transaction not yet ended), so the answer is a stable one; raises
        KafkaTimeoutError after `timeout` seconds (default
        default_api_timeout_ms)."""
        self._check_open()
        group = self._require_group("committed")
        tps = _check_partitions(partitions)
        if not tps:
            return {}
        found = group.fetch(tps, budget_ms=self._budget_ms(timeout))
        return {tp: None if found.get(tp, -1) < 0 else found[tp] for tp in tps}

    def _budget_ms(self, timeout: float | None) -> int:
        """A blocking method's budget: its `timeout` (seconds), else
        default_api_timeout_ms, as Kafka's consumer does for calls given none."""
        if timeout is None:
            return self._default_api_timeout_ms
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
        return int(timeout * 1000)

    def seek_to_committed(
        self, partitions: Iterable[TopicPartition] | None = None, *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int | None]:
        """Moves every assigned partition (or those given) back to the group's
        committed offset, dropping what was fetched beyond it: after
        abort_transaction(), the records of the aborted transaction's input
        are read again. A partition without a committed offset starts over
        per auto_offset_reset. Returns the committed offsets (None: none)."""
        self._check_open()
        subscription = self._subscription
        tps = subscription.partitions() if partitions is None else _check_partitions(partitions)
        for tp in tps:
            subscription.state(tp)
        found = self.committed(tps, timeout=timeout)
        for tp, offset in found.items():
            st = subscription.get(tp)
            if st is None:
                continue  # revoked by a callback meanwhile
            st.clear_buffer()
            st.position = offset
            st.reset = None if offset is not None else subscription.default_reset()
        return found

    def group_metadata(self) -> GroupMetadata:
        """The member's group id, generation (member epoch) and member id, for
        Producer.send_offsets_to_transaction: the coordinator accepts those
        offsets only while this member owns the partitions. With assign():
        generation -1 and no member id (accepted while the group has no
        members)."""
        self._check_open()
        group = self._require_group("group_metadata")
        m = self._membership
        if not self._subscription.subscribed or m is None:
            return GroupMetadata(group.group_id, -1, "", self.group_instance_id)
        with self._lock:
            return GroupMetadata(group.group_id, m.member_epoch, m.member_id,
                                 self.group_instance_id)

    def _require_group(self, method: str) -> GroupClient:
        if self._group is None:
            raise errors.error_for(
                ErrorCode.INVALID_GROUP_ID,
                f"{method}() needs a consumer group: pass group_id=... to Consumer()",
            )
        return self._group

    def _commit_identity(self) -> tuple[int, str]:
        """generation_id and member_id for OffsetCommit."""
        m = self._membership
        if not self._subscription.subscribed or m is None:
            return -1, ""
        with self._lock:
            if m.state in (MemberState.RECONCILING, MemberState.STABLE):
                return m.member_epoch, m.member_id
            state = m.state.value
        raise errors.error_for(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"not a member of group {self.group_id!r} right now ({state}): the partitions "
            f"were lost or not assigned yet, and their offsets cannot be committed",
        )

    def _group_step(self, deadline_s: float) -> None:
        """Applies what the membership asks for (lost, revoked, assigned
        partitions), raises its fatal error, and auto-commits when due; its
        commits end by deadline_s."""
        m = self._membership
        if m is None:
            return
        for _ in range(MAX_PLANS_PER_POLL):
            with self._lock:
                m.check_session(now_ms())
                plan = m.plan()
            if plan is None:
                break
            self._apply_plan(plan, deadline_s)
        with self._lock:
            fatal = m.error if m.state is MemberState.FATAL else None
        if fatal is not None:
            raise errors.error_for(
                fatal.code, f"consumer group {self.group_id!r}: {fatal.message or fatal.code.name}"
            ) from fatal
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit_s:
            self._auto_commit(self._subscription.partitions(), deadline_s)

    def _apply_plan(self, plan: Plan, deadline_s: float) -> None:
        """Runs one plan in the application's thread, then tells the heartbeat
        thread, which reports it to the coordinator at once. A callback that
        raises does not stop the plan; its exception is raised afterwards.
        The auto-commit of revoked partitions ends by deadline_s."""
        failure: BaseException | None = None
        if self._offset_fetch is not None:
            # Asked before this change of ownership: a commit made since
            # (the revocation's) would not be in its answer.
            self._offset_fetch.cancel()
            self._offset_fetch = None
        if plan.lost:
            with self._lock:
                reason = self._membership.error if self._membership is not None else None
            log.warning("group %r: partitions lost (%s): %s", self.group_id, reason,
                        partition_names(plan.lost))
            failure = self._run_callback(self._on_lost or self._on_revoke, plan.lost)
            self._subscription.forget(plan.lost)
        if plan.revoke:
            if self.enable_auto_commit:
                self._auto_commit(sorted(plan.revoke), deadline_s)
            failure = self._run_callback(self._on_revoke, plan.revoke) or failure
            self._subscription.forget(plan.revoke)
        if plan.assign:
            for tp in plan.assign:
                self._subscription.assign_from_group(tp)
            failure = self._run_callback(self._on_assign, plan.assign) or failure
        with self._lock:
            if self._membership is not None:
                self._membership.applied(plan, now_ms())
            if self._heartbeat is not None:
                self._heartbeat.wake()
        if failure is not None:
            raise failure

    @staticmethod
    def _run_callback(callback: RebalanceCallback | None,
                      partitions: frozenset[TopicPartition]) -> BaseException | None:
        if callback is None:
            return None
        try:
            callback(sorted(partitions))
        except Exception as exc:  # raised from poll() once the plan is applied
            log.error("rebalance callback %r failed: %r", callback, exc)
            return exc
        return None

    def _auto_commit(self, partitions: list[TopicPartition], deadline_s: float) -> None:
        """Commits the positions of `partitions` (what earlier polls returned
        has been processed once the application polls again), by deadline_s.
        A failure is logged, not raised, as Kafka's auto-commit does."""
        self._next_auto_commit_s = time.monotonic() + self.auto_commit_interval_ms / 1000
        positions = self._subscription.positions(partitions)
        if not positions:
            return
        try:
            self.commit(positions, timeout=remaining_ms(deadline_s) / 1000)
        except OncelogError as exc:
            log.warning("group %r: auto-commit of %s failed: %s", self.group_id,
                        partition_names(positions), exc)

    def _leave_group(self, timeout_s: float) -> None:
        """Revokes what the member owns (auto-commit, on_revoke), then sends
        the leave heartbeat and waits up to timeout_s for it."""
        m = self._membership
        if m is None:
            return
        with self._lock:
            owned = m.owned if m.state in (MemberState.RECONCILING, MemberState.STABLE) else None
        failure: BaseException | None = None
        deadline_s = time.monotonic() + timeout_s
        if owned:
            try:
                self._apply_plan(Plan(lost=frozenset(), revoke=owned, assign=frozenset()),
                                 deadline_s)
            except Exception as exc:  # still leave; raised below
                failure = exc
        self._subscription.clear()
        with self._lock:
            m.leave(now_ms())
            if self._heartbeat is not None:
                self._heartbeat.wake()
            while m.state is MemberState.LEAVING and time.monotonic() < deadline_s:
                self._changed.wait(deadline_s - time.monotonic())
            if m.state is not MemberState.UNSUBSCRIBED:
                log.warning("group %r: the leave heartbeat got no answer within %.1f s",
                            self.group_id, timeout_s)
                m.close()
        if failure is not None:
            raise failure

    def partitions_for_topic(self, topic: str, *, timeout: float | None = None) -> set[int]:
        """The topic's partition numbers; raises UnknownTopicOrPartitionError,
        or KafkaTimeoutError after `timeout` seconds (default
        default_api_timeout_ms)."""
        self._check_open()
        info = self._client.call(
            "Metadata",
            lambda timeout_s: self._client.topic(topic, timeout_ms=int(timeout_s * 1000)),
            timeout_ms=self._budget_ms(timeout),
        )
        return set(range(info.num_partitions))

    # ------------------------------------------------------------ positions

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll() returns records of `partition` from `offset` on."""
        self._check_open()
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        self._subscription.seek(partition, offset)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Moves to the earliest offset (resolved lazily, at the next poll() or position())."""
        self._check_open()
        self._subscription.seek_to(partitions, EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Moves to the end: the last stable offset under read_committed, the
        high watermark under read_uncommitted (resolved lazily)."""
        self._check_open()
        self._subscription.seek_to(partitions, LATEST)

    def position(self, partition: TopicPartition, *, timeout: float | None = None) -> int:
        """The offset of the next record poll() will return for the partition;
        raises KafkaTimeoutError when it cannot be found within `timeout`
        seconds (default default_api_timeout_ms)."""
        self._check_open()
        st = self._subscription.state(partition)
        if st.position is None:
            deadline_s = time.monotonic() + self._budget_ms(timeout) / 1000
            self._resolve_positions([partition], deadline_s=deadline_s, raise_errors=True)
        if st.position is None:  # pragma: no cover - _resolve_positions raised
            raise errors.KafkaTimeoutError(f"no position for {partition}")
        return st.position

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The earliest offset still in each partition's log; KafkaTimeoutError
        after `timeout` seconds (default default_api_timeout_ms)."""
        answers = self._list_offsets({tp: -2 for tp in partitions},
                                     budget_ms=self._budget_ms(timeout))
        return {tp: offset for tp, (offset, _ts) in answers.items()}

    def end_offsets(
        self, partitions: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The end of each partition for this consumer: the last stable offset
        under read_committed, the high watermark under read_uncommitted;
        KafkaTimeoutError after `timeout` seconds (default
        default_api_timeout_ms)."""
        answers = self._list_offsets({tp: -1 for tp in partitions},
                                     budget_ms=self._budget_ms(timeout))
        return {tp: offset for tp, (offset, _ts) in answers.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], *, timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose record timestamp is at or after
        the given one (milliseconds), or None when there is none;
        KafkaTimeoutError after `timeout` seconds (default
        default_api_timeout_ms)."""
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        answers = self._list_offsets(dict(timestamps), budget_ms=self._budget_ms(timeout))
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, ts)
            for tp, (offset, ts) in answers.items()
        }

    def _list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        budget_ms: int,
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The fetcher's list_offsets, on an open consumer."""
        self._check_open()
        return self._fetcher.list_offsets(timestamps, budget_ms=budget_ms)

    def _resolve_positions(
        self, tps: list[TopicPartition], *, deadline_s: float, raise_errors: bool
    ) -> None:
        """Sets the position of partitions waiting for a reset (earliest or
        latest) or for the group's committed offset, by deadline_s. With
        raise_errors False (poll), a failure leaves them unresolved, to be
        tried again on a later poll (after a backoff), and the committed
        offsets are asked without waiting for the answer."""
        now_s = time.monotonic()
        subscription = self._subscription
        committed = [
            tp for tp in tps
            if (st := subscription.state(tp)).position is None and st.reset == COMMITTED
            and (raise_errors or now_s >= st.retry_at_s)
        ]
        if committed:
            if raise_errors:
                self._resolve_committed(committed, budget_ms=remaining_ms(deadline_s))
            else:
                self._poll_committed(committed, deadline_s)
        self._fetcher.reset_positions(tps, now_s=now_s, deadline_s=deadline_s,
                                      raise_errors=raise_errors)

    def _resolve_committed(self, tps: list[TopicPartition], *, budget_ms: int) -> None:
        """Starts partitions a group assigned at the group's committed offsets
        (OffsetFetch with require_stable: a transactional offset still pending
        is waited for, not skipped), within budget_ms; those without one fall
        back to auto_offset_reset."""
        group = self._require_group("position")
        self._apply_committed(group.fetch(tps, budget_ms=budget_ms), frozenset())

    def _poll_committed(self, tps: list[TopicPartition], deadline_s: float) -> None:
        """poll()'s way to _resolve_committed: sends one OffsetFetch and takes
        its answer on a later poll (finding the coordinator, when it is not
        cached, by deadline_s). Partitions whose offset is unstable, or a
        retriable failure, are tried again on a later poll (after a backoff)."""
        group = self._require_group("poll")
        pending = self._offset_fetch
        if pending is None:
            left_s = deadline_s - time.monotonic()
            try:
                if left_s <= 0:
                    raise errors.error_for(ErrorCode.REQUEST_TIMED_OUT,
                                           "no time left to find the group's coordinator")
                pending = group.send_fetch(
                    tps, require_stable=True, timeout_s=self._request_timeout_ms / 1000,
                    lookup_timeout_s=left_s,
                )
            except OncelogError as exc:
                self._committed_not_fetched(tps, exc)
                return
            self._offset_fetch = pending
            pending.add_done_callback(self._wake)
        if not pending.done():
            return  # poll() wakes when it answers
        self._offset_fetch = None
        try:
            result = pending.result()
        except OncelogError as exc:
            self._committed_not_fetched(
                [tp for tp in pending.partitions if tp in self._subscription], exc
            )
            return
        self._apply_committed(result.offsets, result.unstable)

    def _committed_not_fetched(self, tps: Iterable[TopicPartition], exc: OncelogError) -> None:
        if not exc.retriable:
            raise exc
        log.debug("group %r: committed offsets not fetched, will retry: %s", self.group_id, exc)
        for tp in tps:
            self._subscription.back_off(self._subscription.state(tp))

    def _apply_committed(
        self, found: Mapping[TopicPartition, int], unstable: frozenset[TopicPartition]
    ) -> None:
        for tp in unstable:
            st = self._subscription.get(tp)
            if st is None:
                continue  # revoked meanwhile
            st.attempts += 1
            st.retry_at_s = time.monotonic() + unstable_offset_backoff_ms(
                st.attempts, self._retry_backoff_ms) / 1000
        for tp, offset in found.items():
            st_or_none = self._subscription.get(tp)
            if st_or_none is None or st_or_none.reset != COMMITTED:
                continue  # revoked or moved by seek() meanwhile
            st_or_none.attempts = 0
            if offset >= 0:
                st_or_none.position = offset
                st_or_none.reset = None
            else:
                st_or_none.reset = self._subscription.default_reset()

    # ------------------------------------------------------------ polling

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, at most max_poll_records;
        returns as soon as it has some, or after `timeout` seconds with an
        empty list. What it must ask first (metadata, a position reset, the
        group's committed offsets, an auto-commit) is asked within the same
        timeout (at least POLL_CALL_MIN_MS for all of it, so that
        poll(timeout=0) can get started); a cluster that does not answer
        makes it return an empty list in time, and is logged once.

        With a key or value deserializer, a record it fails on raises
        DeserializationError (naming topic, partition and offset) and the
        partition's position stays at that record: the records before it
        are returned first, and every later poll() raises again until the
        application seeks past it."""
        return self._poll(timeout)

    def poll_columns(self, timeout: float = 1.0) -> list[PartitionRecords]:
        """poll() for callers that handle records by the batch: the same
        records (at most max_poll_records in all), the same waiting, the same
        positions moved, handed out as one PartitionRecords per partition
        that has records, its keys, values, offsets, timestamps and headers
        each a list. No object is made per record, which is what a pipeline
        that moves records through without looking at each one (a copier,
        into Producer.send_many) saves.

        Keys and values are bytes as stored: a consumer with a key or value
        deserializer raises IllegalStateError (use poll())."""
        return self._poll_columns(timeout)

    def _poll_columns(self, timeout: float, max_records: int | None = None,
                      partitions: frozenset[TopicPartition] | None = None,
                      ) -> list[PartitionRecords]:
        """poll_columns() with _poll()'s limits (AIOConsumer.getmany_columns)."""
        if self._fetcher.deserializes:
            raise errors.IllegalStateError(
                "poll_columns() hands out keys and values as stored, and this consumer has a "
                "key_deserializer or a value_deserializer: use poll()")
        return self._poll_with(self._fetcher.drain_columns, timeout, max_records, partitions)

    def _poll(self, timeout: float, max_records: int | None = None,
              partitions: frozenset[TopicPartition] | None = None) -> list[ConsumerRecord]:
        """poll(), returning at most `max_records` (default max_poll_records)
        and only records of `partitions` (default: every assigned one): the
        asyncio consumer's getone() and getmany(*partitions, max_records=)
        (oncelog.aio), which must not move a position past a record it does
        not hand out."""
        return self._poll_with(self._fetcher.drain, timeout, max_records, partitions)

    def _poll_with(self, drain: Callable[[int, frozenset[TopicPartition] | None], list[_Out]],
                   timeout: float, max_records: int | None = None,
                   partitions: frozenset[TopicPartition] | None = None) -> list[_Out]:
        """_poll() handing out what `drain` makes of the buffered records."""
        self._check_open()
        limit = self._max_poll_records if max_records is None else max_records
        if not self._subscription.has_partitions and not self._subscription.subscribed:
            raise errors.IllegalStateError(
                "poll() without assigned partitions; assign() or subscribe() first"
            )
        started_s = time.monotonic()
        deadline_s = started_s + max(timeout, 0.0)
        calls_deadline_s = max(deadline_s, started_s + POLL_CALL_MIN_MS / 1000)
        fetcher = self._fetcher
        while True:
            self._group_step(calls_deadline_s)
            fetcher.collect_fetches(calls_deadline_s)
            out = drain(limit, partitions)
            if out:
                fetcher.send_fetches(calls_deadline_s)  # prefetch while the caller works on these
                return out
            unresolved = self._subscription.unresolved()
            if unresolved:
                self._resolve_positions(unresolved, deadline_s=calls_deadline_s,
                                        raise_errors=False)
            fetcher.send_fetches(calls_deadline_s)
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return []
            self._wait_for_fetch(remaining_s)

    def _wait_for_fetch(self, max_wait_s: float) -> None:
        """Sleeps until a fetch (or an OffsetFetch) answers, the membership
        has something for poll() to apply, a backoff ends, metadata may be
        asked again, or max_wait_s passes."""
        now_s = time.monotonic()
        wake_s = now_s + max_wait_s
        retry_times = [st.retry_at_s for st in self._subscription.states()]
        retry_times.extend(self._fetcher.wake_times_s())
        for retry_at in retry_times:
            if retry_at > now_s:
                wake_s = min(wake_s, retry_at)
        with self._changed:
            if self._fetcher.has_answers():
                return
            if self._offset_fetch is not None and self._offset_fetch.done():
                return
            m = self._membership
            if m is not None and (m.plan() is not None or m.state is MemberState.FATAL):
                return
            wait_s = wake_s - time.monotonic()
            if wait_s > 0:
                self._changed.wait(wait_s)

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise errors.IllegalStateError("the consumer is closed")

    def close(self, timeout: float | None = None) -> None:
        """Leaves the group, if in one (auto-commit and on_revoke first; a
        static member leaves with epoch -2 and keeps its partitions until its
        session times out), waiting up to `timeout` seconds (default
        request_timeout_ms) for the coordinator, the auto-commit included;
        then closes the connections."""
        if self._closed:
            return
        try:
            if self._subscription.subscribed:
                self._leave_group(
                    self._request_timeout_ms / 1000 if timeout is None else max(timeout, 0.0)
                )
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._membership is not None:
            with self._lock:
                self._membership.close()
        self._fetcher.close()
        if self._offset_fetch is not None:
            self._offset_fetch.cancel()
            self._offset_fetch = None
        self._client.close()
        if self._heartbeat is not None:
            self._heartbeat.join(self._request_timeout_ms / 1000)

    @property
    def fetch_throttle_time(self) -> ThrottleTime:
        """The throttle times the stores answered this consumer's fetches
        with (Kafka's fetch-throttle-time-avg/max)."""
        return self._fetcher.throttle_time

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_partitions(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    if isinstance(partitions, TopicPartition):
        raise TypeError("expected a list of TopicPartition values, got one TopicPartition")
    tps: list[TopicPartition] = []
    for tp in partitions:
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"expected TopicPartition values, got {tp!r}")
        if tp not in tps:
            tps.append(tp)
    return tps
