"""Admin's transaction calls: list, describe and abort transactions; describe
producers; find and abort hanging transactions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import grpc

from oncelog._admin_base import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    OPEN_TRANSACTION_STATES,
    AdminBase,
    T,
    _answer_for,
    _not_there_yet,
    _within_budget,
)
from oncelog._client import (
    error_from_proto,
    raise_for_error,
    remaining_ms,
)
from oncelog._coordinators import TRANSACTION, CoordinatorLocator, call_coordinator
from oncelog.types import (
    HangingTransaction,
    PreparedTxnState,
    ProducerState,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from oncelog.v1 import (
    coordinator_pb2,
    partition_store_pb2,
    records_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.proto_enums import TRANSACTION_STATES
from oncelog.wire.records import MAX_PRODUCER_EPOCH
from oncelog.wire.vocabulary import TransactionState


class TransactionsAdmin(AdminBase):
    """Lists, describes and aborts transactions; finds and aborts hanging ones."""

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
        texts = TRANSACTION_STATES.texts_of(states or ())
        request = coordinator_pb2.ListTransactionsRequest(
            states=texts, states_enum=TRANSACTION_STATES.numbers_of(texts),
            producer_ids=list(producer_ids or ()),
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
                    t.transactional_id, t.producer_id,
                    TransactionState.reported(TRANSACTION_STATES.response_text(t.state_enum,
                                                                               t.state)),
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
        names = sorted(self._user_topics()) if topics is None else list(topics)
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
                states=list(OPEN_TRANSACTION_STATES),
                states_enum=TRANSACTION_STATES.numbers_of(OPEN_TRANSACTION_STATES),
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
                if d.error.code != 0 or TRANSACTION_STATES.response_text(
                        d.state_enum, d.state) not in OPEN_TRANSACTION_STATES:
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


def _transaction_description(d: coordinator_pb2.TransactionDescription) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=d.transactional_id,
        state=TransactionState.reported(TRANSACTION_STATES.response_text(d.state_enum, d.state)),
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
