"""What every oncelog service process shares: configuration from flags and
environment, logging, the gRPC server with health checking and reflection,
the Prometheus metrics port, and graceful shutdown on SIGTERM/SIGINT.

Every flag `--some-name` can also be set as the environment variable
`ONCELOG_SOME_NAME`; the flag wins. docs/configuration.md lists them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from services.common import limits
from services.common.cluster import ClusterLayout, split_addresses

log = logging.getLogger("oncelog")


def env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get("ONCELOG_" + name.upper().replace("-", "_"), default)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every service takes."""
    add = parser.add_argument
    add("--node-id", type=int, default=int(env_default("node-id", "0") or 0),
        help="this process's index among the processes of its kind")
    add("--listen", default=env_default("listen"),
        help="host:port to bind (default: the advertised address)")
    add("--advertised", default=env_default("advertised"),
        help="host:port clients are told (default: this node's entry in the layout)")
    add("--stores", default=env_default("stores", ""),
        help="comma-separated advertised addresses of every partition store, by node id")
    add("--coordinators", default=env_default("coordinators", ""),
        help="comma-separated advertised addresses of every transaction coordinator")
    add("--group-coordinators", default=env_default("group-coordinators", ""),
        help="comma-separated advertised addresses of every group coordinator")
    add("--transaction-state-partitions", type=int,
        default=int(env_default("transaction-state-partitions", "8") or 8))
    add("--consumer-offsets-partitions", type=int,
        default=int(env_default("consumer-offsets-partitions", "8") or 8))
    add("--metrics-port", type=int, default=int(env_default("metrics-port", "0") or 0),
        help="Prometheus /metrics HTTP port on the listen host (0: off)")
    add("--log-format", choices=("text", "json"), default=env_default("log-format", "text"))
    add("--log-level", default=env_default("log-level", "INFO"))


def layout_from_args(args: argparse.Namespace) -> ClusterLayout:
    return ClusterLayout(
        stores=split_addresses(args.stores),
        coordinators=split_addresses(args.coordinators),
        group_coordinators=split_addresses(args.group_coordinators),
        transaction_state_partitions=args.transaction_state_partitions,
        consumer_offsets_partitions=args.consumer_offsets_partitions,
    )


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts_ms": int(record.created * 1000),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(fmt: str, level: str, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


GRPC_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_send_message_length", limits.MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", limits.MAX_GRPC_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
)


async def serve(
    *,
    service_name: str,
    full_service_names: Sequence[str],
    listen: str,
    register: Callable[[grpc.aio.Server], None],
    metrics_port: int = 0,
    on_started: Callable[[], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Runs a gRPC service until SIGTERM/SIGINT, then shuts down gracefully:
    health goes NOT_SERVING, new RPCs are refused, in-flight ones get
    SHUTDOWN_GRACE_S to finish, then on_shutdown runs (drain, snapshot)."""
    server = grpc.aio.server(options=list(GRPC_OPTIONS))
    register(server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*full_service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    port = server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"{service_name}: cannot listen on {listen}")
    if metrics_port:
        host = listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
        start_http_server(metrics_port, addr=host)
    await server.start()
    if on_started is not None:
        await on_started()
    for name in ("", *full_service_names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("%s serving on %s (metrics port %s)", service_name, listen, metrics_port or "off")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s shutting down", service_name)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(limits.SHUTDOWN_GRACE_S)
    if on_shutdown is not None:
        await on_shutdown()
    log.info("%s stopped", service_name)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Entry point helper: a short switch interval keeps the storage flusher
    thread from starving behind the event loop (see docs/design.md)."""
    sys.setswitchinterval(0.0005)
    asyncio.run(main())
