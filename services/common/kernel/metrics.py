"""Prometheus metrics every service exports: per-RPC counts, errors and
latency, and the health of the process. docs/metrics.md lists every metric
of every service with its type, labels and unit.

Labels stay bounded: `service` and `method` come from the protos, `code` from
the closed ErrorCode enum. Nothing is labelled by producer id, transactional
id or client address.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RPC_REQUESTS = Counter(
    "oncelog_rpc_requests_total",
    "RPCs received, by gRPC service and method (health and reflection excluded)",
    ["service", "method"],
)
RPC_ERRORS = Counter(
    "oncelog_rpc_errors_total",
    "RPCs that failed as a whole, by the oncelog error code they ended with (the status "
    "details' Error, or the response's own top-level error field)",
    ["service", "method", "code"],
)
RPC_RESULT_ERRORS = Counter(
    "oncelog_rpc_result_errors_total",
    "Failed items inside successful responses (a partition of a Produce, a transactional id "
    "of a DescribeTransactions, ...), by error code",
    ["service", "method", "code"],
)
RPC_LATENCY_SECONDS = Histogram(
    "oncelog_rpc_latency_seconds",
    "Time from an RPC's arrival to its reply, long-poll waits of Fetch included",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0),
)
RPC_IN_FLIGHT = Gauge(
    "oncelog_rpc_in_flight", "RPCs being handled right now", ["service"],
)

SERVICE_INFO = Gauge(
    "oncelog_service_info",
    "Always 1; its labels say which oncelog service and node this process is",
    ["service", "node_id", "version"],
)
SERVING = Gauge(
    "oncelog_service_serving",
    "1 while the gRPC health status is SERVING, 0 while starting or shutting down",
)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "oncelog_event_loop_lag_seconds",
    "How late the asyncio event loop ran a timer due every "
    "EVENT_LOOP_PROBE_INTERVAL_S: time blocked by CPU-bound work or the GIL",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# How often the event-loop probe wakes up.
EVENT_LOOP_PROBE_INTERVAL_S = 0.5

# Security (services/common/security/guard.py, acl_watcher.py; docs/security.md).
AUTHORIZATION_DENIALS = Counter(
    "oncelog_authorization_denials_total",
    "Calls refused by the authorizer (PERMISSION_DENIED) before they ran, by gRPC service, "
    "the operation refused and the type of the resource it was refused on",
    ["service", "operation", "resource_type"],
)
ACL_BINDINGS = Gauge(
    "oncelog_acl_bindings",
    "ACL bindings in this process's authorizer (0 without --authorizer acl)",
)
ACL_APPLIED_OFFSET = Gauge(
    "oncelog_acl_applied_offset",
    "The __acls offset up to which this process's ACLs are read and in effect (-1: not read "
    "yet, or no --authorizer acl)",
)
ACL_APPLIED_OFFSET.set(-1)
