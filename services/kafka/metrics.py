"""Prometheus metrics of the Kafka listener (docs/metrics.md lists them).
Labels stay bounded: `api` is Kafka's name of an API we serve (or
"unknown"), `reason` one of a few words."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONNECTIONS = Gauge(
    "oncelog_kafka_connections", "Kafka-protocol client connections open on this store",
)
CONNECTIONS_REFUSED = Counter(
    "oncelog_kafka_connections_refused_total",
    "Kafka-protocol connections closed at once: over the connection limit, or a TLS or "
    "plain-text mismatch", ["reason"],
)
REQUEST_SECONDS = Histogram(
    "oncelog_kafka_request_latency_seconds",
    "Time from a Kafka request's arrival to its answer, long-poll waits of Fetch and "
    "JoinGroup included", ["api"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0),
)
REQUEST_ERRORS = Counter(
    "oncelog_kafka_request_errors_total",
    "Kafka requests that closed their connection instead of an answer, by why: frame_size, "
    "api_key, version, decode, unauthenticated, internal", ["api", "reason"],
)
AUTHENTICATION_FAILURES = Counter(
    "oncelog_kafka_authentication_failures_total",
    "SASL exchanges and TLS client certificates that did not authenticate", ["mechanism"],
)
