"""Bounds the SDK and the services must agree on, in one place.

Each side adds its own (services/common/kernel/limits.py imports these and checks
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

# A connection that goes silent (a network partition drops packets without
# a reset) is noticed by HTTP/2 pings within KEEPALIVE_TIME_MS +
# KEEPALIVE_TIMEOUT_MS, and its calls fail over, instead of each waiting out
# its own deadline and the next one finding the same dead connection.
# Servers must accept pings this often (SERVER_MIN_PING_INTERVAL_MS), or they
# answer "too many pings" and close the connection.
KEEPALIVE_TIME_MS = 5_000
KEEPALIVE_TIMEOUT_MS = 3_000
SERVER_MIN_PING_INTERVAL_MS = 4_000

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    # gRPC's default reconnect backoff grows to two minutes; a restarted store
    # must be found again within about a second (Kafka's reconnect.backoff.max.ms).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # Ping an idle connection too: a store's stream to a coordinator or a
    # follower's fetch may sit between requests when the partition happens.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
