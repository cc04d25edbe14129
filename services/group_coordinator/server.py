"""The group coordinator process: wiring, configuration, lifecycle."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from oncelog.v1 import group_coordinator_pb2, group_coordinator_pb2_grpc

from ..common.kernel.errors import ServiceError
from ..common.metadata.cluster import ClusterLayout
from ..common.rpc import server_base
from ..common.rpc.store_client import StoreClient
from ..common.security.service_security import ServiceSecurity
from . import metrics
from .rpc.servicer import GroupCoordinatorServicer
from .runtime import TP, GroupConfig, GroupCoordinatorRuntime

log = logging.getLogger(__name__)

# How often the lag metric's end offsets are refreshed, by default.
DEFAULT_LAG_REFRESH_INTERVAL_MS = 5000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_server.group_coordinator", description="oncelog group coordinator"
    )
    server_base.add_common_arguments(parser)
    defaults = GroupConfig()
    for flag, default, help_text in (
        ("min-session-timeout-ms", defaults.min_session_timeout_ms,
         "the shortest session timeout a member may ask for"),
        ("max-session-timeout-ms", defaults.max_session_timeout_ms,
         "the longest session timeout a member may ask for"),
        ("max-heartbeat-interval-ms", defaults.max_heartbeat_interval_ms,
         "members heartbeat every third of their session timeout, at most this often"),
        ("offsets-retention-ms", defaults.offsets_retention_ms,
         "an empty group with no commit for this long is removed with its offsets"),
        ("retention-check-interval-ms", defaults.retention_check_interval_ms,
         "how often expired groups and offsets of deleted topics are removed"),
        ("initial-rebalance-delay-ms", defaults.initial_rebalance_delay_ms,
         "a new classic group's first rebalance waits this long for more members (Kafka's "
         "group.initial.rebalance.delay.ms)"),
        ("lag-refresh-interval-ms", DEFAULT_LAG_REFRESH_INTERVAL_MS,
         "how often the lag metric's end offsets are read from the partition stores"),
    ):
        parser.add_argument(f"--{flag}", type=int,
                            default=int(server_base.env_default(flag, str(default)) or default),
                            help=help_text)
    return parser.parse_args(argv)


async def _refresh_end_offsets(runtime: GroupCoordinatorRuntime, store: StoreClient,
                               into: dict[TP, int], interval_ms: int) -> None:
    while True:
        await asyncio.sleep(interval_ms / 1000)
        partitions = {tp for _g, _id, offsets, _p in runtime.snapshot() for tp in offsets}
        for topic, partition in sorted(partitions):
            try:
                into[(topic, partition)] = await store.log_end_offset(
                    topic, partition, read_committed=True)
            except ServiceError as exc:
                log.debug("end offset of %s-%d: %s", topic, partition, exc)
                into.pop((topic, partition), None)
        for gone in set(into) - partitions:
            del into[gone]


@dataclass
class WiredGroupCoordinator:
    """A group coordinator wired to the partition stores: the runtime, the
    servicer that answers for it, the end offsets its lag metric reads, and
    what has to be stopped. `main` serves one; tests run one in-process
    (tests/support/inprocess_cluster.py)."""

    runtime: GroupCoordinatorRuntime
    servicer: GroupCoordinatorServicer
    store: StoreClient
    # None: no lag metric refresh (the metric then shows no lag).
    lag_refresh_interval_ms: int | None
    end_offsets: dict[TP, int] = field(default_factory=dict)
    _lag_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.runtime.start()
        if self.lag_refresh_interval_ms is not None:
            self._lag_task = asyncio.ensure_future(_refresh_end_offsets(
                self.runtime, self.store, self.end_offsets, self.lag_refresh_interval_ms))

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        await self.runtime.stop()
        await self.store.close()


def wire(layout: ClusterLayout, node_id: int, *, config: GroupConfig,
         lag_refresh_interval_ms: int | None = DEFAULT_LAG_REFRESH_INTERVAL_MS,
         now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> WiredGroupCoordinator:
    """The group coordinator's parts, connected as every deployment connects them."""
    store = StoreClient(layout)
    runtime = GroupCoordinatorRuntime(
        layout=layout, node_id=node_id, store=store, now_ms=now_ms, config=config,
        on_rebalance=lambda group_id: metrics.REBALANCES.labels(group_id).inc(),
    )
    return WiredGroupCoordinator(runtime, GroupCoordinatorServicer(runtime), store,
                                 lag_refresh_interval_ms)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server_base.configure_logging(args.log_format, args.log_level, "group_coordinator")
    # First: it makes every channel of this process use TLS when it serves TLS.
    security = ServiceSecurity.from_args(args, "group_coordinator")
    try:
        layout = server_base.layout_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"group_coordinator: {exc}") from exc
    advertised = args.advertised or layout.group_coordinators[args.node_id]
    wired = wire(
        layout, args.node_id, lag_refresh_interval_ms=args.lag_refresh_interval_ms,
        config=GroupConfig(
            min_session_timeout_ms=args.min_session_timeout_ms,
            max_session_timeout_ms=args.max_session_timeout_ms,
            max_heartbeat_interval_ms=args.max_heartbeat_interval_ms,
            offsets_retention_ms=args.offsets_retention_ms,
            retention_check_interval_ms=args.retention_check_interval_ms,
            initial_rebalance_delay_ms=args.initial_rebalance_delay_ms,
        ),
    )
    metrics.register(wired.runtime, lambda: dict(wired.end_offsets))
    # With --authorizer acl, the ACLs are read through the coordinator's store client.
    security.watch_acls(wired.store)

    def register(server: grpc.aio.Server) -> None:
        group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(wired.servicer, server)

    await server_base.serve(
        service_name="group_coordinator",
        full_service_names=[
            group_coordinator_pb2.DESCRIPTOR.services_by_name["GroupCoordinator"].full_name
        ],
        listen=args.listen or advertised,
        register=register,
        metrics_port=args.metrics_port,
        on_started=wired.start,
        on_shutdown=wired.stop,
        security=security,
    )
