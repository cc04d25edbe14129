"""The coordinators a partition store runs in its process, wired to it.

Imported only by a store that runs one (hosted_coordinators.py has the
flags): the coordinators' modules cost tens of milliseconds at every start.
Both kinds share the process's one InProcess (services/common/rpc/
local_calls.py), which also answers their calls to this store.

Where every store runs a coordinator of a kind (ClusterLayout's
`coordinators_follow_leaders`), the one here owns the state partitions this
store leads: the store tells it (`follow`) whenever it starts or stops
leading one, and `start` tells it what the store leads already.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from oncelog.v1 import coordinator_pb2_grpc, group_coordinator_pb2_grpc

from ...common.metadata.cluster import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ClusterLayout,
    LeaderOf,
)
from ...common.rpc.local_calls import InProcess
from ...coordinator.config import txn_config_from_args
from ...coordinator.rpc.servicer import SERVICE_NAME as TRANSACTION_SERVICE
from ...coordinator.server import WiredCoordinator
from ...coordinator.server import wire as wire_coordinator
from ...group_coordinator.config import group_config_from_args
from ...group_coordinator.rpc.servicer import SERVICE_NAME as GROUP_SERVICE
from ...group_coordinator.server import WiredGroupCoordinator
from ...group_coordinator.server import wire as wire_group_coordinator

log = logging.getLogger("oncelog.partition_store")


@dataclass
class HostedCoordinators:
    transaction: WiredCoordinator | None
    group: WiredGroupCoordinator | None
    layout: ClusterLayout

    @property
    def service_names(self) -> list[str]:
        return ([TRANSACTION_SERVICE] if self.transaction is not None else []) + (
            [GROUP_SERVICE] if self.group is not None else [])

    def register(self, server: grpc.aio.Server) -> None:
        """Serves them over gRPC too, for every other process's calls."""
        if self.transaction is not None:
            coordinator_pb2_grpc.add_TransactionCoordinatorServicer_to_server(
                self.transaction.servicer, server)
        if self.group is not None:
            group_coordinator_pb2_grpc.add_GroupCoordinatorServicer_to_server(
                self.group.servicer, server)

    def follow(self, topic: str, partition: int, leads: bool, leader_epoch: int) -> None:
        """This store started or stopped leading a partition of an internal
        topic (StoreHooks.on_leadership): a coordinator that follows
        leadership takes its state partition over or lets it go."""
        if topic == TRANSACTION_STATE_TOPIC and self.transaction is not None:
            self.transaction.runtime.follow(partition, leads=leads, leader_epoch=leader_epoch)
        elif topic == CONSUMER_OFFSETS_TOPIC and self.group is not None:
            self.group.runtime.follow(partition, leads=leads, leader_epoch=leader_epoch)

    async def start(self, led: Callable[[str, int], tuple[bool, int]]) -> None:
        """After the store has started: they read their state from it. `led`
        says whether the store leads a partition now, and at which leader
        epoch; what it leads already is followed from the start."""
        if self.transaction is not None:
            await self.transaction.start()
        if self.group is not None:
            await self.group.start()
        for topic, count in ((TRANSACTION_STATE_TOPIC, self.layout.transaction_state_partitions),
                             (CONSUMER_OFFSETS_TOPIC, self.layout.consumer_offsets_partitions)):
            for partition in range(count):
                self.follow(topic, partition, *led(topic, partition))

    async def stop(self) -> None:
        """Before the store closes: their last appends and markers go to it."""
        group, self.group = self.group, None
        if group is not None:
            await group.stop()
        transaction, self.transaction = self.transaction, None
        if transaction is not None:
            await transaction.stop()


def host(args: argparse.Namespace, layout: ClusterLayout, local: InProcess, *,
         coordinator_id: int | None, group_coordinator_id: int | None,
         leader_of: LeaderOf) -> HostedCoordinators:
    """The coordinators the flags name, answering `local`'s calls to them;
    `leader_of`: this store's view of who leads each partition."""
    transaction = None
    if coordinator_id is not None:
        transaction = wire_coordinator(
            layout, coordinator_id, config=txn_config_from_args(args),
            producer_id_block_size=args.producer_id_block_size, local=local,
            leader_of=leader_of)
        transaction.servicer.serve_in_process(local)
        log.info("transaction coordinator %d runs in this store's process", coordinator_id)
    group = None
    if group_coordinator_id is not None:
        group = wire_group_coordinator(
            layout, group_coordinator_id, config=group_config_from_args(args),
            lag_refresh_interval_ms=args.lag_refresh_interval_ms, local=local,
            leader_of=leader_of)
        group.export_metrics()
        group.servicer.serve_in_process(local)
        log.info("group coordinator %d runs in this store's process", group_coordinator_id)
    return HostedCoordinators(transaction, group, layout)
