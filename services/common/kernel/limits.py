"""Every bound in one place. Relationships between them are checked at import."""

from __future__ import annotations

from oncelog.wire.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_GRPC_MESSAGE_BYTES

from .invariants import invariant

# gRPC messages (a produce or fetch request/response may carry
# MAX_GRPC_MESSAGE_BYTES) and the default max.message.bytes are bounds the
# clients enforce too: they live in oncelog.wire.limits, once.
# Default and ceiling for a topic's max.message.bytes (one encoded batch).
DEFAULT_MAX_BATCH_BYTES = DEFAULT_MAX_MESSAGE_BYTES
MAX_BATCH_BYTES_CEILING = 16 * 1024 * 1024
# Default and ceiling for one fetch response.
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
# Longest a fetch may long-poll.
MAX_FETCH_WAIT_MS = 30_000
MAX_PARTITIONS_PER_TOPIC = 10_000
MAX_TOPIC_NAME_LENGTH = 249
# Ids that clients choose (transactional, group, member, group instance ids),
# in characters. Error messages name these ids, sometimes several at once, and
# a gRPC status travels in trailers that a client refuses past its metadata
# limit (8 KiB by default), losing our error details; the coordinators also
# store the ids in records of their internal topics.
MAX_ID_LENGTH = 249
# How many of a producer's most recent batches per partition are kept for
# deduplication; also the most batches a producer may have in flight per partition.
MAX_IN_FLIGHT_BATCHES = 5
# Graceful shutdown: how long in-flight RPCs get to finish (--shutdown-grace-ms).
SHUTDOWN_GRACE_MS = 5000
# The Kafka listener (services/kafka): the largest request frame it reads
# (Kafka's socket.request.max.bytes is 100 MiB; a produce request here holds
# at most what a gRPC message may), and how many requests of one connection
# it works on at once (clients pipeline up to 5 produce requests per
# connection; more is a client that does not wait for answers).
KAFKA_MAX_REQUEST_BYTES = MAX_GRPC_MESSAGE_BYTES
KAFKA_MAX_IN_FLIGHT_PER_CONNECTION = 32
# Connections one Kafka listener keeps open at once; the next ones are closed.
KAFKA_MAX_CONNECTIONS = 10_000
# Questions a store has out at once to the transaction coordinators about
# transactions it has held open past their timeout (ResolveTransaction; one
# per transaction): a store with many hanging transactions (a coordinator's
# state lost) works through them this many at a time.
MAX_HANGING_TXN_QUESTIONS = 16
# Client quotas (partition_store/quotas.py): the quota entities (a limited
# principal and/or client id, per produce and fetch) whose byte rate a store
# keeps at once; beyond it the least recently used one starts over. Each is
# a few hundred bytes.
MAX_QUOTA_ENTITIES = 100_000

invariant(DEFAULT_MAX_BATCH_BYTES <= MAX_BATCH_BYTES_CEILING, "default batch limit over ceiling")
invariant(
    MAX_BATCH_BYTES_CEILING * 2 <= MAX_GRPC_MESSAGE_BYTES,
    "a gRPC message must hold at least two of the largest batches",
)
invariant(DEFAULT_FETCH_MAX_BYTES <= MAX_GRPC_MESSAGE_BYTES, "fetch limit over gRPC limit")
invariant(MAX_BATCH_BYTES_CEILING * 2 <= KAFKA_MAX_REQUEST_BYTES,
          "a Kafka request must hold at least two of the largest batches")
