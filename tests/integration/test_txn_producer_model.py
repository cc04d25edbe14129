"""A stateful property test of one transactional producer against a real cluster.

Goal: whatever sequence of calls an application makes on a transactional
producer — legal or not in the state it is in, with records that fail in any
of the cheap ways a record can fail — the producer answers each call as
docs/sdk.md says ("The state table", "What is fatal, abortable, retried"),
and read_committed readers and the group's committed offsets see exactly the
transactions that committed: every record of each, once, in send order per
partition, and nothing of any other.

Method: hypothesis's RuleBasedStateMachine drives ONE transactional
producer of a fresh transactional id per example (plus the offsets of one
group, sent with send_offsets_to_transaction) against one LocalCluster (real
processes) shared by the module; each example has topics of its own. Each
step draws the next call from a menu for the model's state:
init_transactions, begin_transaction, send of good records (to a partition,
by key, or sticky; some exactly at the topic's max.message.bytes), send of a
bad one (over max.message.bytes, an unknown topic or partition within
max_block_ms, a bad argument, a record the store refuses — that one fails
later, on the sender thread, so the transaction is "doomed" until the
failure is observed), send_offsets_to_transaction, commit_transaction,
abort_transaction and flush. Every menu holds every call, so illegal calls
are made too. An independent model, written from the docs (it does not
import the SDK's _transactions table), says which calls each state accepts,
which error each refusal raises (IllegalStateError, or the
TransactionAbortableError naming the failed record in abortable_error), what
a refused call leaves unchanged (the state, the producer id and epoch, what
is visible), and which records and offsets each commit makes visible.
Values are unique per send, so a lost or duplicated record shows.

Checked: after every step, transaction_state against the model; after each
commit and abort, what a read_committed consumer of the output topics sees
(values and offsets, per partition, once the last stable offset has reached
the high watermark), the offsets the records' futures reported, the epoch
bump, and Admin.list_group_offsets, against the model's committed records
and offsets; after a refused commit and after flush, that nothing of the
open transaction is readable; at the end of each example, after close()
(which aborts an open transaction), a full read from offset 0 by a fresh
reader and the group's offsets.

Not covered here (tests/integration/test_txn_client_failures.py has them):
the slow failures that need a paused store (buffer memory full past
max_block_ms, delivery_timeout_ms), fencing, coordinator moves.

Runs: the default is a fixed (derandomized) set of EXAMPLES=100 sequences of
up to STEPS=20 steps, about 20 s. A failure prints every call of its
sequence and what each answered. Environment variables:
ONCELOG_MODEL_EXAMPLES=400 runs more sequences, ONCELOG_MODEL_STEPS=40
longer ones, ONCELOG_MODEL_SEED=<n> a different (still repeatable) set, and
ONCELOG_MODEL_SHRINK=1 shrinks a failure to its shortest sequence (minutes):

    ONCELOG_MODEL_EXAMPLES=400 ONCELOG_MODEL_SEED=7 \\
        .venv/bin/pytest -q tests/integration/test_txn_producer_model.py
"""

from __future__ import annotations

import enum
import itertools
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, note, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from oncelog import (
    Admin,
    Consumer,
    GroupMetadata,
    NewTopic,
    Producer,
    RecordMetadata,
    TopicPartition,
    errors,
)
from oncelog.records import HEADER_SIZE_BYTES
from oncelog.testing import LocalCluster

EXAMPLES = int(os.environ.get("ONCELOG_MODEL_EXAMPLES", "100"))
STEPS = int(os.environ.get("ONCELOG_MODEL_STEPS", "20"))
SEED = os.environ.get("ONCELOG_MODEL_SEED")
# Shrinking replays candidate sequences against the real cluster and takes
# minutes; by default a failure is reported as found (every call it made and
# what each answered is printed), and ONCELOG_MODEL_SHRINK=1 shrinks it.
SHRINK = os.environ.get("ONCELOG_MODEL_SHRINK") == "1"

# Topic "a" (two partitions) is small, so a record can be too large for it.
SMALL_TOPIC_MAX_BYTES = 1_000
# An encoded batch of one record: the header + 28 per record + key + value.
BATCH_OF_ONE_OVERHEAD_BYTES = HEADER_SIZE_BYTES + 28
# Short, so a send to a missing topic or partition gives up quickly. Every
# blocking call gets an explicit timeout instead of this default budget.
MAX_BLOCK_MS = 300
CALL_TIMEOUT_S = 30.0
# How long a commit or abort may take to show (its markers are written after
# EndTxn is answered) before the check fails.
SETTLE_S = 20.0

_examples = itertools.count()


# ----------------------------------------------------------------- the model
#
# The producer's states as docs/sdk.md's state table names them; the model
# needs only those a single-threaded caller can see between calls (committing
# and aborting are passed through inside one call).

UNINITIALIZED = "uninitialized"
READY = "ready"
IN_TRANSACTION = "in_transaction"
ABORTABLE_ERROR = "abortable_error"

# Which calls each state accepts (docs/sdk.md, "The state table"). flush()
# is not a transactional call: every state accepts it.
ACCEPTS: dict[str, frozenset[str]] = {
    UNINITIALIZED: frozenset({"init_transactions"}),
    READY: frozenset({"begin_transaction"}),
    IN_TRANSACTION: frozenset({"send", "send_offsets_to_transaction", "commit_transaction",
                               "abort_transaction"}),
    ABORTABLE_ERROR: frozenset({"abort_transaction"}),
}
# The calls a state refuses with its own error (a TransactionAbortableError
# caused by the failed record) instead of IllegalStateError.
RAISES_STATE_ERROR: dict[str, frozenset[str]] = {
    ABORTABLE_ERROR: frozenset({"send", "send_offsets_to_transaction", "commit_transaction"}),
}



# What the one rule may call in each state, weighted by repetition; "send" is
# a good record, "send_bad" one that fails.
_CALLS = ("init_transactions", "begin_transaction", "send", "send_bad",
          "send_offsets_to_transaction", "commit_transaction", "abort_transaction", "flush")


def _menu(**weights: int) -> tuple[str, ...]:
    """Every call once, those named `weights` times (first: the simplest)."""
    first = [call for call in weights for _ in range(weights[call])]
    return tuple(first + [call for call in _CALLS if call not in weights])


MENUS: dict[str, tuple[str, ...]] = {
    UNINITIALIZED: _menu(init_transactions=6),
    READY: _menu(begin_transaction=8),
    IN_TRANSACTION: _menu(send=8, commit_transaction=3, send_bad=2,
                          send_offsets_to_transaction=2, abort_transaction=2),
    ABORTABLE_ERROR: _menu(abort_transaction=4, send=2, commit_transaction=2),
}


def expected_refusal(state: str, call: str) -> type[errors.OncelogError] | None:
    """None when the model's `state` accepts `call`, else the error it must raise."""
    if call == "flush" or call in ACCEPTS[state]:
        return None
    if call in RAISES_STATE_ERROR.get(state, frozenset()):
        return errors.TransactionAbortableError
    return errors.IllegalStateError


@dataclass
class Sent:
    """A record of the open transaction whose send() returned a future."""

    value: bytes
    tp_asked: TopicPartition | None  # None: the producer picks (key or sticky)
    topic: str
    future: Future[RecordMetadata]
    good: bool


@dataclass
class Txn:
    """The open transaction, as the model knows it."""

    sent: list[Sent] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    # Patterns of the failed records the producer may name as the one that
    # broke the transaction (the first to fail; with a record failing on the
    # sender thread, the model cannot tell which one came first).
    failures: list[str] = field(default_factory=list)
    # A record was refused by the store, asynchronously: the producer is in
    # in_transaction until the sender sees the answer, then abortable_error.
    doomed: bool = False
    # It was doomed at some point: the menu of the next calls is the
    # abortable one from then on (see step()).
    was_doomed: bool = False
    # Offsets were added: the coordinator knows the transaction, so its
    # commit or abort must bump the epoch (so must an acknowledged record).
    reached: bool = False
    # Something of it may have reached the coordinator: a record queued
    # (good, or one the store refuses) or offsets. An abort of a transaction
    # without any ends it locally: no EndTxn, the same epoch.
    maybe_reached: bool = False


class Bad(enum.Enum):
    """The cheap ways a record of a transaction fails for good."""

    TOO_LARGE = "too_large"                     # over max.message.bytes: failed future
    UNKNOWN_TOPIC = "unknown_topic"             # after max_block_ms: failed future
    UNKNOWN_PARTITION = "unknown_partition"     # after max_block_ms: failed future
    VALUE_NOT_BYTES = "value_not_bytes"         # TypeError from send()
    KEY_NOT_BYTES = "key_not_bytes"             # TypeError
    NEGATIVE_PARTITION = "negative_partition"   # ValueError
    NEGATIVE_TIMESTAMP = "negative_timestamp"   # ValueError
    STORE_REFUSED = "store_refused"             # the store refuses it: future fails later


ARGUMENT_ERRORS: dict[Bad, type[Exception]] = {
    Bad.VALUE_NOT_BYTES: TypeError,
    Bad.KEY_NOT_BYTES: TypeError,
    Bad.NEGATIVE_PARTITION: ValueError,
    Bad.NEGATIVE_TIMESTAMP: ValueError,
}
FUTURE_ERRORS: dict[Bad, type[errors.OncelogError]] = {
    Bad.TOO_LARGE: errors.MessageTooLargeError,
    Bad.UNKNOWN_TOPIC: errors.UnknownTopicOrPartitionError,
    Bad.UNKNOWN_PARTITION: errors.UnknownTopicOrPartitionError,
    Bad.STORE_REFUSED: errors.InvalidTopicError,
}


def _failure_pattern(topic: str) -> str:
    """How the producer names a failed record of `topic` (docs: "whose message
    and __cause__ name the first failed record (topic, partition, error)")."""
    return rf"record for {re.escape(topic)}(-\d+)?[: ]"


@dataclass
class Outcome:
    """What a call did: raised, or returned (a future, for send())."""

    raised: BaseException | None = None
    future: Future[RecordMetadata] | None = None


def _attempt(call: Callable[[], Any]) -> Outcome:
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the model judges every answer
        return Outcome(raised=exc)
    return Outcome(future=result if isinstance(result, Future) else None)


# ---------------------------------------------------------------- the machine


@dataclass
class Env:
    """What the examples of one test share: the cluster and an admin client."""

    cluster: LocalCluster
    admin: Admin


class ProducerModel(RuleBasedStateMachine):
    """One example: a fresh transactional id, fresh topics, one producer."""

    env: Env  # set by the test on a subclass

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.producer: Producer | None = None
        self.reader: Consumer | None = None
        self.hw_reader: Consumer | None = None

    # ------------------------------------------------------------ set-up

    @initialize(linger_ms=st.sampled_from([1, 50]),
                init_now=st.sampled_from([True, True, True, False]))
    def start(self, linger_ms: int, init_now: bool) -> None:
        n = next(_examples)
        self.name = f"model-{n}-{os.getpid()}"
        self.topic_a, self.topic_b = f"{self.name}-a", f"{self.name}-b"
        self.source = f"{self.name}-in"
        created = self.env.admin.create_topics([
            NewTopic(self.topic_a, 2, {"max.message.bytes": str(SMALL_TOPIC_MAX_BYTES)}),
            NewTopic(self.topic_b, 1, {}),
            NewTopic(self.source, 2, {}),
        ])
        assert all(exc is None for exc in created.values()), created
        self.out_tps = [TopicPartition(self.topic_a, 0), TopicPartition(self.topic_a, 1),
                        TopicPartition(self.topic_b, 0)]
        self.source_tps = [TopicPartition(self.source, 0), TopicPartition(self.source, 1)]
        self.group = GroupMetadata(f"{self.name}-group", -1, "")
        self.values = itertools.count()
        self.next_offset = itertools.count(1)

        # The model.
        self.state = UNINITIALIZED
        self.txn: Txn | None = None
        self.committed: dict[TopicPartition, list[tuple[int, bytes]]] = {
            tp: [] for tp in self.out_tps}
        self.committed_offsets: dict[TopicPartition, int] = {}
        self.seen: dict[TopicPartition, list[tuple[int, bytes]]] = {
            tp: [] for tp in self.out_tps}

        bootstrap = self.env.cluster.bootstrap
        self.reader = Consumer(bootstrap=bootstrap, isolation_level="read_committed")
        self.reader.assign(self.out_tps)
        self.reader.seek_to_beginning(self.out_tps)
        self.hw_reader = Consumer(bootstrap=bootstrap, isolation_level="read_uncommitted")
        self.producer = Producer(bootstrap=bootstrap, transactional_id=self.name,
                                 linger_ms=linger_ms, max_block_ms=MAX_BLOCK_MS,
                                 retry_backoff_ms=20)
        if init_now:
            self._init_transactions()

    def teardown(self) -> None:
        try:
            if self.producer is not None:
                self.producer.close(timeout=CALL_TIMEOUT_S)
                if not self.failed:
                    # close() aborts an open transaction (docs/sdk.md, "The calls").
                    self.txn = None
                    self._final_check()
        finally:
            for consumer in (self.reader, self.hw_reader):
                if consumer is not None:
                    consumer.close()

    # -------------------------------------------------------------- rule
    #
    # One rule that draws the next call from a menu per state. Separate rules
    # would meet hypothesis's swarm testing, which turns a random subset of
    # the rules off for a whole example: with begin_transaction off, an
    # example never leaves `ready`. The menus weigh the calls an application
    # makes in each state (a transaction's calls also in abortable_error,
    # which refuses most of them with its own error) and include every call
    # the state does not accept. Each menu starts with the simplest call, as
    # shrinking moves towards the first entry.

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        with self._step():
            # A doomed transaction turns abortable when some call first finds
            # its refused record, at a moment the sender thread decides. The
            # menu must not depend on that moment (hypothesis replays each
            # sequence's draws and stops at a menu that changed), so a
            # transaction that was ever doomed draws from the abortable menu.
            doomed = self.txn is not None and self.txn.was_doomed
            menu = MENUS[ABORTABLE_ERROR if doomed else self.state]
            call = data.draw(st.sampled_from(menu), label="call")
            if call == "init_transactions":
                self._init_transactions()
            elif call == "begin_transaction":
                self._begin_transaction()
            elif call == "send":
                topic = data.draw(st.sampled_from([self.topic_a, self.topic_b]), label="topic")
                partition = 0 if topic == self.topic_b else data.draw(st.integers(0, 1),
                                                                      label="partition")
                how = data.draw(st.sampled_from(["partition", "key", "sticky"]), label="how")
                # Exactly max.message.bytes as a batch of one: the largest record
                # the small topic takes.
                full = topic == self.topic_a and data.draw(st.booleans(), label="full")
                for _ in range(data.draw(st.integers(1, 4), label="count")):
                    self._send_good(topic, partition, how, full)
            elif call == "send_bad":
                kind = data.draw(st.sampled_from(list(Bad)), label="kind")
                # Wait for a store-refused record's future, so the failure is
                # known before the next call.
                wait = kind is Bad.STORE_REFUSED and data.draw(st.booleans(), label="wait")
                self._send_bad(kind, wait)
            elif call == "send_offsets_to_transaction":
                self._send_offsets(data.draw(st.sets(st.integers(0, 1)), label="partitions"))
            elif call == "commit_transaction":
                self._commit_transaction()
            elif call == "abort_transaction":
                self._abort_transaction()
            else:
                self._flush()

    # ------------------------------------------------------------- calls

    def _init_transactions(self) -> None:
        outcome = self._call("init_transactions",
                             lambda: self._p.init_transactions(timeout=CALL_TIMEOUT_S))
        if outcome is not None:
            assert outcome.raised is None, f"init_transactions() raised {outcome.raised!r}"
            assert self._p.producer_id >= 0
            self.state = READY

    def _begin_transaction(self) -> None:
        outcome = self._call("begin_transaction", self._p.begin_transaction)
        if outcome is not None:
            assert outcome.raised is None, f"begin_transaction() raised {outcome.raised!r}"
            self.state = IN_TRANSACTION
            self.txn = Txn()

    def _send_offsets(self, partitions: set[int]) -> None:
        offsets = {self.source_tps[p]: next(self.next_offset) for p in sorted(partitions)}
        outcome = self._call("send_offsets_to_transaction",
                             lambda: self._p.send_offsets_to_transaction(
                                 offsets, self.group, timeout=CALL_TIMEOUT_S),
                             may_find_broken=True)
        if outcome is None:
            return
        assert outcome.raised is None, f"send_offsets_to_transaction() raised {outcome.raised!r}"
        txn = self._open_txn()
        txn.offsets.update(offsets)
        txn.reached = txn.reached or bool(offsets)
        txn.maybe_reached = txn.maybe_reached or bool(offsets)

    def _commit_transaction(self) -> None:
        txn = self.txn
        identity = self._identity()
        outcome = self._call("commit_transaction",
                             lambda: self._p.commit_transaction(timeout=CALL_TIMEOUT_S),
                             may_find_broken=True)
        if outcome is None:
            # Refused: nothing of the transaction may be readable.
            if self.state == ABORTABLE_ERROR:
                self._check_open_txn_unreadable()
            return
        assert txn is not None and not txn.doomed
        assert outcome.raised is None, f"commit_transaction() raised {outcome.raised!r}"
        # Every record of the transaction was acknowledged before EndTxn.
        for sent in txn.sent:
            assert sent.future.done(), f"commit returned with {sent} unacknowledged"
            assert sent.future.exception() is None, (
                f"commit returned, but record {sent.value!r} failed: "
                f"{sent.future.exception()!r}")
        event(f"committed {min(len(txn.sent), 3)}+ records, {len(txn.offsets)} offsets")
        self._add_committed(txn)
        self.committed_offsets.update(txn.offsets)
        self._end_txn(txn, identity, commit=True)
        self._check_visible()

    def _abort_transaction(self) -> None:
        txn = self.txn
        identity = self._identity()
        outcome = self._call("abort_transaction",
                             lambda: self._p.abort_transaction(timeout=CALL_TIMEOUT_S))
        if outcome is None:
            return
        assert txn is not None
        assert outcome.raised is None, f"abort_transaction() raised {outcome.raised!r}"
        event(f"aborted {min(len(txn.sent), 3)}+ records, {len(txn.offsets)} offsets")
        # Unsent records were dropped, in-flight ones waited for.
        for sent in txn.sent:
            assert sent.future.done(), f"abort returned with {sent} not done"
            self._check_dropped_or_acknowledged(sent)
        self._end_txn(txn, identity, commit=False)
        self._check_visible()

    def _flush(self) -> None:
        identity = self._identity()
        event(f"flush in {self._model_state()}")
        note(f"flush() in {self._model_state()}")
        self._p.flush(timeout=CALL_TIMEOUT_S)
        assert self._identity() == identity
        txn = self.txn
        if txn is None:
            return
        for sent in txn.sent:
            assert sent.future.done(), f"flush returned with {sent} not done"
            self._check_dropped_or_acknowledged(sent)
        if txn.doomed:
            # flush() waited for the refused record: the failure is known.
            self._collapse_doomed(txn)
        if self.state == IN_TRANSACTION:
            for sent in txn.sent:
                assert sent.future.exception() is None, (
                    f"record {sent.value!r} of a healthy transaction failed: "
                    f"{sent.future.exception()!r}")
        self._check_open_txn_unreadable()

    @invariant()
    def state_matches(self) -> None:
        if self.producer is None:
            return
        with self._step():
            actual = self._p.transaction_state
            if self.txn is not None and self.txn.doomed:
                assert actual in (IN_TRANSACTION, ABORTABLE_ERROR), actual
            else:
                assert actual == self.state, f"producer is {actual}, the model {self.state}"

    # ------------------------------------------------------------ sending

    def _send_good(self, topic: str, partition: int, how: str, full: bool) -> None:
        tag = b"%s-%d" % (self.name.encode(), next(self.values))
        key = b"k" + tag if how == "key" else None
        value = tag
        if full:
            room = SMALL_TOPIC_MAX_BYTES - BATCH_OF_ONE_OVERHEAD_BYTES - len(key or b"")
            value = tag + b"." * (room - len(tag))
        asked = partition if how == "partition" else None
        outcome = self._call("send", lambda: self._p.send(topic, value=value, key=key,
                                                          partition=asked),
                             may_find_broken=True)
        if outcome is None:
            return
        assert outcome.raised is None, f"send() of a good record raised {outcome.raised!r}"
        assert outcome.future is not None
        txn = self._open_txn()
        txn.sent.append(Sent(value, None if asked is None else TopicPartition(topic, asked),
                             topic, outcome.future, good=True))
        txn.maybe_reached = True

    def _bad_call(self, kind: Bad) -> tuple[str, Callable[[], Any]]:
        """The topic the failed record is named by, and the call that sends it."""
        p = self._p
        value = b"%s-bad-%d" % (self.name.encode(), next(self.values))
        a = self.topic_a
        if kind is Bad.TOO_LARGE:
            big = value + b"x" * (SMALL_TOPIC_MAX_BYTES - BATCH_OF_ONE_OVERHEAD_BYTES + 1
                                  - len(value))
            return a, lambda: p.send(a, value=big)
        if kind is Bad.UNKNOWN_TOPIC:
            return a + "-missing", lambda: p.send(a + "-missing", value=value)
        if kind is Bad.UNKNOWN_PARTITION:
            return a, lambda: p.send(a, value=value, partition=7)
        if kind is Bad.VALUE_NOT_BYTES:
            return a, lambda: p.send(a, value=value.decode())
        if kind is Bad.KEY_NOT_BYTES:
            return a, lambda: p.send(a, value=value, key=7)
        if kind is Bad.NEGATIVE_PARTITION:
            return a, lambda: p.send(a, value=value, partition=-1)
        if kind is Bad.NEGATIVE_TIMESTAMP:
            return a, lambda: p.send(a, value=value, timestamp_ms=-5)
        # Clients may not append to internal topics: the store refuses the batch.
        return "__consumer_offsets", lambda: p.send("__consumer_offsets", value=value,
                                                    partition=0)

    def _send_bad(self, kind: Bad, wait: bool) -> None:
        where, call = self._bad_call(kind)
        identity = self._identity()
        txn = self.txn
        doomed = txn is not None and txn.doomed
        event(f"send {kind.value} in {self._model_state()}")
        outcome = _attempt(call)
        note(f"send({kind.value}) in {self._model_state()}: "
             f"{repr(outcome.raised) if outcome.raised is not None else outcome.future}")
        raised = outcome.raised

        if doomed and isinstance(raised, errors.TransactionAbortableError):
            # The store's refusal was seen first: the state's own error.
            assert txn is not None
            self._collapse_doomed(txn)
            self._check_refused(outcome, errors.TransactionAbortableError, identity)
            return
        if self.state != IN_TRANSACTION:
            # Refused: the state's error; a bad argument may be refused as such
            # first (docs: "Wrong argument types raise TypeError/ValueError").
            if kind in ARGUMENT_ERRORS and isinstance(raised, ARGUMENT_ERRORS[kind]):
                assert self._identity() == identity
                return
            refusal = expected_refusal(self.state, "send")
            assert refusal is not None
            self._check_refused(outcome, refusal, identity)
            return

        # In a transaction: the record fails, and so does the transaction.
        assert txn is not None
        if kind in ARGUMENT_ERRORS:
            assert isinstance(raised, ARGUMENT_ERRORS[kind]), (
                f"{kind.value}: expected {ARGUMENT_ERRORS[kind].__name__}, got {raised!r}")
        else:
            assert raised is None, f"{kind.value}: send() raised {raised!r}"
            assert outcome.future is not None
            txn.sent.append(Sent(b"", None, where, outcome.future, good=False))
            if kind is not Bad.STORE_REFUSED:
                # Refused inside send(): the future has failed already.
                self._check_future_failed(outcome.future, self._future_error(kind, outcome))
        txn.failures.append(_failure_pattern(where))
        if kind is Bad.STORE_REFUSED:
            txn.maybe_reached = True
            txn.doomed = txn.was_doomed = True
            if wait:
                self._check_future_failed(outcome.future, FUTURE_ERRORS[kind], wait=True)
                txn.doomed = False
                self.state = ABORTABLE_ERROR
        else:
            txn.doomed = False
            self.state = ABORTABLE_ERROR

    # ------------------------------------------------------------ helpers

    @property
    def _p(self) -> Producer:
        assert self.producer is not None
        return self.producer

    def _identity(self) -> tuple[int, int]:
        return self._p.producer_id, self._p.producer_epoch

    def _model_state(self) -> str:
        return "doomed" if self.txn is not None and self.txn.doomed else self.state

    def _open_txn(self) -> Txn:
        assert self.txn is not None, "the model has no open transaction"
        return self.txn

    def _step(self) -> _Step:
        return _Step(self)

    def _call(self, call: str, fn: Callable[[], Any], *,
              may_find_broken: bool = False) -> Outcome | None:
        """Makes `call`. Returns its outcome when the model's state accepts it;
        when it does not, checks the refusal (the right error, nothing changed)
        and returns None. `may_find_broken`: in a doomed transaction the call
        may instead find the failure first and raise the state's error."""
        identity = self._identity()
        refusal = expected_refusal(self.state, call)
        event(f"{call} in {self._model_state()}")
        outcome = _attempt(fn)
        note(f"{call}() in {self._model_state()}: "
             f"{'ok' if outcome.raised is None else repr(outcome.raised)}")
        txn = self.txn
        if refusal is None and txn is not None and txn.doomed and may_find_broken:
            if call == "commit_transaction":
                # It flushes first, so it must find the failure.
                assert isinstance(outcome.raised, errors.TransactionAbortableError), (
                    f"commit_transaction() of a transaction with a refused record: "
                    f"{outcome.raised!r}")
            if isinstance(outcome.raised, errors.TransactionAbortableError):
                self._collapse_doomed(txn)
                refusal = errors.TransactionAbortableError
        if refusal is None:
            return outcome
        self._check_refused(outcome, refusal, identity)
        return None

    def _collapse_doomed(self, txn: Txn) -> None:
        """The producer reported the failure of a doomed transaction."""
        txn.doomed = False
        self.state = ABORTABLE_ERROR
        store_refused = [s for s in txn.sent if s.topic == "__consumer_offsets"]
        self._check_failed_as(store_refused, Bad.STORE_REFUSED)

    def _check_refused(self, outcome: Outcome, refusal: type[errors.OncelogError],
                       identity: tuple[int, int]) -> None:
        raised = outcome.raised
        assert isinstance(raised, refusal), (
            f"expected {refusal.__name__} in state {self.state}, got "
            f"{raised!r}" + ("" if outcome.future is None else f" and future {outcome.future}"))
        if refusal is errors.IllegalStateError:
            assert not isinstance(raised, errors.TransactionAbortableError)
        else:
            # It names the record that broke the transaction.
            txn = self._open_txn()
            message = f"{raised} <- {raised.__cause__}"
            assert any(re.search(pattern, message) for pattern in txn.failures), (
                f"{message!r} names none of {txn.failures}")
        assert self._identity() == identity, "a refused call changed the producer id or epoch"

    def _check_future_failed(self, future: Future[RecordMetadata] | None,
                             error: type[BaseException], *, wait: bool = False) -> None:
        assert future is not None
        assert wait or future.done(), "a record refused in send() left its future pending"
        exc = future.exception(timeout=CALL_TIMEOUT_S)
        assert isinstance(exc, error), f"expected {error.__name__}, the future has {exc!r}"

    @staticmethod
    def _future_error(kind: Bad, outcome: Outcome) -> type[BaseException]:
        return FUTURE_ERRORS[kind]

    def _check_failed_as(self, sent: list[Sent], kind: Bad) -> None:
        for s in sent:
            self._check_future_failed(s.future, FUTURE_ERRORS[kind], wait=True)

    def _check_dropped_or_acknowledged(self, sent: Sent) -> None:
        """A good record of a transaction that is not committing: acknowledged,
        or dropped unsent (TransactionAbortedError)."""
        if not sent.good:
            return
        exc = sent.future.exception(timeout=0)
        assert exc is None or isinstance(exc, errors.TransactionAbortedError), (
            f"good record {sent.value!r} failed with {exc!r}")

    def _add_committed(self, txn: Txn) -> None:
        """The transaction's good records, in send order per partition."""
        for sent in txn.sent:
            md = sent.future.result(timeout=0)
            tp = TopicPartition(md.topic, md.partition)
            assert md.topic == sent.topic
            assert sent.tp_asked is None or tp == sent.tp_asked, (
                f"{sent.value!r} asked for {sent.tp_asked}, went to {tp}")
            log = self.committed[tp]
            assert not log or md.offset > log[-1][0], (
                f"{sent.value!r} at {tp}@{md.offset}, after {log[-1]}")
            log.append((md.offset, sent.value))

    def _end_txn(self, txn: Txn, identity: tuple[int, int], *, commit: bool) -> None:
        """After a commit or an abort: ready, and a new epoch when the
        coordinator knew the transaction (docs: "the producer epoch is bumped
        at every commit and abort"; EndTxn(abort) is "skipped when nothing of
        the transaction reached the coordinator")."""
        acknowledged = any(s.good and s.future.exception(timeout=0) is None for s in txn.sent)
        if txn.reached or acknowledged:
            assert self._identity() != identity, (
                f"the transaction reached the coordinator, but the epoch stayed {identity}")
        if not commit and not txn.maybe_reached:
            assert self._identity() == identity, (
                f"an abort of a transaction that sent nothing moved the epoch from "
                f"{identity} to {self._identity()}")
        self.state = READY
        self.txn = None

    # ------------------------------------------------------------- checks

    def _check_visible(self) -> None:
        """No transaction is open: once every marker has landed (each output
        partition's last stable offset at its high watermark), a read_committed
        reader sees exactly the committed records, and the group exactly the
        committed offsets."""
        reader, hw_reader = self.reader, self.hw_reader
        assert reader is not None and hw_reader is not None
        deadline_s = time.monotonic() + SETTLE_S
        ends = hw_reader.end_offsets(self.out_tps)
        while any(reader.position(tp) < ends[tp] for tp in self.out_tps):
            assert time.monotonic() < deadline_s, (
                f"read_committed positions {[reader.position(tp) for tp in self.out_tps]} "
                f"did not reach the high watermarks {ends} within {SETTLE_S} s "
                f"(a transaction left open?); seen so far {self.seen}")
            self._poll(reader)
        assert self.seen == self.committed, self._diff()
        while True:
            offsets = self._group_offsets()
            if offsets == self.committed_offsets:
                return
            assert time.monotonic() < deadline_s, (
                f"group offsets {offsets}, the model {self.committed_offsets}")
            time.sleep(0.02)

    def _check_open_txn_unreadable(self) -> None:
        """A transaction is open (or refused to commit): reading up to the
        last stable offset shows exactly the committed records."""
        reader = self.reader
        assert reader is not None
        lso = reader.end_offsets(self.out_tps)
        deadline_s = time.monotonic() + SETTLE_S
        while any(reader.position(tp) < lso[tp] for tp in self.out_tps):
            assert time.monotonic() < deadline_s, f"could not read up to {lso}"
            self._poll(reader)
        assert self.seen == self.committed, self._diff()
        assert self._group_offsets() == self.committed_offsets

    def _poll(self, reader: Consumer) -> None:
        for record in reader.poll(timeout=0.05):
            self.seen[TopicPartition(record.topic, record.partition)].append(
                (record.offset, record.value or b""))

    def _group_offsets(self) -> dict[TopicPartition, int]:
        found = self.env.admin.list_group_offsets(self.group.group_id, self.source_tps)
        return {tp: o.offset for tp, o in found.items()}

    def _diff(self) -> str:
        lines = ["read_committed view differs from the model's committed records:"]
        for tp in self.out_tps:
            seen, want = self.seen[tp], self.committed[tp]
            if seen != want:
                lines.append(f"  {tp}: seen {[v[:24] for _o, v in seen]} at "
                             f"{[o for o, _v in seen]}")
                lines.append(f"  {tp}: want {[v[:24] for _o, v in want]} at "
                             f"{[o for o, _v in want]}")
        return "\n".join(lines)

    def _final_check(self) -> None:
        """After close(): the incremental view settles on the model, and a
        fresh reader from offset 0 sees the same."""
        self._check_visible()
        with Consumer(bootstrap=self.env.cluster.bootstrap,
                      isolation_level="read_committed") as fresh:
            fresh.assign(self.out_tps)
            fresh.seek_to_beginning(self.out_tps)
            ends = fresh.end_offsets(self.out_tps)
            full: dict[TopicPartition, list[tuple[int, bytes]]] = {tp: [] for tp in self.out_tps}
            deadline_s = time.monotonic() + SETTLE_S
            while any(fresh.position(tp) < ends[tp] for tp in self.out_tps):
                assert time.monotonic() < deadline_s, f"could not read up to {ends}"
                for record in fresh.poll(timeout=0.05):
                    full[TopicPartition(record.topic, record.partition)].append(
                        (record.offset, record.value or b""))
        assert full == self.committed, f"a fresh reader saw {full}, the model {self.committed}"


class _Step:
    """Marks the example failed when a step raises, so teardown does not
    bury the failure under a check of its own."""

    def __init__(self, machine: ProducerModel) -> None:
        self.machine = machine

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        if exc_type is not None:
            self.machine.failed = True


# ----------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with LocalCluster(tmp_path_factory.mktemp("txn-model") / "cluster") as cluster, \
            Admin(bootstrap=cluster.bootstrap) as admin:
        yield Env(cluster, admin)


@pytest.mark.timeout(900)  # ONCELOG_MODEL_SHRINK=1 shrinks against the real cluster
def test_transactional_producer_follows_the_model(env: Env) -> None:
    class Machine(ProducerModel):
        pass

    Machine.env = env
    factory: Any = Machine if SEED is None else seed(int(SEED))(Machine)
    run_state_machine_as_test(factory, settings=settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        derandomize=SEED is None,
        database=None,
        print_blob=True,
        phases=list(Phase) if SHRINK else [p for p in Phase if p is not Phase.shrink],
        suppress_health_check=list(HealthCheck),
    ))


def test_too_large_send_outside_a_transaction_is_refused(env: Env) -> None:
    """The state table: send() outside a transaction raises IllegalStateError,
    and in abortable_error the transaction's TransactionAbortableError — also
    for a record over max.message.bytes of a topic the producer knows."""
    name = f"model-too-large-{next(_examples)}-{os.getpid()}"
    env.admin.create_topic(name, partitions=1,
                           config={"max.message.bytes": str(SMALL_TOPIC_MAX_BYTES)})
    too_large = b"x" * (2 * SMALL_TOPIC_MAX_BYTES)
    with Producer(bootstrap=env.cluster.bootstrap, transactional_id=name,
                  max_block_ms=MAX_BLOCK_MS) as producer:
        producer.init_transactions(timeout=CALL_TIMEOUT_S)
        producer.begin_transaction()
        producer.send(name, value=b"known").result(timeout=CALL_TIMEOUT_S)
        producer.commit_transaction(timeout=CALL_TIMEOUT_S)
        with pytest.raises(errors.IllegalStateError):
            producer.send(name, value=too_large)
        producer.begin_transaction()
        producer.send(name, value=b"breaks", partition=7)   # within max_block_ms
        assert producer.transaction_state == ABORTABLE_ERROR
        with pytest.raises(errors.TransactionAbortableError):
            producer.send(name, value=too_large)
