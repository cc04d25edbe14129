"""The transaction coordinator process: wiring, configuration, lifecycle."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from oncelog.v1 import coordinator_pb2_grpc

from ..common.metadata.cluster import ClusterLayout, LeaderOf
from ..common.metadata.topic_counts import PartitionCounts
from ..common.rpc import server_base
from ..common.rpc.local_calls import InProcess
from ..common.rpc.store_client import StoreClient
from ..common.security.service_security import ServiceSecurity
from .config import add_coordinator_arguments, txn_config_from_args
from .core.producer_ids import DEFAULT_BLOCK_SIZE
from .markers import GrpcMarkerSender
from .producer_id_manager import ProducerIdManager
from .rpc.servicer import SERVICE_NAME, TransactionCoordinatorServicer
from .storage.producer_id_log import StoreProducerIdLog
from .storage.txn_log import StoreTxnLog
from .txn_runtime import TxnConfig, TxnCoordinatorRuntime

# How long a topic's partition count is trusted when AddPartitionsToTxn checks
# that its partitions exist. A miss is always read again, so this only bounds
# how long a deleted topic's partitions are still accepted (harmless: their
# markers are skipped); long, so that the hot path of a transaction's first
# write rarely waits for a catalog read, nor fails while the store that keeps
# the catalog restarts.
TOPIC_COUNTS_MAX_AGE_MS = 3_600_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_server.coordinator", description="oncelog transaction coordinator",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    server_base.add_common_arguments(parser)
    add_coordinator_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class WiredCoordinator:
    """A transaction coordinator wired to the partition stores: the runtime,
    the servicer that answers for it, and what has to be stopped. `main`
    serves one; tests run one in-process (tests/support/inprocess_cluster.py)."""

    runtime: TxnCoordinatorRuntime
    servicer: TransactionCoordinatorServicer
    markers: GrpcMarkerSender
    store: StoreClient

    async def start(self) -> None:
        await self.runtime.start()

    async def stop(self) -> None:
        await self.runtime.stop()
        await self.markers.close()
        await self.store.close()


def wire(layout: ClusterLayout, node_id: int, *, config: TxnConfig,
         producer_id_block_size: int = DEFAULT_BLOCK_SIZE,
         now_ms: Callable[[], int] = wall_clock_ms,
         local: InProcess | None = None,
         leader_of: LeaderOf | None = None) -> WiredCoordinator:
    """The coordinator's parts, connected as every deployment connects them.
    `local`: the partition store whose process this coordinator runs in
    (--transaction-coordinator), asked without gRPC; `leader_of`: that
    store's view of who leads each partition. With both, and a coordinator
    in every store, it owns the `__transaction_state` partitions its store
    leads (ClusterLayout.coordinators_follow_leaders); the store calls its
    `follow`. Otherwise it owns the layout's, and asks a store who leads."""
    store = StoreClient(layout, local=local)
    producer_ids = ProducerIdManager(
        StoreProducerIdLog(store), node_id=node_id, block_size=producer_id_block_size
    )
    markers = GrpcMarkerSender(layout, local=local)
    transactions = TxnCoordinatorRuntime(
        layout=layout, node_id=node_id, txn_log=StoreTxnLog(store), markers=markers,
        producer_ids=producer_ids, now_ms=now_ms, config=config,
        follow_leaders=leader_of is not None and layout.coordinators_follow_leaders,
    )
    servicer = TransactionCoordinatorServicer(
        layout=layout, producer_ids=producer_ids, transactions=transactions,
        topics=PartitionCounts(store, now_ms, max_age_ms=TOPIC_COUNTS_MAX_AGE_MS),
        leader_of=leader_of or store.current_leader,
    )
    return WiredCoordinator(transactions, servicer, markers, store)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server_base.configure_logging(args.log_format, args.log_level, "coordinator")
    # First: it makes every channel of this process use TLS when it serves TLS.
    security = ServiceSecurity.from_args(args, "coordinator")
    try:
        layout = server_base.layout_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"coordinator: {exc}") from exc
    advertised = args.advertised or layout.coordinators[args.node_id]
    wired = wire(
        layout, args.node_id, producer_id_block_size=args.producer_id_block_size,
        config=txn_config_from_args(args),
    )

    # With --authorizer acl, the ACLs are read through the coordinator's store client.
    security.watch_acls(wired.store)

    def register(server: grpc.aio.Server) -> None:
        coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(wired.servicer, server)

    await server_base.serve(
        service_name="coordinator",
        full_service_names=[SERVICE_NAME],
        listen=args.listen or advertised,
        register=register,
        node_id=args.node_id,
        metrics_port=args.metrics_port,
        shutdown_grace_ms=args.shutdown_grace_ms,
        on_started=wired.start,
        on_shutdown=wired.stop,
        security=security,
    )
