"""The group coordinator process: wiring, configuration, lifecycle."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time

import grpc

from oncelog.v1 import group_coordinator_pb2, group_coordinator_pb2_grpc
from services.common import server_base
from services.common.service_error import ServiceError
from services.common.store_client import StoreClient
from services.group_coordinator import metrics
from services.group_coordinator.runtime import TP, GroupConfig, GroupCoordinatorRuntime
from services.group_coordinator.servicer import GroupCoordinatorServicer

log = logging.getLogger(__name__)

# How often the lag metric's end offsets are refreshed, by default.
DEFAULT_LAG_REFRESH_INTERVAL_MS = 5000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.group_coordinator", description="oncelog group coordinator"
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


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server_base.configure_logging(args.log_format, args.log_level, "group_coordinator")
    layout = server_base.layout_from_args(args)
    advertised = args.advertised or layout.group_coordinators[args.node_id]
    store = StoreClient(layout)
    runtime = GroupCoordinatorRuntime(
        layout=layout, node_id=args.node_id, store=store,
        now_ms=lambda: int(time.time() * 1000),
        config=GroupConfig(
            min_session_timeout_ms=args.min_session_timeout_ms,
            max_session_timeout_ms=args.max_session_timeout_ms,
            max_heartbeat_interval_ms=args.max_heartbeat_interval_ms,
            offsets_retention_ms=args.offsets_retention_ms,
            retention_check_interval_ms=args.retention_check_interval_ms,
        ),
        on_rebalance=lambda group_id: metrics.REBALANCES.labels(group_id).inc(),
    )
    end_offsets: dict[TP, int] = {}
    metrics.register(runtime, lambda: dict(end_offsets))
    servicer = GroupCoordinatorServicer(runtime)
    lag_task: asyncio.Task[None] | None = None

    async def started() -> None:
        nonlocal lag_task
        await runtime.start()
        lag_task = asyncio.ensure_future(_refresh_end_offsets(
            runtime, store, end_offsets, args.lag_refresh_interval_ms))

    async def shutdown() -> None:
        if lag_task is not None:
            lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag_task
        await runtime.stop()
        await store.close()

    def register(server: grpc.aio.Server) -> None:
        group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(servicer, server)

    await server_base.serve(
        service_name="group_coordinator",
        full_service_names=[
            group_coordinator_pb2.DESCRIPTOR.services_by_name["GroupCoordinator"].full_name
        ],
        listen=args.listen or advertised,
        register=register,
        metrics_port=args.metrics_port,
        on_started=started,
        on_shutdown=shutdown,
    )
