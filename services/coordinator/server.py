"""The transaction coordinator process: wiring, configuration, lifecycle."""

from __future__ import annotations

import argparse

import grpc

from oncelog.v1 import coordinator_pb2, coordinator_pb2_grpc
from services.common import server_base
from services.common.store_client import StoreClient
from services.coordinator.core.producer_ids import DEFAULT_BLOCK_SIZE
from services.coordinator.runtime import ProducerIdManager
from services.coordinator.servicer import TransactionCoordinatorServicer
from services.coordinator.storage.producer_id_log import StoreProducerIdLog


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.coordinator", description="oncelog transaction coordinator"
    )
    server_base.add_common_arguments(parser)
    parser.add_argument(
        "--producer-id-block-size", type=int,
        default=int(server_base.env_default("producer-id-block-size", str(DEFAULT_BLOCK_SIZE))
                    or DEFAULT_BLOCK_SIZE),
        help="producer ids claimed per durable block",
    )
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server_base.configure_logging(args.log_format, args.log_level, "coordinator")
    layout = server_base.layout_from_args(args)
    advertised = args.advertised or layout.coordinators[args.node_id]
    store = StoreClient(layout)
    producer_ids = ProducerIdManager(
        StoreProducerIdLog(store), node_id=args.node_id, block_size=args.producer_id_block_size
    )
    servicer = TransactionCoordinatorServicer(layout=layout, producer_ids=producer_ids)

    def register(server: grpc.aio.Server) -> None:
        coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(servicer, server)

    await server_base.serve(
        service_name="coordinator",
        full_service_names=[
            coordinator_pb2.DESCRIPTOR.services_by_name["TransactionCoordinator"].full_name
        ],
        listen=args.listen or advertised,
        register=register,
        metrics_port=args.metrics_port,
        on_shutdown=store.close,
    )
