"""The transaction coordinator process: wiring, configuration, lifecycle."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from oncelog.v1 import coordinator_pb2_grpc

from ..common.metadata.cluster import ClusterLayout
from ..common.metadata.topic_counts import PartitionCounts
from ..common.rpc import server_base
from ..common.rpc.local_calls import InProcess
from ..common.rpc.store_client import StoreClient
from ..common.security.service_security import ServiceSecurity
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


def add_coordinator_arguments(parser: argparse.ArgumentParser, *,
                              max_transaction_timeout: bool = True) -> None:
    """The coordinator's own flags: also a partition store's, which can run
    a coordinator in its process (--transaction-coordinator). A store has
    its own --max-transaction-timeout-ms (the timeout it assumes for a
    transaction it was not told about, at least the coordinators'): one
    flag then sets both, so `max_transaction_timeout=False` leaves it out."""
    parser.add_argument(
        "--producer-id-block-size", type=int,
        default=server_base.env_default("producer-id-block-size", str(DEFAULT_BLOCK_SIZE)),
        help="producer ids claimed per durable block",
    )
    defaults = TxnConfig()
    flags = [
        ("max-transaction-timeout-ms", defaults.max_transaction_timeout_ms,
         "the longest transaction timeout a producer may ask for"),
        ("transactional-id-expiration-ms", defaults.transactional_id_expiration_ms,
         "an idle transactional id is forgotten after this"),
        ("transaction-check-interval-ms", defaults.check_interval_ms,
         "how often transaction timeouts and expirations are checked"),
    ]
    for flag, default, help_text in flags[0 if max_transaction_timeout else 1:]:
        parser.add_argument(f"--{flag}", type=int,
                            default=server_base.env_default(flag, str(default)), help=help_text)
    parser.add_argument(
        "--allow-two-phase-commit", action=argparse.BooleanOptionalAction,
        default=(server_base.env_default("allow-two-phase-commit", "true") or "").strip().lower()
        in ("1", "true", "yes", "on"),
        help="let producers initialize with two-phase commit (KIP-939): their "
             "transactions never time out and can be prepared and completed by another "
             "process (default on; --no-allow-two-phase-commit refuses them)",
    )


def txn_config_from_args(args: argparse.Namespace) -> TxnConfig:
    return TxnConfig(
        max_transaction_timeout_ms=args.max_transaction_timeout_ms,
        transactional_id_expiration_ms=args.transactional_id_expiration_ms,
        check_interval_ms=args.transaction_check_interval_ms,
        allow_two_phase_commit=args.allow_two_phase_commit,
    )


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
         local: InProcess | None = None) -> WiredCoordinator:
    """The coordinator's parts, connected as every deployment connects them.
    `local`: the partition store whose process this coordinator runs in
    (--transaction-coordinator), asked without gRPC."""
    store = StoreClient(layout, local=local)
    producer_ids = ProducerIdManager(
        StoreProducerIdLog(store), node_id=node_id, block_size=producer_id_block_size
    )
    markers = GrpcMarkerSender(layout, local=local)
    transactions = TxnCoordinatorRuntime(
        layout=layout, node_id=node_id, txn_log=StoreTxnLog(store), markers=markers,
        producer_ids=producer_ids, now_ms=now_ms, config=config,
    )
    servicer = TransactionCoordinatorServicer(
        layout=layout, producer_ids=producer_ids, transactions=transactions,
        topics=PartitionCounts(store, now_ms, max_age_ms=TOPIC_COUNTS_MAX_AGE_MS),
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
