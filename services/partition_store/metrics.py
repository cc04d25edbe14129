"""Prometheus metrics of the partition store. Names carry units; labels are
topic and partition only (never producer ids: unbounded cardinality)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from .core.quotas import QuotaKind, QuotaLevel

PRODUCE_RECORDS = Counter(
    "oncelog_store_produce_records_total", "Records appended (duplicates excluded)", ["topic"]
)
PRODUCE_BYTES = Counter(
    "oncelog_store_produce_bytes_total", "Encoded batch bytes appended", ["topic"]
)
FETCH_RECORDS = Counter(
    "oncelog_store_fetch_records_total",
    "Records in the batches Fetch returned (a batch is returned whole, so records before "
    "the fetch offset count too)", ["topic"],
)
FETCH_BYTES = Counter(
    "oncelog_store_fetch_bytes_total", "Encoded batch bytes Fetch returned", ["topic"]
)
PRODUCE_DUPLICATES = Counter(
    "oncelog_store_produce_duplicate_batches_total",
    "Produced batches recognized as retries and not written again", ["topic"],
)
GROUP_COMMIT_WRITES = Histogram(
    "oncelog_store_group_commit_writes",
    "Queued writes (batches, snapshots, deletions) that shared one RocksDB write",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
GROUP_COMMIT_BYTES = Histogram(
    "oncelog_store_group_commit_bytes",
    "Bytes of values in one group commit",
    buckets=(1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26),
)
ROCKSDB_WRITE_SECONDS = Histogram(
    "oncelog_store_rocksdb_write_latency_seconds",
    "Latency of one RocksDB WriteBatch (sync off)",
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
)
FSYNC_SECONDS = Histogram(
    "oncelog_store_fsync_latency_seconds",
    "Latency of one flush_wal(sync) on the flusher thread (--fsync only)",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
HIGH_WATERMARK = Gauge(
    "oncelog_store_high_watermark_offset", "High watermark per partition", ["topic", "partition"]
)
LOG_START_OFFSET = Gauge(
    "oncelog_store_log_start_offset", "Log start offset per partition", ["topic", "partition"]
)
LOG_SIZE_BYTES = Gauge(
    "oncelog_store_log_size_bytes", "Stored batch bytes per partition", ["topic", "partition"]
)
SNAPSHOTS_TAKEN = Counter(
    "oncelog_store_snapshots_taken_total", "Producer-state snapshots written"
)
RETENTION_DELETED_BATCHES = Counter(
    "oncelog_store_retention_deleted_batches_total", "Batches deleted by retention", ["topic"]
)
RECOVERY_REPLAYED_BATCHES = Gauge(
    "oncelog_store_recovery_replayed_batches",
    "Batches replayed after the newest good snapshot during the last start (all partitions)",
)
RECOVERY_DURATION_SECONDS = Gauge(
    "oncelog_store_recovery_duration_seconds",
    "How long the last start took to load the catalog and recover every local partition",
)
CORRUPT_SNAPSHOTS = Counter(
    "oncelog_store_corrupt_snapshots_total", "Snapshots skipped during recovery as unreadable"
)
LAST_STABLE_OFFSET = Gauge(
    "oncelog_store_last_stable_offset", "Last stable offset (LSO) per partition",
    ["topic", "partition"],
)
UNSTABLE_OFFSETS = Gauge(
    "oncelog_store_unstable_offsets",
    "High watermark minus LSO per partition: offsets read_committed readers cannot see yet",
    ["topic", "partition"],
)
OPEN_TRANSACTIONS = Gauge(
    "oncelog_store_open_transactions", "Transactions open per partition", ["topic", "partition"]
)
OLDEST_OPEN_TXN_AGE_SECONDS = Gauge(
    "oncelog_store_oldest_open_txn_age_seconds",
    "Age of the oldest open transaction per partition, by the store's clock (0: none); "
    "a hanging transaction keeps growing it",
    ["topic", "partition"],
)
TXN_MARKERS_WRITTEN = Counter(
    "oncelog_store_txn_markers_written_total",
    "COMMIT/ABORT markers written (identical retries excluded)", ["topic", "type"],
)
TXN_VERIFICATIONS = Counter(
    "oncelog_store_txn_verifications_total",
    "Questions to the transaction coordinator before a producer's first transactional "
    "write to a partition (verify, or add for requests with add_partitions_to_txn), "
    "by outcome (the error code name, or NONE)", ["outcome"],
)
AUTO_ABORTED_TRANSACTIONS = Counter(
    "oncelog_store_auto_aborted_transactions_total",
    "Transactions that held a partition open past their timeout plus the margin and were "
    "aborted without an operator, by who aborted them: coordinator (the store's question "
    "made it abort by its timeout path, or send its abort again) or store (no coordinator "
    "knew the transaction: the store wrote the ABORT marker itself)",
    ["topic", "resolution"],
)
HANGING_RESOLUTIONS = ("coordinator", "store")
COMPACTIONS = Counter(
    "oncelog_store_compactions_total", "Compaction passes completed", ["topic"]
)
COMPACTION_REMOVED_BYTES = Counter(
    "oncelog_store_compaction_removed_bytes_total",
    "Stored bytes compaction removed (records, emptied batches, markers)", ["topic"],
)

# ------------------------------------------------------------- replication
# (docs/replication.md). Gauges are per store: each leader reports its own
# partitions, so a sum over stores is the cluster's figure.
CONTROLLER_ELECTIONS = Counter(
    "oncelog_store_controller_elections_total",
    "Times this store became the controller",
)
LEADER_ELECTIONS = Counter(
    "oncelog_store_leader_elections_total",
    "Clean leader changes this store decided as controller (a leader from the ISR)",
)
UNCLEAN_LEADER_ELECTIONS = Counter(
    "oncelog_store_unclean_leader_elections_total",
    "Leaders this store elected from outside the ISR (unclean.leader.election; may lose "
    "acknowledged records)",
)
ISR_SHRINKS = Counter(
    "oncelog_store_isr_shrinks_total", "Followers this store removed from an ISR as leader",
    ["topic"],
)
ISR_EXPANDS = Counter(
    "oncelog_store_isr_expands_total", "Followers this store added back to an ISR as leader",
    ["topic"],
)
UNDER_REPLICATED_PARTITIONS = Gauge(
    "oncelog_store_under_replicated_partitions",
    "Partitions this store leads whose ISR is smaller than their replica list",
)
UNDER_MIN_ISR_PARTITIONS = Gauge(
    "oncelog_store_under_min_isr_partitions",
    "Partitions this store leads whose ISR is below min.insync.replicas (writes refused)",
)
OFFLINE_PARTITIONS = Gauge(
    "oncelog_store_offline_partitions",
    "Partitions without a leader (reported by the controller only)",
)
LEADER_PARTITIONS = Gauge(
    "oncelog_store_leader_partitions", "Partitions this store leads",
)
REPLICA_LAG_OFFSETS = Gauge(
    "oncelog_store_replica_lag_offsets",
    "As follower: the leader's log end offset minus this replica's, at the last fetch",
    ["topic", "partition"],
)
TRUNCATIONS = Counter(
    "oncelog_store_replica_truncations_total",
    "Times a follower truncated a divergent tail (records a deposed leader never had "
    "acknowledged)", ["topic"],
)

# ------------------------------------------------------------------ storage
# (docs/partition-store.md, "Damaged and full disks").
DISK_FULL = Gauge(
    "oncelog_store_disk_full",
    "1 while a write found the data directory's device full: appends are refused "
    "(STORAGE_ERROR, retriable) until space is freed, then resume by themselves",
)
STORAGE_FAILED = Gauge(
    "oncelog_store_storage_failed",
    "1 after a storage write failed for another reason than a full disk: appends are "
    "refused until the store is restarted",
)
STORAGE_REFUSED_APPENDS = Counter(
    "oncelog_store_storage_refused_appends_total",
    "Appends (produce batches, markers, replicated batches) refused because storage "
    "cannot take writes, by reason (disk_full, storage_failed)", ["reason"],
)
CORRUPT_READS = Counter(
    "oncelog_store_corrupt_reads_total",
    "Reads that found stored bytes failing a checksum (RocksDB's, or a batch's CRC); "
    "the bytes are never served",
)
# Exported at 0 from the start: an alert or a dashboard sees the series
# before the first refusal.
for _reason in ("disk_full", "storage_failed"):
    STORAGE_REFUSED_APPENDS.labels(_reason)

# Client quotas (quotas.py). Labels: the kind (produce/fetch) and the rule
# that gave the quota (core/quotas.py's QuotaLevel: four values), never the
# principal or the client id (unbounded).
QUOTA_THROTTLE_SECONDS = Histogram(
    "oncelog_store_quota_throttle_seconds",
    "Throttle time answered to a client over its byte-rate quota (Kafka's throttle_time_ms)",
    ["kind"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUOTA_THROTTLED_REQUESTS = Counter(
    "oncelog_store_quota_throttled_requests_total",
    "Requests answered with a throttle time > 0", ["kind", "level"],
)
QUOTA_BYTES = Counter(
    "oncelog_store_quota_bytes_total",
    "Bytes counted against byte-rate quotas (limited clients only)", ["kind", "level"],
)
QUOTA_DELAYED_REQUESTS = Counter(
    "oncelog_store_quota_delayed_requests_total",
    "Requests held until their client's throttle time had passed (sent too early)", ["kind"],
)
QUOTA_ENTITIES = Gauge(
    "oncelog_store_quota_entities", "Quota entities whose rate the store keeps now"
)
# Every kind and level from the start, so that the dashboard's panels and the
# throttling alert find their series (at zero) before the first throttle.
for _kind in QuotaKind:
    QUOTA_THROTTLE_SECONDS.labels(_kind)
    QUOTA_DELAYED_REQUESTS.labels(_kind)
    for _level in QuotaLevel:
        QUOTA_THROTTLED_REQUESTS.labels(_kind, _level)
