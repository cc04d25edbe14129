"""Admin: topics, transactions and consumer groups.

Every call is synchronous, retries retriable errors (an unreachable store, the
catalog owner restarting, a coordinator moving or loading) with backoff, and
raises the typed error of `oncelog.errors` otherwise. Each public call, with
every request it makes, returns or raises within `default_api_timeout_ms`
(Kafka's default.api.timeout.ms), connecting included; KafkaTimeoutError
names the addresses that did not answer.

Catalog changes go to the store that keeps the topic catalog (Metadata's
controller); transaction questions go to the transactional id's coordinator
(FindCoordinator), or to every coordinator Metadata lists; group questions go
to the group's coordinator, or to every group coordinator.

Hanging transactions: an open transaction on a partition that no coordinator
will ever end (a coordinator bug, a lost `__transaction_state`, a write that
bypassed verification) holds the partition's last stable offset, so
read_committed consumers stop there. `find_hanging_transactions` finds them
from the stores' producer state (DescribeProducers) checked against the
coordinators' open transactions; `abort_hanging_transaction` writes the ABORT
marker straight to the partition, as Kafka's admin abort does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import grpc

from oncelog._client import (
    SERVICE,
    ClusterClient,
    ClusterMetadata,
    TopicInfo,
    error_from_proto,
    raise_for_error,
    remaining_ms,
)
from oncelog._config import client_timing_options, int_option
from oncelog._coordinators import TRANSACTION, CoordinatorLocator, call_coordinator
from oncelog._group import (
    NO_GENERATION,
    GroupClient,
    check_group_id,
    check_offsets,
    partition_names,
)
from oncelog._keywords import kafka_names
from oncelog._security import PLAINTEXT, TokenProvider, security_options
from oncelog.types import (
    AclBinding,
    AclFilter,
    GroupDescription,
    GroupListing,
    GroupOffset,
    HangingTransaction,
    MemberDescription,
    NewTopic,
    PartitionDescription,
    PreparedTxnState,
    ProducerState,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from oncelog.v1 import (
    coordinator_pb2,
    errors_pb2,
    group_coordinator_pb2,
    partition_store_pb2,
    partition_store_pb2_grpc,
    records_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.records import MAX_PRODUCER_EPOCH

# Kafka's transaction.max.timeout.ms default, and our coordinator's: no
# transaction may stay open longer, so one open longer is hanging.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
# The states in which a coordinator still owns a transaction's outcome
# (Prepared: a two-phase-commit transaction waiting for its completion).
OPEN_TRANSACTION_STATES = ("Ongoing", "Prepared", "PrepareCommit", "PrepareAbort",
                           "PrepareEpochFence")
# ListOffsets timestamps with a meaning.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
RESET_TARGETS = ("earliest", "latest")

T = TypeVar("T")
P = ParamSpec("P")


def _within_budget(
    method: Callable[Concatenate[Admin, P], T]
) -> Callable[Concatenate[Admin, P], T]:
    """A public Admin call: everything it does shares one budget of
    default_api_timeout_ms (see Admin._within)."""

    @functools.wraps(method)
    def bounded(self: Admin, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._within(name=f"{method.__name__}()"):
            return method(self, *args, **kwargs)

    return bounded


def _ms(timeout_s: float) -> int:
    """An attempt's timeout_s as the timeout_ms of a client call (at least 1)."""
    return max(int(timeout_s * 1000), 1)


@kafka_names
class Admin:
    """Creates, grows, deletes, lists and describes topics; lists, describes and
    aborts transactions; finds and aborts hanging transactions; lists,
    describes and deletes consumer groups, and shows and resets their
    offsets; creates, describes and deletes ACLs."""

    def __init__(
        self,
        *,
        bootstrap: str,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        security_protocol: str = PLAINTEXT,
        ssl_cafile: str | os.PathLike[str] | None = None,
        ssl_certfile: str | os.PathLike[str] | None = None,
        ssl_keyfile: str | os.PathLike[str] | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: TokenProvider | None = None,
    ) -> None:
        """`security_protocol`, `ssl_*` and `sasl_*` (kafka-python's names):
        how to connect to a secured cluster (oncelog._security)."""
        client_timing_options(request_timeout_ms=request_timeout_ms,
                              retry_backoff_ms=retry_backoff_ms,
                              retry_backoff_max_ms=retry_backoff_max_ms)
        int_option("default_api_timeout_ms", default_api_timeout_ms, minimum=1)
        security = security_options(
            security_protocol=security_protocol, ssl_cafile=ssl_cafile,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, sasl_mechanism=sasl_mechanism,
            sasl_oauth_token_provider=sasl_oauth_token_provider,
        )
        self._client = ClusterClient(
            bootstrap, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            security=security,
        )
        self._default_api_timeout_ms = default_api_timeout_ms
        # Per thread: when the public call running in it must have ended.
        self._budget = threading.local()

    # ------------------------------------------------------------ topics

    @_within_budget
    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
        *, replication_factor: int = 0, exist_ok: bool = False,
    ) -> None:
        """Creates a topic; raises TopicAlreadyExistsError, InvalidConfigError, ...

        With `exist_ok=True` a topic of that name that already exists is not an
        error (its partition count and config are left as they are), so a
        script that sets up its topics can run again."""
        exc = self.create_topics(
            [NewTopic(name, partitions, dict(config or {}), replication_factor)])[name]
        if exc is not None and not (exist_ok and isinstance(exc, errors.TopicAlreadyExistsError)):
            raise exc

    @_within_budget
    def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, OncelogError | None]:
        """Creates several topics in one request; per topic, None when it was
        created (or, with validate_only, would be) or the error that prevented it."""
        specs = list(topics)
        for spec in specs:
            if not isinstance(spec, NewTopic):
                raise TypeError(f"create_topics() takes NewTopic values, got {spec!r}")
            if type(spec.partitions) is not int:
                raise TypeError(f"partitions must be an int, got {spec.partitions!r}")
            if type(spec.replication_factor) is not int or spec.replication_factor < 0:
                raise ValueError(f"replication_factor must be an int >= 0 (0: the cluster's "
                                 f"default), got {spec.replication_factor!r}")
        if not specs:
            return {}
        request = partition_store_pb2.CreateTopicsRequest(
            topics=[
                partition_store_pb2.TopicSpec(
                    name=t.name, partitions=t.partitions,
                    config={str(k): str(v) for k, v in t.config.items()},
                    replication_factor=t.replication_factor,
                )
                for t in specs
            ],
            validate_only=validate_only,
        )

        resp = self._catalog_call("CreateTopics", lambda stub: stub.CreateTopics, request)
        out: dict[str, OncelogError | None] = {t.name: None for t in specs}
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        if not validate_only:
            self._client.invalidate_metadata()
        return out

    @_within_budget
    def create_partitions(
        self, new_partitions: Mapping[str, int], *, validate_only: bool = False
    ) -> None:
        """Grows topics to a new total partition count each (Kafka's
        createPartitions): `{"payments": 6}` gives payments 6 partitions in
        all. Existing partitions keep their records; keys hashed over the
        count may go to other partitions from now on. With validate_only
        the cluster checks the request and changes nothing.

        Each topic is handled on its own; the first refusal, in the order
        given, is raised (its message names the topic): InvalidPartitionsError
        (the count does not grow, or is over the limit),
        UnknownTopicOrPartitionError, InvalidRequestError (an internal topic).
        A retry after a lost answer that finds the topic already grown to
        the count asked for counts as done."""
        counts = dict(new_partitions)
        for name, count in counts.items():
            if not isinstance(name, str):
                raise TypeError(f"create_partitions() takes topic names as keys, got {name!r}")
            if type(count) is not int:
                raise TypeError(f"{name}: the new partition count must be an int, got {count!r}")
        if not counts:
            return
        request = partition_store_pb2.CreatePartitionsRequest(
            topics=[partition_store_pb2.CreatePartitionsTopic(name=name, count=count)
                    for name, count in counts.items()],
            validate_only=validate_only,
        )
        sent = 0

        def attempt(timeout_s: float) -> partition_store_pb2.CreatePartitionsResponse:
            nonlocal sent
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            sent += 1
            return self._rpc(address, stub.CreatePartitions, request, deadline_s)

        resp = self._call("CreatePartitions", attempt)
        failures: dict[str, OncelogError] = {}
        for result in resp.results:
            exc = error_from_proto(result.error)
            if exc is not None:
                failures[result.name] = exc
        if not validate_only:
            self._client.invalidate_metadata()
            if sent > 1 and any(e.code is ErrorCode.INVALID_PARTITIONS
                                for e in failures.values()):
                # An earlier attempt may have grown the topic and lost its answer.
                topics = self._refreshed_metadata().topics
                for name, exc in list(failures.items()):
                    info = topics.get(name)
                    if (exc.code is ErrorCode.INVALID_PARTITIONS and info is not None
                            and info.num_partitions == counts[name]):
                        del failures[name]
        for name in counts:
            if name in failures:
                raise failures[name]

    @_within_budget
    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int]],
    ) -> dict[TopicPartition, OncelogError | None]:
        """Moves partitions to new replica lists, the preferred leader first
        (Kafka's alterPartitionReassignments): the new replicas copy the log
        while producers and consumers go on, join the in-sync set, then the
        replicas left out are dropped (and lead no more). Per partition, None
        when the move started, or the error that refused it. A replicated
        cluster only (docs/replication.md)."""
        moves = dict(reassignments)
        for tp, replicas in moves.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"reassignments are keyed by TopicPartition, got {tp!r}")
            if not replicas or any(type(r) is not int or r < 0 for r in replicas):
                raise ValueError(f"{tp.topic}-{tp.partition}: replicas must be store node "
                                 f"ids (ints >= 0), got {list(replicas)!r}")
        if not moves:
            return {}
        request = partition_store_pb2.AlterPartitionReassignmentsRequest(partitions=[
            partition_store_pb2.ReassignPartition(
                topic=tp.topic, partition=tp.partition, replica_node_ids=list(replicas))
            for tp, replicas in moves.items()
        ])
        resp = self._catalog_call("AlterPartitionReassignments",
                                  lambda stub: stub.AlterPartitionReassignments, request)
        out: dict[TopicPartition, OncelogError | None] = {tp: None for tp in moves}
        for result in resp.results:
            out[TopicPartition(result.topic, result.partition)] = error_from_proto(result.error)
        self._client.invalidate_metadata()
        return out

    @_within_budget
    def list_partition_reassignments(self) -> dict[TopicPartition, tuple[int, ...]]:
        """Moves in progress: partition -> the replica list asked for."""
        md = self._refreshed_metadata()
        return {
            TopicPartition(info.name, p): target
            for info in md.topics.values()
            for p, target in enumerate(info.targets) if target
        }

    @_within_budget
    def delete_topic(self, name: str) -> None:
        """Deletes a topic and its data; raises UnknownTopicOrPartitionError
        when there is no such topic."""
        exc = self.delete_topics([name])[name]
        if exc is not None:
            raise exc

    @_within_budget
    def delete_topics(self, names: Iterable[str]) -> dict[str, OncelogError | None]:
        """Per topic, None when it was deleted or the error that prevented it."""
        wanted = list(names)
        if not wanted:
            return {}
        request = partition_store_pb2.DeleteTopicsRequest(names=wanted)

        resp = self._catalog_call("DeleteTopics", lambda stub: stub.DeleteTopics, request)
        out: dict[str, OncelogError | None] = dict.fromkeys(wanted)
        for result in resp.results:
            out[result.name] = error_from_proto(result.error)
        self._client.invalidate_metadata()
        return out

    @_within_budget
    def list_topics(self) -> dict[str, int]:
        """User topics (not the internal __ ones) and their partition counts."""
        request = partition_store_pb2.ListTopicsRequest(include_internal=False)

        resp = self._catalog_call("ListTopics", lambda stub: stub.ListTopics, request)
        return {t.name: len(t.partitions) for t in resp.topics if not t.internal}

    @_within_budget
    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions with their stores and offsets (earliest, high watermark,
        last stable offset), and the topic's effective configuration. Asks
        the cluster afresh (leaders and in-sync replicas change: a cached
        answer would go on showing a store out of sync that is back)."""
        fresh = self._refreshed_metadata()
        info = fresh.topics.get(name) or self._topic(name)
        md = self._client.cached_metadata or fresh
        stores = md.stores
        partitions = list(range(info.num_partitions))
        earliest = self._offsets(name, partitions, -2, records_pb2.READ_UNCOMMITTED)
        high = self._offsets(name, partitions, -1, records_pb2.READ_UNCOMMITTED)
        stable = self._offsets(name, partitions, -1, records_pb2.READ_COMMITTED)
        return TopicDescription(
            name=info.name,
            topic_id=info.topic_id,
            internal=info.internal,
            partitions=tuple(
                PartitionDescription(
                    partition=p,
                    leader_node_id=info.leaders[p],
                    leader_address=stores.get(info.leaders[p], ""),
                    earliest_offset=earliest[p],
                    high_watermark=high[p],
                    last_stable_offset=stable[p],
                    leader_epoch=info.leader_epochs[p] if info.leader_epochs else 0,
                    replicas=info.replicas[p] if info.replicas else (),
                    isr=info.isr[p] if info.isr else (),
                    target_replicas=info.targets[p] if info.targets else (),
                )
                for p in partitions
            ),
            config=dict(info.config),
        )

    def _offsets(
        self,
        topic: str,
        partitions: list[int],
        timestamp_ms: int,
        isolation: records_pb2.IsolationLevel.ValueType,
    ) -> dict[int, int]:
        pending = set(partitions)
        found: dict[int, int] = {}

        def attempt(timeout_s: float) -> dict[int, int]:
            deadline_s = time.monotonic() + timeout_s
            by_address: dict[str, list[int]] = {}
            for p in sorted(pending):
                address = self._client.leader(topic, p, timeout_ms=remaining_ms(deadline_s))
                by_address.setdefault(address, []).append(p)
            retry: OncelogError | None = None
            for address, ps in by_address.items():
                request = partition_store_pb2.ListOffsetsRequest(
                    partitions=[
                        partition_store_pb2.ListOffsetsPartition(
                            topic=topic, partition=p, timestamp_ms=timestamp_ms
                        )
                        for p in ps
                    ],
                    isolation_level=isolation,
                )
                resp = self._rpc(address, self._client.store(address).ListOffsets, request,
                                 deadline_s)
                for result in resp.results:
                    exc = error_from_proto(result.error)
                    if exc is None:
                        found[result.partition] = result.offset
                        pending.discard(result.partition)
                    elif exc.retriable:
                        retry = exc
                    elif exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        retry = _not_there_yet(address, topic, result.partition, exc)
                    else:
                        raise exc
            if pending:
                raise retry or errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"ListOffsets answered nothing for {topic} partitions {sorted(pending)}",
                )
            return found

        return self._call("ListOffsets", attempt)

    # ------------------------------------------------------------ transactions

    @_within_budget
    def list_transactions(
        self,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
    ) -> list[TransactionListing]:
        """Every transactional id every coordinator (as Metadata lists them)
        knows, optionally only those in `states` (coordinator state names:
        Ongoing, Prepared, CompleteCommit, ...) or with one of `producer_ids`; sorted by
        transactional id."""
        request = coordinator_pb2.ListTransactionsRequest(
            states=list(states or ()), producer_ids=list(producer_ids or ()),
        )
        def list_at(address: str, timeout_s: float) -> coordinator_pb2.ListTransactionsResponse:
            resp = self._rpc(address, self._client.coordinator(address).ListTransactions,
                             request, time.monotonic() + timeout_s,
                             service="transaction coordinator")
            raise_for_error(resp.error)
            return resp

        out: dict[str, TransactionListing] = {}
        for resp in self._ask_each(self._coordinator_addresses(), "ListTransactions", list_at):
            for t in resp.transactions:
                out[t.transactional_id] = TransactionListing(
                    t.transactional_id, t.producer_id, t.state
                )
        return [out[k] for k in sorted(out)]

    @_within_budget
    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        """The transactional id's state at its coordinator: producer id and
        epoch, the open transaction's partitions, start time and timeout,
        and for two-phase commit whether the producer uses it and the
        prepared transaction's state; raises TransactionalIdNotFoundError for
        an id it does not know."""
        self._check_transactional_id(transactional_id)
        request = coordinator_pb2.DescribeTransactionsRequest(
            transactional_ids=[transactional_id]
        )

        def attempt(address: str, timeout_s: float) -> TransactionDescription:
            resp = self._client.coordinator(address).DescribeTransactions(
                request, timeout=timeout_s
            )
            d = _answer_for(resp.transactions, lambda d: d.transactional_id, transactional_id,
                            "DescribeTransactions")
            return _transaction_description(d)

        return self._call_txn_coordinator("DescribeTransactions", transactional_id, attempt)

    @_within_budget
    def abort_transaction(self, transactional_id: str) -> TransactionDescription:
        """Aborts the transactional id's open transaction (also a prepared
        two-phase-commit one) now, at its coordinator, and fences its producer
        (the epoch is bumped: its next call fails with ProducerFencedError).
        Returns the transaction as the abort left it (PrepareAbort; markers
        follow). Raises InvalidTxnStateError when no transaction is open."""
        self._check_transactional_id(transactional_id)
        request = coordinator_pb2.AbortTransactionRequest(transactional_id=transactional_id)
        outcome_unknown = False

        def attempt(address: str, timeout_s: float) -> TransactionDescription:
            nonlocal outcome_unknown
            try:
                resp = self._client.coordinator(address).AbortTransaction(
                    request, timeout=timeout_s
                )
            except grpc.RpcError as rpc_exc:
                lost = self._client.rpc_error(rpc_exc, address,
                                              service="transaction coordinator")
                if lost.code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
                    outcome_unknown = True
                raise lost from rpc_exc
            exc = error_from_proto(resp.error)
            if exc is not None:
                raise exc
            return _transaction_description(resp.transaction)

        try:
            return self._call_txn_coordinator("AbortTransaction", transactional_id, attempt)
        except errors.OncelogError as exc:
            if exc.code is not ErrorCode.INVALID_TXN_STATE or not outcome_unknown:
                raise
            # An earlier attempt whose answer was lost may have aborted it.
            described = self.describe_transaction(transactional_id)
            if described.state in ("PrepareAbort", "CompleteAbort"):
                return described
            raise

    @_within_budget
    def describe_producers(self, partition: TopicPartition) -> list[ProducerState]:
        """The producers the partition's store keeps state for, with the first
        offset of each one's open transaction there (None when none is open)."""
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"describe_producers() takes a TopicPartition, got {partition!r}")
        return self._describe_producers([partition])[partition]

    @_within_budget
    def find_hanging_transactions(
        self,
        *,
        max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
        topics: Iterable[str] | None = None,
    ) -> list[HangingTransaction]:
        """Open transactions on the partitions of `topics` (default: every
        user topic) that no coordinator will end: a producer's transaction is
        hanging when the store has it open and either its last write there is
        older than `max_transaction_timeout_ms` (every transaction is aborted
        by its coordinator by then) or no coordinator has an open transaction
        (Ongoing, Prepared or Prepare*) of that producer id on that partition.

        Age alone does not make a two-phase-commit transaction hanging: its
        coordinator never times it out (an outside coordinator decides it,
        and may take as long as it needs), so one that its coordinator holds
        open on that partition is not reported, however old. A prepared one
        that nobody will ever complete shows in list_transactions(states=
        ["Prepared"]) and describe_transaction(); abort_transaction() ends it.

        The stores are asked first and again at the end: a transaction whose
        markers landed meanwhile is not reported."""
        if max_transaction_timeout_ms <= 0:
            raise ValueError(
                f"max_transaction_timeout_ms must be positive, got {max_transaction_timeout_ms}"
            )
        names = sorted(self.list_topics()) if topics is None else list(topics)
        partitions: list[TopicPartition] = []
        for name in names:
            info = self._topic(name)
            partitions.extend(TopicPartition(name, p) for p in range(info.num_partitions))
        if not partitions:
            return []
        before = self._describe_producers(partitions)
        candidates = [
            (tp, ps) for tp, states in before.items() for ps in states
            if ps.current_txn_start_offset is not None
        ]
        if not candidates:
            return []
        # Read after the stores: a transaction a store showed open was added at
        # its coordinator before its first write, so the coordinator shows it
        # too unless it has ended (which the second look at the stores catches).
        open_at_coordinators, two_phase = self._open_transaction_partitions()
        now_ms = int(time.time() * 1000)
        suspects: list[tuple[TopicPartition, ProducerState, str]] = []
        for tp, ps in candidates:
            if (now_ms - ps.last_timestamp_ms > max_transaction_timeout_ms
                    and tp not in two_phase.get(ps.producer_id, set())):
                suspects.append((tp, ps, (
                    f"open since its last write {now_ms - ps.last_timestamp_ms} ms ago, longer "
                    f"than max_transaction_timeout_ms={max_transaction_timeout_ms}"
                )))
            elif tp not in open_at_coordinators.get(ps.producer_id, set()):
                suspects.append((tp, ps, (
                    "no coordinator has an open transaction of this producer on this partition"
                )))
        if not suspects:
            return []
        after = self._describe_producers(sorted({tp for tp, _ps, _r in suspects}))
        hanging: list[HangingTransaction] = []
        for tp, ps, reason in suspects:
            still_open = any(
                now.producer_id == ps.producer_id
                and now.current_txn_start_offset == ps.current_txn_start_offset
                for now in after.get(tp, [])
            )
            if still_open and ps.current_txn_start_offset is not None:
                hanging.append(HangingTransaction(
                    topic_partition=tp, producer_id=ps.producer_id,
                    producer_epoch=ps.producer_epoch, coordinator_epoch=ps.coordinator_epoch,
                    current_txn_start_offset=ps.current_txn_start_offset,
                    last_timestamp_ms=ps.last_timestamp_ms, reason=reason,
                ))
        return hanging

    @_within_budget
    def abort_hanging_transaction(self, partition: TopicPartition, producer_id: int) -> None:
        """Aborts the producer's open transaction on one partition by writing
        an ABORT marker straight to the partition's store, with the producer's
        epoch + 1 and the coordinator epoch the store last saw for it (as
        Kafka's admin abort does). For transactions no coordinator will end
        (find_hanging_transactions); a transaction its coordinator knows is
        better aborted with abort_transaction(transactional_id)."""
        if not isinstance(partition, TopicPartition):
            raise TypeError(
                f"abort_hanging_transaction() takes a TopicPartition, got {partition!r}"
            )
        marker_sent = False

        def attempt(timeout_s: float) -> None:
            nonlocal marker_sent
            # The requests below share this attempt's time.
            deadline_s = time.monotonic() + timeout_s
            states = self._describe_producers([partition], timeout_s=timeout_s)[partition]
            ps = next((p for p in states if p.producer_id == producer_id), None)
            if ps is None or ps.current_txn_start_offset is None:
                if marker_sent:
                    return  # an earlier attempt's marker landed; its answer was lost
                raise errors.error_for(
                    ErrorCode.INVALID_TXN_STATE,
                    f"producer {producer_id} has no open transaction on "
                    f"{partition.topic}-{partition.partition}"
                    + ("" if ps is not None else " (the store has no state for it)"),
                )
            if ps.producer_epoch >= MAX_PRODUCER_EPOCH:
                raise errors.error_for(
                    ErrorCode.INVALID_PRODUCER_EPOCH,
                    f"producer {producer_id} is at epoch {ps.producer_epoch}, the last one: "
                    "a marker above it cannot be written",
                )
            request = partition_store_pb2.WriteTxnMarkersRequest(markers=[
                partition_store_pb2.TxnMarker(
                    producer_id=producer_id,
                    producer_epoch=ps.producer_epoch + 1,
                    type=partition_store_pb2.ABORT,
                    coordinator_epoch=ps.coordinator_epoch,
                    partitions=[records_pb2.TopicPartition(
                        topic=partition.topic, partition=partition.partition,
                    )],
                ),
            ])
            address = self._client.leader(partition.topic, partition.partition,
                                          timeout_ms=remaining_ms(deadline_s))
            marker_sent = True
            resp = self._rpc(address, self._client.store(address).WriteTxnMarkers, request,
                             deadline_s)
            for result in resp.results:
                exc = error_from_proto(result.error)
                if exc is not None:
                    raise errors.error_for(
                        exc.code,
                        f"ABORT marker for producer {producer_id} on {result.topic}-"
                        f"{result.partition}: {exc.message or exc.code.name}",
                    )

        self._call("WriteTxnMarkers", attempt)

    def _describe_producers(
        self, partitions: list[TopicPartition], *, timeout_s: float | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        """DescribeProducers for the partitions, one request per store."""
        pending = set(partitions)
        found: dict[TopicPartition, list[ProducerState]] = {}

        def attempt(attempt_timeout_s: float) -> dict[TopicPartition, list[ProducerState]]:
            deadline_s = time.monotonic() + attempt_timeout_s
            by_address: dict[str, list[TopicPartition]] = {}
            for tp in sorted(pending):
                address = self._client.leader(tp.topic, tp.partition,
                                              timeout_ms=remaining_ms(deadline_s))
                by_address.setdefault(address, []).append(tp)
            retry: OncelogError | None = None
            for address, tps in by_address.items():
                request = partition_store_pb2.DescribeProducersRequest(partitions=[
                    records_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                    for tp in tps
                ])
                resp = self._rpc(address, self._client.store(address).DescribeProducers,
                                 request, deadline_s)
                for result in resp.results:
                    tp = TopicPartition(result.topic, result.partition)
                    if tp not in pending:
                        continue
                    exc = error_from_proto(result.error)
                    if exc is None:
                        found[tp] = [_producer_state(p) for p in result.producers]
                        pending.discard(tp)
                    elif exc.retriable:
                        retry = exc
                    elif exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                        retry = _not_there_yet(address, tp.topic, tp.partition, exc)
                    else:
                        raise errors.error_for(
                            exc.code, f"DescribeProducers of {tp.topic}-{tp.partition}: "
                            f"{exc.message or exc.code.name}",
                        )
            if pending:
                raise retry or errors.error_for(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"DescribeProducers answered nothing for {sorted(pending)}",
                )
            return found

        if timeout_s is not None:
            return attempt(timeout_s)
        return self._call("DescribeProducers", attempt)

    def _open_transaction_partitions(
        self,
    ) -> tuple[dict[int, set[TopicPartition]], dict[int, set[TopicPartition]]]:
        """producer id -> the partitions of its open transaction (Ongoing,
        Prepared or Prepare*), from every coordinator; and the same for the
        two-phase-commit ones among them. A Prepared transaction's records
        carry its prepared state's producer id, which is the one counted."""
        out: dict[int, set[TopicPartition]] = {}
        two_phase: dict[int, set[TopicPartition]] = {}
        for address in self._coordinator_addresses():
            list_request = coordinator_pb2.ListTransactionsRequest(
                states=list(OPEN_TRANSACTION_STATES)
            )

            def list_open(timeout_s: float, address: str = address,
                          list_request: coordinator_pb2.ListTransactionsRequest = list_request,
                          ) -> list[str]:
                resp = self._rpc(address, self._client.coordinator(address).ListTransactions,
                                 list_request, time.monotonic() + timeout_s,
                                 service="transaction coordinator")
                return [t.transactional_id for t in resp.transactions]

            ids = self._call(f"ListTransactions at {address}", list_open)
            if not ids:
                continue
            describe_request = coordinator_pb2.DescribeTransactionsRequest(transactional_ids=ids)

            def describe(timeout_s: float, address: str = address,
                         describe_request: coordinator_pb2.DescribeTransactionsRequest
                         = describe_request,
                         ) -> coordinator_pb2.DescribeTransactionsResponse:
                return self._rpc(address, self._client.coordinator(address).DescribeTransactions,
                                 describe_request, time.monotonic() + timeout_s,
                                 service="transaction coordinator")

            for d in self._call(f"DescribeTransactions at {address}", describe).transactions:
                if d.error.code != 0 or d.state not in OPEN_TRANSACTION_STATES:
                    continue
                producer_id = (d.prepared_transaction.producer_id
                               if d.HasField("prepared_transaction") else d.producer_id)
                tps = {TopicPartition(p.topic, p.partition) for p in d.partitions}
                out.setdefault(producer_id, set()).update(tps)
                if d.two_phase_commit:
                    two_phase.setdefault(producer_id, set()).update(tps)
        return out, two_phase

    def _coordinator_addresses(self) -> tuple[str, ...]:
        md = self._metadata()
        if not md.coordinators:
            md = self._refreshed_metadata()
        return md.coordinators

    def _call_txn_coordinator(
        self, what: str, transactional_id: str, attempt: Callable[[str, float], T]
    ) -> T:
        locator = CoordinatorLocator(self._client, transactional_id, TRANSACTION)
        return call_coordinator(self._client, locator, what, attempt,
                                budget_ms=self._left_ms())

    @staticmethod
    def _check_transactional_id(transactional_id: str) -> None:
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ValueError(f"transactional_id must be a non-empty str, got {transactional_id!r}")

    # ------------------------------------------------------------ groups

    @_within_budget
    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group every group coordinator (as Metadata lists them) knows,
        optionally only those in `states` (Empty, Assigning, Reconciling,
        Stable, Dead; for classic groups, Kafka's protocol, also
        PreparingRebalance and CompletingRebalance); sorted by group id."""
        request = group_coordinator_pb2.ListGroupsRequest(states=list(states or ()))
        def list_at(address: str, timeout_s: float) -> group_coordinator_pb2.ListGroupsResponse:
            resp = self._rpc(address, self._client.group_coordinator(address).ListGroups,
                             request, time.monotonic() + timeout_s, service="group coordinator")
            raise_for_error(resp.error)
            return resp

        out: dict[str, GroupListing] = {}
        for resp in self._ask_each(self._group_coordinator_addresses(), "ListGroups", list_at):
            for g in resp.groups:
                out[g.group_id] = GroupListing(g.group_id, g.state)
        return [out[k] for k in sorted(out)]

    @_within_budget
    def describe_group(self, group_id: str) -> GroupDescription:
        """The group's state, epoch and members (each with its subscription
        and the partitions it owns), from its coordinator. For a classic
        group (Kafka's clients) the epoch is its generation, and a member's
        topics and partitions are decoded from its consumer-protocol bytes
        (empty for other protocols)."""
        group = GroupClient(self._client, check_group_id(group_id))
        request = group_coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id])

        def attempt(address: str, timeout_s: float) -> GroupDescription:
            resp = self._client.group_coordinator(address).DescribeGroups(
                request, timeout=timeout_s
            )
            d = _answer_for(resp.groups, lambda d: d.group_id, group_id, "DescribeGroups")
            return _group_description(d)

        return group.call("DescribeGroups", attempt, budget_ms=self._left_ms())

    @_within_budget
    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, GroupOffset]:
        """The group's committed offsets (of `partitions`, default: every
        partition it has one for), each with the partition's end for a
        read_committed reader (last stable offset) and the lag between them.
        A transactional offset still pending is not shown: the last stable
        one is. Partitions without a committed offset are left out."""
        group = GroupClient(self._client, check_group_id(group_id))
        wanted = None if partitions is None else list(partitions)
        committed = group.fetch(wanted, budget_ms=self._left_ms(),
                                require_stable=False)
        found = {tp: offset for tp, offset in committed.items() if offset >= 0}
        ends = self._end_offsets(found)
        out: dict[TopicPartition, GroupOffset] = {}
        for tp in sorted(found):
            end = ends.get(tp)
            out[tp] = GroupOffset(found[tp], end, None if end is None else end - found[tp])
        return out

    @_within_budget
    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Sets the group's committed offsets (each the next offset to read).
        Only while the group has no members: a running consumer would
        overwrite them (UnknownMemberIdError otherwise)."""
        group = GroupClient(self._client, check_group_id(group_id))
        checked = check_offsets(offsets)
        try:
            group.commit(checked, generation_id=NO_GENERATION, member_id="",
                         budget_ms=self._left_ms())
        except errors.OncelogError as exc:
            if exc.code is not ErrorCode.UNKNOWN_MEMBER_ID:
                raise
            raise errors.error_for(
                exc.code, f"group {group_id!r} has members, so its offsets cannot be changed "
                f"from outside; stop its consumers first ({exc.message or exc.code.name})",
            ) from exc

    @_within_budget
    def reset_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        to: str | None = None,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        dry_run: bool = False,
    ) -> dict[TopicPartition, int]:
        """Moves the group's committed offsets of `partitions` (default: every
        partition it has one for) to the earliest offset (`to="earliest"`),
        the end for a read_committed reader (`to="latest"`: the last stable
        offset), an `offset` (which must lie within every partition's log), or
        the first record at or after `timestamp_ms` (the end where there is
        none). Exactly one of the three. Only while the group has no members;
        with dry_run, computes the new offsets without committing them.
        Returns the new offsets."""
        check_group_id(group_id)
        given = [name for name, value in (("to", to), ("offset", offset),
                                          ("timestamp_ms", timestamp_ms)) if value is not None]
        if len(given) != 1:
            raise ValueError(
                "reset_group_offsets() takes exactly one of to='earliest'|'latest', offset=N, "
                f"timestamp_ms=T; got {', '.join(given) or 'none'}"
            )
        if to is not None and to not in RESET_TARGETS:
            raise ValueError(f"to must be 'earliest' or 'latest', got {to!r}")
        if offset is not None and (type(offset) is not int or offset < 0):
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if timestamp_ms is not None and (type(timestamp_ms) is not int or timestamp_ms < 0):
            raise ValueError(f"timestamp_ms must be an int >= 0, got {timestamp_ms!r}")
        if partitions is None:
            tps = sorted(self.list_group_offsets(group_id))
        else:
            tps = sorted(set(partitions))
            for tp in tps:
                if not isinstance(tp, TopicPartition):
                    raise TypeError(f"partitions must be TopicPartition values, got {tp!r}")
        if not tps:
            return {}
        if offset is not None:
            earliest = self._partition_offsets(tps, EARLIEST_TIMESTAMP,
                                               records_pb2.READ_COMMITTED)
            ends = self._end_offsets(tps, missing_ok=False)
            outside = [tp for tp in tps if not earliest[tp] <= offset <= ends[tp]]
            if outside:
                raise errors.error_for(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is outside " + "; ".join(
                        f"{tp.topic}-{tp.partition} (offsets {earliest[tp]}..{ends[tp]})"
                        for tp in outside
                    ),
                )
            target = dict.fromkeys(tps, offset)
        elif timestamp_ms is not None:
            found = self._partition_offsets(tps, timestamp_ms, records_pb2.READ_COMMITTED)
            ends = self._end_offsets([tp for tp in tps if found[tp] < 0], missing_ok=False)
            target = {tp: found[tp] if found[tp] >= 0 else ends[tp] for tp in tps}
        elif to == "earliest":
            target = self._partition_offsets(tps, EARLIEST_TIMESTAMP, records_pb2.READ_COMMITTED)
        else:
            target = self._end_offsets(tps, missing_ok=False)
        if not dry_run:
            self.alter_group_offsets(group_id, target)
        return target

    @_within_budget
    def delete_group(self, group_id: str) -> None:
        """Deletes an empty group and its committed offsets; raises
        NonEmptyGroupError while it has members, GroupIdNotFoundError for a
        group the coordinator does not know."""
        group = GroupClient(self._client, check_group_id(group_id))
        request = group_coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id])

        def attempt(address: str, timeout_s: float) -> None:
            resp = self._client.group_coordinator(address).DeleteGroups(
                request, timeout=timeout_s
            )
            _answer_for(resp.results, lambda r: r.group_id, group_id, "DeleteGroups")

        group.call("DeleteGroups", attempt, budget_ms=self._left_ms())

    def _end_offsets(self, partitions: Iterable[TopicPartition], *, missing_ok: bool = True
                     ) -> dict[TopicPartition, int]:
        """Each partition's end for a read_committed reader (its last stable
        offset). With missing_ok, partitions of topics that no longer exist are
        left out; without, they raise UnknownTopicOrPartitionError."""
        tps = list(partitions)
        if missing_ok:
            md = self._metadata()
            tps = [tp for tp in tps if tp.topic in md.topics
                   and tp.partition < md.topics[tp.topic].num_partitions]
        return self._partition_offsets(tps, LATEST_TIMESTAMP, records_pb2.READ_COMMITTED)

    def _partition_offsets(
        self,
        partitions: Iterable[TopicPartition],
        timestamp_ms: int,
        isolation: records_pb2.IsolationLevel.ValueType,
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        out: dict[TopicPartition, int] = {}
        for topic, ps in by_topic.items():
            info = self._topic(topic)
            missing = [p for p in ps if not 0 <= p < info.num_partitions]
            if missing:
                raise errors.error_for(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has {info.num_partitions} partitions; no "
                    + partition_names(TopicPartition(topic, p) for p in missing),
                )
            for p, offset in self._offsets(topic, sorted(ps), timestamp_ms, isolation).items():
                out[TopicPartition(topic, p)] = offset
        return out

    def _group_coordinator_addresses(self) -> tuple[str, ...]:
        md = self._metadata()
        if not md.group_coordinators:
            md = self._refreshed_metadata()
        if not md.group_coordinators:
            raise errors.error_for(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "the cluster has no group coordinator (Metadata lists none), so it has no groups",
            )
        return md.group_coordinators

    # ------------------------------------------------------------ ACLs

    @_within_budget
    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Creates ACL bindings (Kafka's createAcls); creating one that
        exists already changes nothing. Raises the first binding's error,
        naming the binding (SecurityDisabledError on a cluster without an
        authorizer; ClusterAuthorizationFailedError without Alter on the
        cluster). A change reaches every service within the cluster's
        --acl-refresh-interval-ms."""
        items = list(bindings)
        for binding in items:
            if not isinstance(binding, AclBinding):
                raise TypeError(f"create_acls() takes AclBinding values, got {binding!r}")
        if not items:
            return
        request = partition_store_pb2.CreateAclsRequest(
            creations=[_binding_proto(b) for b in items])
        resp = self._catalog_call("CreateAcls", lambda stub: stub.CreateAcls, request)
        if len(resp.results) != len(items):
            raise errors.error_for(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"CreateAcls answered {len(resp.results)} results for {len(items)} bindings")
        for binding, result in zip(items, resp.results, strict=True):
            exc = error_from_proto(result)
            if exc is not None:
                raise errors.error_for(exc.code, f"{binding}: {exc.message or exc.code.name}")

    @_within_budget
    def describe_acls(self, filter: AclFilter | AclBinding | None = None
                      ) -> list[AclBinding]:
        """The ACL bindings `filter` selects (default: every one), sorted by
        resource, then principal (Kafka's describeAcls). An AclBinding as
        the filter selects exactly that binding."""
        request = partition_store_pb2.DescribeAclsRequest(filter=_filter_proto(filter))

        def attempt(timeout_s: float) -> partition_store_pb2.DescribeAclsResponse:
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            resp: partition_store_pb2.DescribeAclsResponse = self._rpc(
                address, stub.DescribeAcls, request, deadline_s)
            raise_for_error(resp.error)
            return resp

        resp = self._call("DescribeAcls", attempt)
        return sorted((_binding_from_proto(b) for b in resp.bindings), key=_acl_sort_key)

    @_within_budget
    def delete_acls(self, filters: Iterable[AclFilter | AclBinding]) -> list[AclBinding]:
        """Deletes every ACL binding each filter selects (Kafka's
        deleteAcls; an AclBinding selects exactly itself) and returns the
        deleted ones, sorted. Raises the first filter's error."""
        items = list(filters)
        for item in items:
            if not isinstance(item, (AclFilter, AclBinding)):
                raise TypeError(f"delete_acls() takes AclFilter or AclBinding values, "
                                f"got {item!r}")
        if not items:
            return []
        request = partition_store_pb2.DeleteAclsRequest(
            filters=[_filter_proto(item) for item in items])
        resp = self._catalog_call("DeleteAcls", lambda stub: stub.DeleteAcls, request)
        deleted: dict[AclBinding, None] = {}
        for item, result in zip(items, resp.results, strict=False):
            exc = error_from_proto(result.error)
            if exc is not None:
                raise errors.error_for(exc.code, f"filter {item}: {exc.message or exc.code.name}")
            deleted.update(dict.fromkeys(_binding_from_proto(b) for b in result.matching))
        return sorted(deleted, key=_acl_sort_key)

    # ------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _within(self, timeout_ms: int | None = None, *, name: str | None = None
                ) -> Iterator[None]:
        """Everything done inside shares one budget (default:
        default_api_timeout_ms): each request gets what is left of it. Inside
        another _within, the outer budget holds. With a name (the public
        call's), a KafkaTimeoutError for want of an answer is raised naming
        the call and its whole budget, rather than the request that ran out
        and what was left of the budget when it began. (The CLI bounds a
        whole command with one _within.)"""
        if getattr(self._budget, "deadline_s", None) is not None:
            yield
            return
        budget_ms = self._default_api_timeout_ms if timeout_ms is None else timeout_ms
        started_s = time.monotonic()
        self._budget.deadline_s = started_s + budget_ms / 1000
        try:
            yield
        except errors.KafkaTimeoutError as exc:
            if name is None:
                raise
            restated = self._client.gave_up(name, budget_ms, started_s, exc)
            if restated is exc:
                raise
            raise restated from exc
        finally:
            self._budget.deadline_s = None

    def _left_ms(self) -> int:
        """What is left of the running call's budget (see _within)."""
        deadline_s: float | None = getattr(self._budget, "deadline_s", None)
        if deadline_s is None:
            return self._default_api_timeout_ms
        return remaining_ms(deadline_s)

    def _controller(
        self, timeout_s: float
    ) -> tuple[str, partition_store_pb2_grpc.PartitionStoreStub]:
        """The store that keeps the topic catalog (any store forwards to it,
        but asking it directly saves a hop), and its address; metadata, when
        it must be fetched first, within timeout_s."""
        md = self._client.cached_metadata
        if md is None:
            md = self._client.metadata(timeout_ms=_ms(timeout_s))
        address = md.stores.get(md.controller_node_id, self._client.bootstrap[0])
        return address, self._client.store(address)

    def _rpc(self, address: str, method: Callable[..., T], request: Any, deadline_s: float,
             *, service: str = SERVICE) -> T:
        """method(request) (a stub method of `address`'s) with what is left
        until deadline_s; a call that reached no service raises an error
        naming the address (ClusterClient.rpc_error)."""
        try:
            answer = method(request, timeout=max(deadline_s - time.monotonic(), 0.001))
        except grpc.RpcError as rpc_exc:
            raise self._client.rpc_error(rpc_exc, address, service=service) from rpc_exc
        self._client.note_answered(address)
        return answer

    def _catalog_call(
        self, what: str,
        method: Callable[[partition_store_pb2_grpc.PartitionStoreStub], Callable[..., T]],
        request: Any,
    ) -> T:
        """A catalog request (method(stub): CreateTopics, ...) at the
        controller, with retries."""

        def attempt(timeout_s: float) -> T:
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            return self._rpc(address, method(stub), request, deadline_s)

        return self._call(what, attempt)

    def _metadata(self) -> ClusterMetadata:
        return self._call(
            "Metadata", lambda timeout_s: self._client.metadata(timeout_ms=_ms(timeout_s))
        )

    def _topic(self, name: str) -> TopicInfo:
        return self._call(
            "Metadata", lambda timeout_s: self._client.topic(name, timeout_ms=_ms(timeout_s))
        )

    def _refreshed_metadata(self) -> ClusterMetadata:
        return self._call(
            "Metadata",
            lambda timeout_s: self._client.refresh_metadata(timeout_ms=_ms(timeout_s)),
        )

    def _ask_each(self, addresses: Iterable[str], what: str,
                  attempt: Callable[[str, float], T]) -> list[T]:
        """attempt(address, timeout_s) at each address in turn, each with
        retries; the answers in the same order."""
        return [
            self._call(f"{what} at {address}", functools.partial(attempt, address))
            for address in addresses
        ]

    def _call(self, what: str, attempt: Callable[[float], T]) -> T:
        return self._client.call(what, attempt, timeout_ms=self._left_ms())

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()



def _binding_proto(binding: AclBinding) -> partition_store_pb2.AclBinding:
    return partition_store_pb2.AclBinding(
        principal=binding.principal, host=binding.host, resource_type=binding.resource_type,
        resource_name=binding.resource_name, pattern_type=binding.pattern_type,
        operation=binding.operation, permission=binding.permission,
    )


def _filter_proto(selector: AclFilter | AclBinding | None) -> partition_store_pb2.AclBindingFilter:
    """The wire's filter: "" for a field that matches anything."""
    if selector is None:
        return partition_store_pb2.AclBindingFilter(pattern_type="any")
    f = AclFilter.of(selector) if isinstance(selector, AclBinding) else selector
    if not isinstance(f, AclFilter):
        raise TypeError(f"an ACL filter is an AclFilter or an AclBinding, got {selector!r}")
    return partition_store_pb2.AclBindingFilter(
        principal=f.principal or "", host=f.host or "", resource_type=f.resource_type or "",
        resource_name=f.resource_name or "", pattern_type=f.pattern_type,
        operation=f.operation or "", permission=f.permission or "",
    )


def _binding_from_proto(b: partition_store_pb2.AclBinding) -> AclBinding:
    return AclBinding(principal=b.principal, host=b.host or "*", resource_type=b.resource_type,
                      resource_name=b.resource_name, pattern_type=b.pattern_type or "literal",
                      operation=b.operation, permission=b.permission or "allow")


def _acl_sort_key(b: AclBinding) -> tuple[str, ...]:
    return (b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
            b.operation, b.permission)


def _transaction_description(d: coordinator_pb2.TransactionDescription) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=d.transactional_id,
        state=d.state,
        producer_id=d.producer_id,
        producer_epoch=d.producer_epoch,
        transaction_timeout_ms=d.transaction_timeout_ms,
        transaction_start_time_ms=d.transaction_start_time_ms,
        partitions=tuple(sorted(TopicPartition(p.topic, p.partition) for p in d.partitions)),
        coordinator_epoch=d.coordinator_epoch,
        two_phase_commit=d.two_phase_commit,
        prepared_transaction=(
            PreparedTxnState(d.prepared_transaction.producer_id,
                             d.prepared_transaction.producer_epoch)
            if d.HasField("prepared_transaction") else None
        ),
    )


class _PerKeyAnswer(Protocol):
    """One item of a multi-key answer (a transaction's, a group's)."""

    @property
    def error(self) -> errors_pb2.Error: ...


A = TypeVar("A", bound=_PerKeyAnswer)


def _answer_for(items: Iterable[A], key_of: Callable[[A], str], key: str, what: str) -> A:
    """The item answering for `key`; raises its error, or UNKNOWN_SERVER_ERROR
    when the answer left the key out."""
    for item in items:
        if key_of(item) == key:
            raise_for_error(item.error)
            return item
    raise errors.error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"{what} answered nothing for {key!r}")


def _group_description(d: group_coordinator_pb2.GroupDescription) -> GroupDescription:
    return GroupDescription(
        group_id=d.group_id,
        state=d.state,
        group_epoch=d.group_epoch,
        members=tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id or None,
                member_epoch=m.member_epoch,
                subscribed_topics=tuple(m.subscribed_topics),
                assignment=tuple(sorted(
                    TopicPartition(tp.topic, tp.partition) for tp in m.assignment
                )),
            )
            for m in sorted(d.members, key=lambda m: m.member_id)
        ),
        coordinator_epoch=d.coordinator_epoch,
    )


def _producer_state(p: partition_store_pb2.ProducerStateView) -> ProducerState:
    return ProducerState(
        producer_id=p.producer_id,
        producer_epoch=p.producer_epoch,
        last_sequence=p.last_sequence,
        last_timestamp_ms=p.last_timestamp_ms,
        coordinator_epoch=p.coordinator_epoch,
        current_txn_start_offset=(
            None if p.current_txn_start_offset < 0 else p.current_txn_start_offset
        ),
    )


def _not_there_yet(address: str, topic: str, partition: int, exc: OncelogError) -> OncelogError:
    """A store that Metadata names as the partition's owner does not know the
    partition (yet): a topic just created reaches each store's catalog a moment
    after the controller's. Retried (with a metadata refresh); a topic that is
    really gone fails the next attempt's Metadata lookup instead."""
    return errors.error_for(
        ErrorCode.LEADER_NOT_AVAILABLE,
        f"store {address} does not know {topic}-{partition} yet: {exc.message or exc.code.name}",
    )
