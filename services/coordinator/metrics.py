"""Prometheus metrics of the transaction coordinator (docs/metrics.md).

Labels are bounded: transaction states, error code names, a few fixed
reasons. Never a transactional id or a producer id.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from ..common.kernel.txn_fate import TxnFate

TRANSACTIONS = Gauge(
    "oncelog_coordinator_transactions",
    "Transactional ids by state, in the __transaction_state partitions this coordinator "
    "has loaded (refreshed every --transaction-check-interval-ms)",
    ["state"],
)
TXN_STATE_TRANSITIONS = Counter(
    "oncelog_coordinator_txn_state_transitions_total",
    "State changes made durable in __transaction_state (from_state 'none': a new "
    "transactional id; to_state 'Dead': an expired one)",
    ["from_state", "to_state"],
)
PRODUCER_FENCINGS = Counter(
    "oncelog_coordinator_producer_fencings_total",
    "Epoch bumps that fence whoever still holds the previous epoch, by reason: init "
    "(InitProducerId of a known transactional id, a new producer instance), timeout (a "
    "transaction outlived its timeout), admin (AbortTransaction)",
    ["reason"],
)
TXN_TIMEOUTS = Counter(
    "oncelog_coordinator_txn_timeouts_total",
    "Ongoing transactions the coordinator aborted because they outlived their timeout",
)
MARKERS_PENDING = Gauge(
    "oncelog_coordinator_markers_pending_transactions",
    "Decided transactions (PrepareCommit/PrepareAbort) whose markers are still being "
    "written (refreshed every --transaction-check-interval-ms)",
)
MARKER_WRITES = Counter(
    "oncelog_coordinator_marker_writes_total",
    "Marker results per partition, by outcome: NONE (landed) or the error code name "
    "(retried when retriable)",
    ["outcome"],
)
TXN_COMPLETION_SECONDS = Histogram(
    "oncelog_coordinator_txn_completion_latency_seconds",
    "Time from a durable PrepareCommit/PrepareAbort to its durable CompleteCommit/"
    "CompleteAbort: writing every marker of the transaction",
    ["outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
OLDEST_ONGOING_TXN_AGE_SECONDS = Gauge(
    "oncelog_coordinator_oldest_ongoing_txn_age_seconds",
    "Age of the oldest Ongoing transaction this coordinator knows (0: none); its timer "
    "aborts each one past its own timeout",
)
MAX_TRANSACTION_TIMEOUT_SECONDS = Gauge(
    "oncelog_coordinator_max_transaction_timeout_seconds",
    "--max-transaction-timeout-ms in seconds: no transaction the coordinator knows may stay "
    "open longer (the hanging-transaction alert's threshold)",
)
TXN_LOG_PARTITIONS = Gauge(
    "oncelog_coordinator_txn_log_partitions",
    "__transaction_state partitions this coordinator owns, by status: loaded, loading, or "
    "fenced (a newer coordinator took it over)",
    ["status"],
)
STORE_QUESTIONS = Counter(
    "oncelog_coordinator_hanging_txn_questions_total",
    "Answers to partition stores asking about a transaction they held open past its "
    "timeout (ResolveTransaction), one per owned __transaction_state partition, by fate: "
    "UNKNOWN (nobody here knows it), ONGOING, HELD_OPEN (two-phase commit), ABORTING "
    "(aborted now by the timeout path), DECIDED_ABORT / DECIDED_COMMIT (its marker sent "
    "to the store's partition)",
    ["fate"],
)
TXN_LOG_BATCH_CHANGES = Histogram(
    "oncelog_coordinator_txn_log_batch_changes",
    "Changes per append to __transaction_state: every change planned while the previous "
    "append of its partition was in flight goes out in one batch (group commit)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
TXN_LOG_APPEND_SECONDS = Histogram(
    "oncelog_coordinator_txn_log_append_latency_seconds",
    "Time one append (a batch of changes) to __transaction_state takes until it is durable "
    "(replicated)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def observe_batch(changes: int, _records: int, seconds: float) -> None:
    """The shared runtime's report of one batched append."""
    TXN_LOG_BATCH_CHANGES.observe(changes)
    TXN_LOG_APPEND_SECONDS.observe(seconds)


OUTCOMES = ("commit", "abort")
FENCING_REASONS = ("init", "timeout", "admin")
PARTITION_STATUSES = ("loaded", "loading", "fenced")

# Series that exist from the start, so rate() and increase() see the first
# event instead of the series appearing with it.
for _reason in FENCING_REASONS:
    PRODUCER_FENCINGS.labels(_reason)
for _outcome in OUTCOMES:
    TXN_COMPLETION_SECONDS.labels(_outcome)
for _fate in TxnFate:
    STORE_QUESTIONS.labels(_fate.name)
