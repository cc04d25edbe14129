"""Bounds the SDK and the services must agree on, in one place.

Each side adds its own (services/common/limits.py imports these and checks
its limits against them at import), but a bound both sides enforce lives
here only: a copy elsewhere would drift.
"""

from __future__ import annotations

# A produce or fetch message may carry this much (gRPC's message limit on
# every channel and server).
MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# A topic's max.message.bytes (largest encoded batch) when its config leaves it out.
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
# The most bytes the records of one compressed batch may decompress to. A
# few compressed bytes can stand for gigabytes; no producer writes a batch
# this large (Kafka's producers count batch.size before compression).
MAX_UNCOMPRESSED_RECORDS_BYTES = MAX_GRPC_MESSAGE_BYTES

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    # gRPC's default reconnect backoff grows to two minutes; a restarted store
    # must be found again within about a second (Kafka's reconnect.backoff.max.ms).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
