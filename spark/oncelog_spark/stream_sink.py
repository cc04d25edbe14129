"""The two-phase-commit sink: `df.writeStream.format("oncelog")`.

    query = (ledger_df.writeStream.format("oncelog")
             .option("bootstrap", bootstrap).option("topic", "ledger")
             .option("app_id", "ledger-app")
             .option("checkpointLocation", CHECKPOINT)
             .start())

Spark's own commit protocol for a streaming write is: every task writes
and returns a commit message; when all have succeeded, the driver calls
`commit(messages, batch_id)` once, then records the micro-batch in its
commit log; when one failed, `abort(messages, batch_id)`. This sink maps it
onto a true two-phase commit (KIP-939):

* each task (Spark partition P) writes its rows in a transaction of the
  two-phase-commit producer `APP_ID-P`, with the micro-batch id as a
  transactional offset of the sink-side group `APP_ID` (writing.py), and
  **prepares** it — nothing is visible yet — returning the prepared state
  (producer id, epoch) as its commit message;
* `commit` (the driver) **completes** every prepared transaction with a
  producer of the same transactional id (`init_transactions(
  keep_prepared_txn=True)`, then `complete_transaction(state)`): all of the
  micro-batch becomes visible, and with it its batch id. Completing a
  state again answers how it ended and writes nothing, so a repeated commit
  is a no-op;
* `abort` aborts the micro-batch's transactions.

When the driver dies between the tasks' prepare and its commit, the
prepared transactions wait (a two-phase-commit transaction never times
out). The restarted query runs the micro-batch again from its checkpoint:
each task's `init_transactions()` aborts what its writer left prepared, and
writes again. If the driver died half-way through its commit, writers whose
transaction it had completed find their batch id committed and write
nothing. So each row is visible once, and no prepared transaction is left
behind by a query that is restarted.

Without option `app_id`, APP_ID is derived from the query's checkpoint
location (`options.default_app_id`: `spark-` and 16 hex digits), which
names the query across restarts, and the sink-side group is
`APP_ID-QUERY_ID` (`query_group`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from oncelog import PreparedTxnState, Producer
from oncelog_spark.options import SinkOptions
from oncelog_spark.writing import (
    PreparedWrite,
    SinkColumns,
    prepare_batch,
    transactional_id,
)

log = logging.getLogger("oncelog_spark.sink")
_T = TypeVar("_T")

# Spark sets this local property on the driver thread that runs a
# micro-batch; tasks inherit local properties, so a write task learns its
# micro-batch id from it (DataSourceStreamWriter.write is not given one).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# ... and the query's id (kept in its checkpoint, the same across restarts).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Transactions completed (or aborted) at once by the driver.
COMPLETION_THREADS = 8
# Test hook: how long a held commit waits to be killed before it fails.
HOLD_LIMIT_S = 600


def query_group(options: SinkOptions, context: TaskContext) -> str:
    """The sink-side group of a sink whose app_id was derived from its
    checkpoint location: `APP_ID-QUERY_ID`. The query id is Spark's own
    identity of the query, kept in its checkpoint (`metadata`), so a
    restarted query finds its batch ids again; a new checkpoint made at a
    deleted one's path has a new query id, so it cannot mistake the old
    query's batch ids for its own and skip its first micro-batch. (The
    transactional ids stay `APP_ID-N`: the new query still fences whatever
    the old one left running.)"""
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        raise RuntimeError(
            f"the oncelog sink's task has no query id (Spark's local property "
            f"{QUERY_ID_PROPERTY!r}); give the sink option 'app_id'"
        )
    return f"{options.app_id}-{query_id}"


class PreparedWriteLostError(RuntimeError):
    """A prepared transaction of the micro-batch was aborted before the
    driver could complete it: the micro-batch fails (and, run again after a
    restart, is written once)."""


class OncelogStreamWriter(DataSourceStreamArrowWriter):
    """The stream writer Spark pickles into every write task and into the
    driver-side process that commits or aborts each micro-batch."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self._options = options
        self._columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the oncelog sink's write runs outside a Spark task")
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if batch_id is None:
            raise RuntimeError(
                f"the oncelog sink's task has no micro-batch id (Spark's local property "
                f"{BATCH_ID_PROPERTY!r}): format('oncelog') writes streaming queries only"
            )
        options = self._options
        if options.app_id_from_checkpoint:
            options = replace(options, group_id=query_group(options, context))
        return prepare_batch(options, self._columns, writer=context.partitionId(),
                             batch_id=int(batch_id), batches=iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        complete_batch(self._options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self._options, messages, batchId)


def complete_batch(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> int:
    """Phase two: commits every task's prepared transaction of micro-batch
    `batch_id`; returns how many records became visible. Raises
    PreparedWriteLostError when a prepared transaction had been aborted
    meanwhile (after completing the others: those stay committed, and their
    writers skip the micro-batch when it runs again)."""
    writes = _checked(messages, batch_id)
    _hold_if_armed(options, batch_id)
    prepared = [(w, PreparedTxnState.parse(w.prepared)) for w in writes
                if w.prepared is not None]

    def complete(item: tuple[PreparedWrite, PreparedTxnState]) -> bool:
        write, state = item
        with _completer(options, write.transactional_id) as producer:
            producer.init_transactions(keep_prepared_txn=True)
            kept = producer.prepared_transaction_state
            if kept is not None and kept != state:
                # Another attempt's transaction is prepared now, so ours was
                # ended before it began. Completing with our state would
                # abort theirs (KIP-939: a state that does not match aborts);
                # leave it to its own driver.
                return False
            return producer.complete_transaction(state)

    outcomes = _each(prepared, complete)
    lost = [w for (w, _), committed in zip(prepared, outcomes, strict=True) if not committed]
    if lost:
        names = ", ".join(f"{w.transactional_id} ({w.prepared})" for w in lost)
        raise PreparedWriteLostError(
            f"oncelog sink: micro-batch {batch_id}: the prepared transactions of {names} were "
            f"aborted before the driver completed them (another attempt of the task took "
            f"over, e.g. with speculative execution, or an administrator aborted them). The "
            f"micro-batch fails; restarting the query writes it again, once"
        )
    return sum(w.records for w, _ in prepared)


def abort_batch(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> None:
    """Aborts the micro-batch's transactions: every writer's, including those
    of tasks that failed (no message; the writer is the message's place),
    with init_transactions(), which also fences an attempt still running."""
    writers = range(len(messages))

    def abort(writer: int) -> bool:
        with _completer(options, transactional_id(options.app_id, writer)) as producer:
            producer.init_transactions()
        return True

    log.warning("app %s: aborting micro-batch %d (%d writers)", options.app_id, batch_id,
                len(messages))
    _each(list(writers), abort)


def _checked(messages: Sequence[WriterCommitMessage | None], batch_id: int
             ) -> list[PreparedWrite]:
    writes = []
    for i, message in enumerate(messages):
        if not isinstance(message, PreparedWrite) or message.batch_id != batch_id:
            raise RuntimeError(
                f"oncelog sink: commit of micro-batch {batch_id} got {message!r} from task {i}, "
                f"not a PreparedWrite of that micro-batch"
            )
        writes.append(message)
    return writes


def _completer(options: SinkOptions, tid: str) -> Producer:
    return Producer(bootstrap=options.bootstrap, transactional_id=tid,
                    transaction_two_phase_commit_enable=True,
                    transaction_timeout_ms=options.transaction_timeout_ms,
                    **options.security.client_options())


def _each(items: Sequence[_T], action: Callable[[_T], bool]) -> list[bool]:
    """action(item) for every item, a few at a time; the first error raised
    is raised here after every action has ended."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(COMPLETION_THREADS, len(items))) as pool:
        futures = [pool.submit(action, item) for item in items]
    return [f.result() for f in futures]


def _hold_if_armed(options: SinkOptions, batch_id: int) -> None:
    """Test hook (option test_hold_commit_marker): when the marker file says
    "armed", the commit writes "held BATCH_ID" into it and waits to be
    killed, with every task's transaction prepared and none completed."""
    marker = options.test_hold_commit_marker
    if marker is None:
        return
    path = Path(marker)
    try:
        armed = path.read_text().strip() == "armed"
    except FileNotFoundError:
        return
    if not armed:
        return
    path.write_text(f"held {batch_id}\n")
    log.warning("test hook: holding the commit of micro-batch %d until killed", batch_id)
    time.sleep(HOLD_LIMIT_S)
    raise RuntimeError(f"test hook: the held commit of micro-batch {batch_id} was not killed "
                       f"within {HOLD_LIMIT_S} s")
