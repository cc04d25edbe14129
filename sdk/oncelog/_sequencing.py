"""Per-partition sequencing and retry decisions of the idempotent producer.

Pure logic (no gRPC, no threads, no clock): the sender thread feeds it batches,
answers and `now_ms`, and it says what to send and what to fail. The rules:

* A batch gets the partition's next sequence when it is first sent, under the
  producer's id and epoch, and keeps them on every retry: a retry after a lost
  answer re-sends the identical batch, which the store recognises as one of
  the producer's last five and answers with its original offset.
* A partition's *window* runs from its oldest unacknowledged batch to its
  newest sent one, acknowledged batches in between included, and holds at most
  `max_in_flight` (<= 5) batches. So a batch that is retried has at most four
  batches written after it, and is still among the five the store remembers
  for deduplication (bounding only the unacknowledged ones is not enough:
  answers that arrive out of order would let newer batches push a retried one
  out of the store's memory, and its retry would be refused as OUT_OF_ORDER).
* Any retriable failure stops new sends on the partition; once nothing of it is
  in flight and the backoff has passed, every unacknowledged batch is re-sent
  in sequence order. OUT_OF_ORDER_SEQUENCE_NUMBER is such a failure when the
  attempt left while an older batch was unacknowledged (the store may have
  seen it before its predecessor); for an attempt that left as the oldest
  unacknowledged batch it is a real error.
* A batch that fails for good (a non-retriable error, or its delivery timeout)
  breaks the sequence. The partition is then UNRESOLVED: unacknowledged batches
  that may have been written are re-sent unchanged until each is known written
  (success or duplicate) or known not written (OUT_OF_ORDER: its predecessor is
  missing), or fails on its own. Then the partition asks for a sequence reset:
  the producer moves to a higher epoch (`PartitionSequencer.reset_sequences`),
  and the remaining batches, all known not written, are renumbered from 0.
  Renumbering never touches a batch that may be in the log, so a reset cannot
  write a record twice.
* In a transaction there is no sequence reset: a batch that fails for good
  fails the transaction, and the partition is HALTED (nothing more is sent)
  until the transaction is aborted. EndTxn's new epoch then restarts every
  partition at sequence 0 (the producer replaces its sequencers).
"""

from __future__ import annotations

import enum
import random
from collections import deque

from oncelog._batching import ProducerBatch
from oncelog._client import backoff_ms, needs_metadata_refresh
from oncelog._coordinators import concurrent_transactions_backoff_ms
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode, OncelogError
from oncelog.wire.records import next_sequence

# Answers after which the batch may or may not have been written.
UNKNOWN_OUTCOME = frozenset({
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.STORAGE_ERROR,
    ErrorCode.SHUTTING_DOWN,
})

# Answers that mean "a batch before this one is missing" when they come for an
# attempt sent while an older batch was unacknowledged; both also prove the
# batch is not in the log.
_PREDECESSOR_MISSING = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.UNKNOWN_PRODUCER_ID,
})


class PartitionMode(enum.Enum):
    """What the partition's sender may do.

    READY       action: send new batches (up to max_in_flight unacknowledged).
                transition: RETRYING on a retriable failure; UNRESOLVED on a
                permanent one.
    RETRYING    action: send nothing until no batch is in flight and the backoff
                has passed, then re-send every unacknowledged batch in order.
                transition: READY after that re-send; UNRESOLVED on a permanent
                failure.
    UNRESOLVED  action: like RETRYING, but only while some unacknowledged batch
                may have been written.
                transition: NEEDS_RESET once none may have been.
    NEEDS_RESET action: send nothing; the producer must bump its epoch.
                transition: READY in reset_sequences().
    HALTED      (transactional) action: send nothing; a batch failed for good,
                so the transaction must be aborted.
                transition: none; the producer drops the sequencer when the
                transaction ends.
    """

    READY = "ready"
    RETRYING = "retrying"
    UNRESOLVED = "unresolved"
    NEEDS_RESET = "needs_reset"
    HALTED = "halted"


class PartitionSequencer:
    """Sequence numbers and the unacknowledged batches of one partition."""

    def __init__(
        self,
        *,
        idempotent: bool,
        max_in_flight: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int,
        transactional: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        """`rng` draws the retry backoffs' jitter: a seeded one makes a run
        reproducible (the simulation), None uses the client module's."""
        self.idempotent = idempotent
        self.rng = rng
        self.transactional = transactional
        self.max_in_flight = max_in_flight
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self.next_sequence = 0
        # In sequence order: from the oldest unacknowledged batch to the newest
        # sent one; acknowledged batches leave from the front only.
        self.window: deque[ProducerBatch] = deque()
        self.in_flight_count = 0
        self.mode = PartitionMode.READY
        self.retry_at_ms = 0

    def __repr__(self) -> str:
        return (
            f"PartitionSequencer(mode={self.mode.name}, pid={self.producer_id}, "
            f"epoch={self.producer_epoch}, next_seq={self.next_sequence}, "
            f"window={len(self.window)}, in_flight={self.in_flight_count})"
        )

    @property
    def unacked(self) -> list[ProducerBatch]:
        """Sent (or about to be) and not yet known written, in sequence order."""
        return [b for b in self.window if not b.acked]

    @property
    def idle(self) -> bool:
        return not self.window and self.mode is PartitionMode.READY

    def can_take_new(self) -> bool:
        return self.mode is PartitionMode.READY and len(self.window) < self.max_in_flight

    def assign(self, batch: ProducerBatch, *, producer_id: int, producer_epoch: int) -> None:
        """Numbers a batch taken from the accumulator and encodes it.

        The partition moves to the producer's current id and epoch (starting
        again at sequence 0) only when nothing is unacknowledged: batches still
        to be retried under the old epoch must not be overtaken by new ones."""
        if self.idempotent:
            if self.transactional:
                batch.transactional = True
            if not self.window and (producer_id, producer_epoch) != (
                self.producer_id, self.producer_epoch,
            ):
                self.producer_id = producer_id
                self.producer_epoch = producer_epoch
                self.next_sequence = 0
            batch.encode(
                producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                base_sequence=self.next_sequence,
            )
            self.next_sequence = next_sequence(self.next_sequence, batch.record_count)
        else:
            batch.encode(producer_id=-1, producer_epoch=-1, base_sequence=-1)
        batch.needs_send = True
        self.window.append(batch)

    def batches_to_send(self, now_ms: int) -> list[ProducerBatch]:
        """The batches to put on the wire now, in sequence order; they are
        marked in flight."""
        mode = self.mode
        if mode is PartitionMode.READY:
            out = [b for b in self.window if b.needs_send]
        elif (mode is PartitionMode.NEEDS_RESET or mode is PartitionMode.HALTED
              or self.in_flight_count or now_ms < self.retry_at_ms):
            return []
        elif mode is PartitionMode.RETRYING:
            self.mode = PartitionMode.READY
            out = self.unacked
        else:  # UNRESOLVED
            out = self.unacked
            if not any(b.maybe_landed for b in out):
                self.mode = PartitionMode.NEEDS_RESET
                return []
        oldest = self.window[0] if self.window else None
        for batch in out:
            batch.needs_send = False
            batch.in_flight = True
            batch.attempts += 1
            batch.sent_as_oldest = batch is oldest
        self.in_flight_count += len(out)
        return out

    def waits_for_a_leader(self, now_ms: int) -> bool:
        """Whether the partition waits out a retry backoff after an
        answer that says its leader may have moved (or none came from it):
        nothing in flight, and the last error is one after which the
        metadata is asked again."""
        if (self.mode not in (PartitionMode.RETRYING, PartitionMode.UNRESOLVED)
                or self.in_flight_count or now_ms >= self.retry_at_ms):
            return False
        for batch in self.window:
            if not batch.acked:
                last = batch.last_error
                return isinstance(last, OncelogError) and needs_metadata_refresh(last)
        return False

    def retry_now(self) -> None:
        """Ends the backoff: the metadata shows another leader than the
        one the last attempt went to, and the backoff was for that one
        (Kafka's KIP-951: the producer skips the backoff when the leader
        changed)."""
        self.retry_at_ms = 0

    def expire(self, now_ms: int) -> list[tuple[ProducerBatch, OncelogError]]:
        """Fails unacknowledged batches that are not in flight and are past their
        delivery deadline (in flight ones are judged when their answer comes)."""
        failed: list[tuple[ProducerBatch, OncelogError]] = []
        for batch in self.unacked:
            if not batch.in_flight and now_ms >= batch.deadline_ms:
                failed.append((batch, self._fail(batch, self._timeout_error(batch))))
        return failed

    def on_success(self, batch: ProducerBatch) -> None:
        self._landed(batch)
        batch.acked = True
        window = self.window
        while window and window[0].acked:
            window.popleft()

    def on_error(
        self, batch: ProducerBatch, exc: OncelogError, now_ms: int, *, dispatched: bool
    ) -> OncelogError | None:
        """Decides about a failed send of `batch` (`dispatched`: the attempt
        reached the wire): returns the error to fail it with, or None when it
        stays to be sent again.

        `maybe_landed` only ever grows, except on OUT_OF_ORDER (and
        UNKNOWN_PRODUCER_ID), the answers that prove the batch is not in the log:
        a plain rejection of this attempt says nothing about an earlier attempt
        whose answer was lost."""
        self._landed(batch)
        batch.last_error = exc
        code = exc.code
        if code in _PREDECESSOR_MISSING:
            batch.maybe_landed = False
        elif dispatched and code in UNKNOWN_OUTCOME:
            batch.maybe_landed = True
        if self.idempotent and code in _PREDECESSOR_MISSING:
            if self.mode in (PartitionMode.UNRESOLVED, PartitionMode.NEEDS_RESET,
                             PartitionMode.HALTED):
                # Expected: the batch that failed before this one did not land.
                return None
            if not batch.sent_as_oldest:
                # A predecessor was unacknowledged when this attempt left: the
                # store may have seen this one first (answers and even requests
                # can overtake each other). Retry after it.
                self._retry_later(batch, now_ms)
                return None
            return self._fail(batch, exc)
        if self._retriable(batch, exc):
            if now_ms >= batch.deadline_ms:
                return self._fail(batch, self._timeout_error(batch))
            self._retry_later(batch, now_ms)
            return None
        return self._fail(batch, exc)

    def reset_sequences(self, *, producer_id: int, producer_epoch: int) -> None:
        """After the producer moved to a new epoch (or id): renumbers the
        remaining unacknowledged batches, all known not written, from 0."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        sequence = 0
        self.window = deque(self.unacked)
        for batch in self.window:
            batch.restamp(
                producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=sequence
            )
            sequence = next_sequence(sequence, batch.record_count)
            batch.needs_send = True
            batch.maybe_landed = False
        self.next_sequence = sequence
        self.mode = PartitionMode.READY

    def discard_unsent(self) -> list[ProducerBatch]:
        """Removes and returns the unacknowledged batches that are not in flight
        (the transaction is being aborted: they will not be sent); in-flight
        ones stay until their answer comes. The partition is HALTED."""
        out = [b for b in self.window if not b.acked and not b.in_flight]
        if out:
            self.window = deque(b for b in self.window if b.acked or b.in_flight)
            while self.window and self.window[0].acked:
                self.window.popleft()
        self.mode = PartitionMode.HALTED
        return out

    def fail_all(self) -> list[ProducerBatch]:
        """Drops every unacknowledged batch (the producer is going away)."""
        out = self.unacked
        self.window.clear()
        return out

    # ------------------------------------------------------------- helpers

    def _landed(self, batch: ProducerBatch) -> None:
        if batch.in_flight:
            batch.in_flight = False
            self.in_flight_count -= 1

    @staticmethod
    def _retriable(batch: ProducerBatch, exc: OncelogError) -> bool:
        if exc.retriable:
            return True
        # Our metadata may be older than the topic: one more try after a refresh.
        if exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not batch.unknown_topic_retried:
            batch.unknown_topic_retried = True
            return True
        return False

    def _retry_later(self, batch: ProducerBatch, now_ms: int) -> None:
        if self.mode is PartitionMode.READY:
            self.mode = PartitionMode.RETRYING
        last = batch.last_error
        if isinstance(last, OncelogError) and last.code is ErrorCode.CONCURRENT_TRANSACTIONS:
            # The store could not add the partition to the transaction yet: the
            # previous transaction's markers are still being written, which
            # takes milliseconds, so the usual backoff would only add latency.
            pause = concurrent_transactions_backoff_ms(batch.attempts, rng=self.rng)
        else:
            pause = backoff_ms(
                batch.attempts, base_ms=self.retry_backoff_ms, max_ms=self.retry_backoff_max_ms,
                rng=self.rng,
            )
        self.retry_at_ms = max(self.retry_at_ms, now_ms + pause)
        batch.needs_send = True

    def _fail(self, batch: ProducerBatch, exc: OncelogError) -> OncelogError:
        self.window.remove(batch)
        window = self.window
        while window and window[0].acked:
            window.popleft()
        if self.transactional:
            self.mode = PartitionMode.HALTED
        elif self.idempotent:
            self.mode = PartitionMode.UNRESOLVED
        return exc

    @staticmethod
    def _timeout_error(batch: ProducerBatch) -> OncelogError:
        last = batch.last_error
        detail = ""
        if last is not None:
            detail = f"; last error: {type(last).__name__}: {last}"
        landed = " (it may have been written)" if batch.maybe_landed else ""
        return errors.KafkaTimeoutError(
            f"batch of {batch.record_count} records for {batch.topic}-{batch.partition} "
            f"not acknowledged within delivery_timeout_ms after {batch.attempts} "
            f"attempts{landed}{detail}"
        )
