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

from oncelog.v1 import group_coordinator_pb2_grpc

from ..common.kernel.errors import ServiceError
from ..common.metadata.cluster import ClusterLayout, LeaderOf
from ..common.rpc import server_base
from ..common.rpc.local_calls import InProcess
from ..common.rpc.store_client import StoreClient
from ..common.security.service_security import ServiceSecurity
from . import metrics
from .config import (
    DEFAULT_LAG_REFRESH_INTERVAL_MS,
    GroupConfig,
    add_group_coordinator_arguments,
    group_config_from_args,
)
from .rpc.servicer import SERVICE_NAME, GroupCoordinatorServicer
from .runtime import TP, GroupCoordinatorRuntime

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_server.group_coordinator", description="oncelog group coordinator"
    )
    server_base.add_common_arguments(parser)
    add_group_coordinator_arguments(parser)
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

    def export_metrics(self) -> None:
        """Its groups' gauges on this process's metrics port (once per process)."""
        metrics.register(self.runtime, lambda: dict(self.end_offsets))

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        await self.runtime.stop()
        await self.store.close()


def wire(layout: ClusterLayout, node_id: int, *, config: GroupConfig,
         lag_refresh_interval_ms: int | None = DEFAULT_LAG_REFRESH_INTERVAL_MS,
         now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
         local: InProcess | None = None,
         leader_of: LeaderOf | None = None) -> WiredGroupCoordinator:
    """The group coordinator's parts, connected as every deployment connects them.
    `local`: the partition store whose process this coordinator runs in
    (--group-coordinator), asked without gRPC; `leader_of`: that store's
    view of who leads each partition (see the transaction coordinator's
    `wire`: with a group coordinator in every store, each owns the
    `__consumer_offsets` partitions its store leads)."""
    store = StoreClient(layout, local=local)
    runtime = GroupCoordinatorRuntime(
        layout=layout, node_id=node_id, store=store, now_ms=now_ms, config=config,
        on_rebalance=lambda group_id: metrics.REBALANCES.labels(group_id).inc(),
        follow_leaders=leader_of is not None and layout.group_coordinators_follow_leaders,
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
        config=group_config_from_args(args),
    )
    wired.export_metrics()
    # With --authorizer acl, the ACLs are read through the coordinator's store client.
    security.watch_acls(wired.store)

    def register(server: grpc.aio.Server) -> None:
        group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(wired.servicer, server)

    await server_base.serve(
        service_name="group_coordinator",
        full_service_names=[SERVICE_NAME],
        listen=args.listen or advertised,
        register=register,
        metrics_port=args.metrics_port,
        on_started=wired.start,
        on_shutdown=wired.stop,
        security=security,
    )
