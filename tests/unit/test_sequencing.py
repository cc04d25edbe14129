"""The idempotent producer's per-partition decisions, without any network.

Goal: sequence numbers are assigned once per batch and wrap at 2^31; retries
re-send the identical bytes, every unacknowledged batch in order, after a
backoff and only once nothing is in flight; OUT_OF_ORDER on a batch behind a
missing one means "retry after it", on the oldest one it is an error; after a
permanent failure, batches that may have been written are resolved under their
old numbers and only batches known not written are renumbered under a new
epoch (so a reset can never write a record twice); delivery timeouts fail
batches that are not in flight.

Method: a PartitionSequencer fed by hand with batches, answers (error codes)
and times, as the sender thread would feed it.
"""

from __future__ import annotations

import pytest

from oncelog import errors
from oncelog._batching import ProducerBatch
from oncelog._client import BACKOFF_JITTER
from oncelog._sequencing import PartitionMode, PartitionSequencer
from oncelog.errors import ErrorCode
from oncelog.records import MAX_SEQUENCE, iter_records, read_header

PID = 1000
DELIVERY_MS = 10_000


def seq_(*, idempotent: bool = True, max_in_flight: int = 5) -> PartitionSequencer:
    return PartitionSequencer(idempotent=idempotent, max_in_flight=max_in_flight,
                              retry_backoff_ms=100, retry_backoff_max_ms=1_000)


def batch(n: int, *, now_ms: int = 0, tag: str = "r") -> ProducerBatch:
    b = ProducerBatch("t", 0, created_ms=now_ms, deadline_ms=now_ms + DELIVERY_MS,
                      limit_bytes=1 << 20)
    for i in range(n):
        b.add(None, f"{tag}{i}".encode(), None, 1)
    return b


def err(code: ErrorCode) -> errors.OncelogError:
    return errors.error_for(code, code.name)


def identity(b: ProducerBatch) -> tuple[int, int, int]:
    assert b.data is not None
    h = read_header(b.data)
    return h.producer_id, h.producer_epoch, h.base_sequence


def send_new(s: PartitionSequencer, *batches: ProducerBatch, epoch: int = 0,
             now_ms: int = 0) -> list[ProducerBatch]:
    for b in batches:
        s.assign(b, producer_id=PID, producer_epoch=epoch)
    return s.batches_to_send(now_ms)


def test_sequences_follow_record_counts() -> None:
    s = seq_()
    a, b, c = batch(3), batch(2), batch(4)
    assert send_new(s, a, b, c) == [a, b, c]
    assert [identity(x) for x in (a, b, c)] == [(PID, 0, 0), (PID, 0, 3), (PID, 0, 5)]
    assert s.next_sequence == 9
    assert s.in_flight_count == 3
    assert s.batches_to_send(0) == []  # already in flight


def test_sequences_wrap_at_2_pow_31() -> None:
    s = seq_()
    first = batch(1)
    send_new(s, first)
    s.on_success(first)
    s.next_sequence = MAX_SEQUENCE - 1
    b = batch(3)
    send_new(s, b)
    assert b.base_sequence == MAX_SEQUENCE - 1
    assert b.last_sequence == 0
    assert s.next_sequence == 1


def test_at_most_max_in_flight_unacknowledged() -> None:
    s = seq_(max_in_flight=2)
    a, b = batch(1), batch(1)
    send_new(s, a, b)
    assert not s.can_take_new()
    s.on_success(b)  # answers may come out of order; a still holds the window open
    assert not s.can_take_new()
    s.on_success(a)
    assert s.idle and s.can_take_new()


def test_retriable_error_resends_every_unacknowledged_batch_in_order() -> None:
    s = seq_()
    a, b, c = batch(1, tag="a"), batch(1, tag="b"), batch(1, tag="c")
    send_new(s, a, b, c)
    before = [x.data for x in (a, b, c)]
    assert s.on_error(a, err(ErrorCode.NOT_LEADER_OR_FOLLOWER), 10, dispatched=True) is None
    assert s.mode is PartitionMode.RETRYING
    assert not s.can_take_new()
    # c answers OUT_OF_ORDER: its predecessor a is missing. Not an error.
    assert s.on_error(c, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 11, dispatched=True) is None
    assert s.batches_to_send(500) == []  # b is still in flight
    assert s.on_error(b, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 12, dispatched=True) is None
    assert s.batches_to_send(50) == []  # backoff (100 ms) not over
    assert s.batches_to_send(200) == [a, b, c]
    assert [x.data for x in (a, b, c)] == before  # the same bytes, the same sequences
    assert s.mode is PartitionMode.READY
    assert [x.attempts for x in (a, b, c)] == [2, 2, 2]


def test_out_of_order_on_the_oldest_batch_is_an_error() -> None:
    s = seq_()
    a, b = batch(1), batch(1)
    send_new(s, a, b)
    failure = s.on_error(a, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 5, dispatched=True)
    assert isinstance(failure, errors.OncelogError)
    assert failure.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert s.mode is PartitionMode.UNRESOLVED
    assert s.unacked == [b]


def test_non_retriable_failure_renumbers_only_batches_known_not_written() -> None:
    s = seq_()
    a, b, c = batch(2, tag="a"), batch(3, tag="b"), batch(1, tag="c")
    send_new(s, a, b, c)
    failure = s.on_error(a, err(ErrorCode.CORRUPT_MESSAGE), 5, dispatched=True)
    assert failure is not None and failure.code is ErrorCode.CORRUPT_MESSAGE
    # Its successors come back OUT_OF_ORDER: expected now, not errors.
    assert s.on_error(b, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 6, dispatched=True) is None
    assert s.on_error(c, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 6, dispatched=True) is None
    assert not b.maybe_landed and not c.maybe_landed
    assert s.batches_to_send(1_000) == []
    assert s.mode is PartitionMode.NEEDS_RESET
    s.reset_sequences(producer_id=PID, producer_epoch=1)
    assert [identity(b), identity(c)] == [(PID, 1, 0), (PID, 1, 3)]
    assert [r.value for r in iter_records(b.data or b"")] == [b"b0", b"b1", b"b2"]
    assert s.next_sequence == 4
    assert s.batches_to_send(1_000) == [b, c]
    # New batches continue the new numbering.
    d = batch(1)
    s.assign(d, producer_id=PID, producer_epoch=1)
    assert identity(d) == (PID, 1, 4)


def test_a_batch_that_may_have_been_written_is_resolved_under_its_old_numbers() -> None:
    s = seq_()
    a = batch(1, now_ms=0, tag="a")
    b = batch(1, now_ms=5_000, tag="b")
    send_new(s, a, b)
    # Both answers are lost: either may be in the log.
    assert s.on_error(a, err(ErrorCode.NETWORK_EXCEPTION), 10, dispatched=True) is None
    assert s.on_error(b, err(ErrorCode.NETWORK_EXCEPTION), 10, dispatched=True) is None
    assert a.maybe_landed and b.maybe_landed
    # a runs out of time; b does not.
    failed = s.expire(DELIVERY_MS)
    assert [x for x, _ in failed] == [a]
    assert isinstance(failed[0][1], errors.KafkaTimeoutError)
    assert "may have been written" in failed[0][1].message
    assert s.mode is PartitionMode.UNRESOLVED
    old = identity(b)
    assert s.batches_to_send(DELIVERY_MS) == [b]
    assert identity(b) == old  # never renumbered while it may be in the log
    # The store says b is not in the log (a was not either): now it may be renumbered.
    assert s.on_error(b, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), DELIVERY_MS,
                      dispatched=True) is None
    assert s.batches_to_send(DELIVERY_MS + 1) == []
    assert s.mode is PartitionMode.NEEDS_RESET
    s.reset_sequences(producer_id=PID, producer_epoch=1)
    assert identity(b) == (PID, 1, 0)


def test_resolution_by_success_then_reset_for_new_batches() -> None:
    s = seq_()
    a, b = batch(1, now_ms=0), batch(1, now_ms=5_000)
    send_new(s, a, b)
    s.on_error(a, err(ErrorCode.REQUEST_TIMED_OUT), 10, dispatched=True)
    s.on_error(b, err(ErrorCode.REQUEST_TIMED_OUT), 10, dispatched=True)
    s.expire(DELIVERY_MS)
    assert s.batches_to_send(DELIVERY_MS) == [b]
    s.on_success(b)  # b landed, so a did too: it was reported as "may have been written"
    assert s.batches_to_send(DELIVERY_MS) == []
    assert s.mode is PartitionMode.NEEDS_RESET
    s.reset_sequences(producer_id=PID, producer_epoch=1)
    assert s.idle


def test_a_plain_rejection_does_not_clear_an_earlier_unknown_outcome() -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a)
    s.on_error(a, err(ErrorCode.NETWORK_EXCEPTION), 10, dispatched=True)
    assert a.maybe_landed
    s.batches_to_send(1_000)
    # The retry hits a store that no longer owns the partition: says nothing
    # about the first attempt.
    s.on_error(a, err(ErrorCode.NOT_LEADER_OR_FOLLOWER), 1_001, dispatched=True)
    assert a.maybe_landed
    # An attempt that never left (no leader known) changes nothing either.
    s.batches_to_send(2_000)
    s.on_error(a, err(ErrorCode.LEADER_NOT_AVAILABLE), 2_000, dispatched=False)
    assert a.maybe_landed


def test_unknown_outcome_batches_are_retried_until_their_deadline() -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a)
    now = 0
    data = a.data
    for _ in range(5):
        now += 1_000
        assert s.on_error(a, err(ErrorCode.NETWORK_EXCEPTION), now, dispatched=True) is None
        assert s.retry_at_ms > now
        assert s.batches_to_send(s.retry_at_ms) == [a]
        now = max(now, s.retry_at_ms)
        assert a.data is data
    failure = s.on_error(a, err(ErrorCode.NETWORK_EXCEPTION), DELIVERY_MS, dispatched=True)
    assert isinstance(failure, errors.KafkaTimeoutError)
    assert "NetworkError" in failure.message


def test_unknown_topic_is_retried_once() -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a)
    assert s.on_error(a, err(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 1, dispatched=True) is None
    assert s.batches_to_send(1_000) == [a]
    failure = s.on_error(a, err(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), 1_001, dispatched=True)
    assert failure is not None and failure.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_backoff_grows_with_attempts() -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a)
    now = 0
    pauses = []
    for _ in range(6):
        s.on_error(a, err(ErrorCode.STORAGE_ERROR), now, dispatched=True)
        pauses.append(s.retry_at_ms - now)
        now = s.retry_at_ms
        assert s.batches_to_send(now) == [a]
    # Doubling up to the cap, each spread by KIP-580's jitter.
    for pause, term in zip(pauses, [100, 200, 400, 800, 1_000, 1_000], strict=True):
        assert term * (1 - BACKOFF_JITTER) - 1 <= pause <= term * (1 + BACKOFF_JITTER), pauses


def test_partition_adopts_a_new_epoch_only_when_idle() -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a, epoch=0)
    b = batch(1)
    s.assign(b, producer_id=PID, producer_epoch=3)  # a still unacknowledged: keep epoch 0
    assert identity(b) == (PID, 0, 1)
    s.batches_to_send(0)
    s.on_success(a)
    s.on_success(b)
    c = batch(1)
    s.assign(c, producer_id=PID, producer_epoch=3)
    assert identity(c) == (PID, 3, 0)


def test_without_idempotence_there_are_no_sequences_and_no_resets() -> None:
    s = seq_(idempotent=False)
    a, b = batch(1), batch(1)
    send_new(s, a, b)
    assert identity(a) == (-1, -1, -1)
    failure = s.on_error(a, err(ErrorCode.CORRUPT_MESSAGE), 1, dispatched=True)
    assert failure is not None
    assert s.mode is PartitionMode.READY
    s.on_success(b)
    assert s.idle


@pytest.mark.parametrize("code", [ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.MESSAGE_TOO_LARGE])
def test_other_permanent_errors_fail_the_batch(code: ErrorCode) -> None:
    s = seq_()
    a = batch(1)
    send_new(s, a)
    failure = s.on_error(a, err(code), 1, dispatched=True)
    assert failure is not None and failure.code is code
    assert s.batches_to_send(10) == []
    assert s.mode is PartitionMode.NEEDS_RESET


def test_the_window_is_anchored_at_the_oldest_unacknowledged_batch() -> None:
    """Out-of-order answers must not let new batches push a batch that is
    waiting for a retry out of the store's five-batch deduplication memory."""
    s = seq_(max_in_flight=5)
    window = [batch(1, tag=f"b{i}") for i in range(5)]
    send_new(s, *window)
    # The answer of the first one is lost; the next four are acknowledged.
    s.on_error(window[0], err(ErrorCode.NETWORK_EXCEPTION), 1, dispatched=True)
    for b in window[1:]:
        s.on_success(b)
    assert len(s.window) == 5
    assert not s.can_take_new()  # four batches already landed after window[0]
    assert s.batches_to_send(1_000) == [window[0]]
    s.on_success(window[0])
    assert s.idle and s.can_take_new()


def test_out_of_order_is_judged_by_the_window_when_the_attempt_left() -> None:
    """A store may handle the second request before the first: the second batch
    gets OUT_OF_ORDER, and its answer may arrive after the first one's ack.
    It left behind an unacknowledged batch, so it is retried, not failed."""
    s = seq_()
    a, b = batch(1), batch(1)
    send_new(s, a, b)
    s.on_success(a)  # b is now the oldest, but it was not when it was sent
    assert s.on_error(b, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 1, dispatched=True) is None
    assert s.batches_to_send(1_000) == [b]
    # Sent again as the oldest: now OUT_OF_ORDER is real.
    failure = s.on_error(b, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 1_001, dispatched=True)
    assert failure is not None and failure.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# ------------------------------------------------------------ transactional


def txn_seq() -> PartitionSequencer:
    return PartitionSequencer(idempotent=True, max_in_flight=5, retry_backoff_ms=100,
                              retry_backoff_max_ms=1_000, transactional=True)


def test_transactional_batches_are_marked_and_a_failure_halts_without_reset() -> None:
    s = txn_seq()
    b1, b2, b3 = batch(2), batch(2), batch(2)
    assert send_new(s, b1, b2, b3) == [b1, b2, b3]
    assert all(b.data is not None and read_header(b.data).is_transactional
               for b in (b1, b2, b3))
    # The first batch fails for good: the transaction must be aborted; no
    # sequence reset is asked for (EndTxn gives the new epoch).
    assert isinstance(s.on_error(b1, err(ErrorCode.CORRUPT_MESSAGE), 10, dispatched=True),
                      errors.CorruptRecordError)
    assert s.mode is PartitionMode.HALTED
    # The batches behind it are refused as out of order: expected, kept.
    assert s.on_error(b2, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 10,
                      dispatched=True) is None
    assert s.batches_to_send(10_000) == []
    # Discarding (abort) takes what is not in flight and leaves in-flight ones.
    assert s.discard_unsent() == [b2]
    assert list(s.window) == [b3] and b3.in_flight
    s.on_success(b3)
    assert not s.window and s.mode is PartitionMode.HALTED


def test_an_out_of_order_answer_for_the_oldest_batch_fails_it_in_a_transaction() -> None:
    s = txn_seq()
    [b1] = send_new(s, batch(1))
    exc = s.on_error(b1, err(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), 5, dispatched=True)
    assert isinstance(exc, errors.OutOfOrderSequenceNumberError)
    assert s.mode is PartitionMode.HALTED


def test_concurrent_transactions_from_the_store_is_retried_after_a_short_pause() -> None:
    """The store could not add the partition yet (the previous transaction's
    markers are landing): the same batch, same numbers, goes again after
    2 ms, doubling to 20 ms, not after retry_backoff_ms."""
    s = txn_seq()
    a = batch(1)
    send_new(s, a)
    sent_as = identity(a)
    now = 0
    pauses = []
    for _ in range(6):
        assert s.on_error(a, err(ErrorCode.CONCURRENT_TRANSACTIONS), now, dispatched=True) is None
        pauses.append(s.retry_at_ms - now)
        now = s.retry_at_ms
        assert s.batches_to_send(now) == [a]
        assert identity(a) == sent_as
    for pause, term in zip(pauses, [2, 4, 8, 16, 20, 20], strict=True):
        assert int(term * (1 - BACKOFF_JITTER)) <= pause <= term * (1 + BACKOFF_JITTER), pauses
    # Another retriable error keeps the usual backoff.
    s.on_error(a, err(ErrorCode.NOT_COORDINATOR), now, dispatched=True)
    assert s.retry_at_ms - now >= 100
