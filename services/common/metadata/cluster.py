"""The cluster's layout: which processes exist and who owns what.

Placement is a pure function of the layout, so every process (and every
client, through Metadata) computes the same answer without a lock service. On
Kubernetes the addresses are StatefulSet DNS names, so the layout is fixed by
the chart's values; locally, LocalCluster picks the ports. One exception:
where every store runs a coordinator of a kind, a state partition's
coordinator is the one in the store that leads it now (`coordinator_now`),
so it moves with leadership, as Kafka's does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode

# Re-exported: the services name these from here.
from oncelog.wire.placement import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    owner_of_state_partition,
    preferred_store,
    state_partition,
)

from ..kernel.errors import ServiceError
from ..security.acl_records import ACLS_TOPIC, ACLS_TOPIC_PARTITIONS

PRODUCER_IDS_TOPIC = "__producer_ids"
INTERNAL_PREFIX = "__"

# The store node that leads a partition as a process sees it (-1: none
# now): where coordinators that follow leadership are (see
# ClusterLayout.coordinators_follow_leaders).
LeaderOf = Callable[[str, int], Awaitable[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterLayout:
    """Advertised addresses of every process; a node's id is its index."""

    stores: tuple[str, ...]
    coordinators: tuple[str, ...] = ()
    group_coordinators: tuple[str, ...] = ()
    transaction_state_partitions: int = 8
    consumer_offsets_partitions: int = 8
    # The token listeners' advertised addresses (--token-listen), by node id:
    # what a caller that came without a client certificate is told. Empty:
    # the processes of that kind have no token listener.
    token_stores: tuple[str, ...] = ()
    token_coordinators: tuple[str, ...] = ()
    token_group_coordinators: tuple[str, ...] = ()
    # The stores' Kafka listeners' advertised addresses (--kafka-listen), by
    # node id; empty: configured per store only (each knows its own, and a
    # replicated cluster learns the others' from their registrations).
    kafka_stores: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stores:
            raise ValueError("a cluster needs at least one partition store address")
        if self.transaction_state_partitions < 1 or self.consumer_offsets_partitions < 1:
            raise ValueError("internal topics need at least one partition")
        for flag, token, main in (
                ("--token-stores", self.token_stores, self.stores),
                ("--token-coordinators", self.token_coordinators, self.coordinators),
                ("--token-group-coordinators", self.token_group_coordinators,
                 self.group_coordinators),
                ("--kafka-stores", self.kafka_stores, self.stores)):
            if token and len(token) != len(main):
                raise ValueError(f"{flag} names {len(token)} addresses for {len(main)} "
                                 "processes; give one per process, in node-id order, or none")

    def coordinator_addresses(self, *, token: bool) -> tuple[str, ...]:
        """The transaction coordinators' addresses for a caller; `token`: it
        came without a client certificate (see token_stores)."""
        return self.token_coordinators if token and self.token_coordinators else (
            self.coordinators)

    def group_coordinator_addresses(self, *, token: bool) -> tuple[str, ...]:
        return self.token_group_coordinators if token and self.token_group_coordinators else (
            self.group_coordinators)

    @property
    def controller_node_id(self) -> int:
        """The store that keeps the topic catalog."""
        return 0

    def store_for(self, topic: str, partition: int) -> int:
        """The store node that owns a partition."""
        return preferred_store(topic, partition, len(self.stores))

    def transaction_state_partition(self, transactional_id: str) -> int:
        return state_partition(transactional_id, self.transaction_state_partitions)

    def consumer_offsets_partition(self, group_id: str) -> int:
        return state_partition(group_id, self.consumer_offsets_partitions)

    def coordinator_for_partition(self, partition: int) -> int:
        """The transaction coordinator node that owns a __transaction_state
        partition by the layout (coordinators that follow leadership: while
        its preferred leader leads it; see `coordinator_now`)."""
        if not self.coordinators:
            raise ValueError("the cluster has no transaction coordinator")
        return owner_of_state_partition(partition, len(self.coordinators))

    def group_coordinator_for_partition(self, partition: int) -> int:
        if not self.group_coordinators:
            raise ValueError("the cluster has no group coordinator")
        return owner_of_state_partition(partition, len(self.group_coordinators))

    @property
    def coordinators_follow_leaders(self) -> bool:
        """Every store runs a transaction coordinator (their addresses are
        the stores'): then each owns the `__transaction_state` partitions
        its store leads, and a partition's coordinator moves with its
        leadership, as Kafka's does (docs/coordinator.md, "The coordinator
        in a store")."""
        return _one_per_store(self.coordinators, self.stores)

    @property
    def group_coordinators_follow_leaders(self) -> bool:
        """The same for the group coordinators and `__consumer_offsets`."""
        return _one_per_store(self.group_coordinators, self.stores)

    async def coordinator_now(self, partition: int, leader_of: LeaderOf) -> int:
        """The transaction coordinator node that serves a
        `__transaction_state` partition now: the layout's, or, when the
        coordinators follow leadership, the one in the store that leads the
        partition (COORDINATOR_NOT_AVAILABLE while none does)."""
        if not self.coordinators_follow_leaders:
            return self.coordinator_for_partition(partition)
        return self._hosted_by(self.coordinators, TRANSACTION_STATE_TOPIC, partition,
                               await leader_of(TRANSACTION_STATE_TOPIC, partition))

    async def group_coordinator_now(self, partition: int, leader_of: LeaderOf) -> int:
        """The same for a `__consumer_offsets` partition's group coordinator."""
        if not self.group_coordinators_follow_leaders:
            return self.group_coordinator_for_partition(partition)
        return self._hosted_by(self.group_coordinators, CONSUMER_OFFSETS_TOPIC, partition,
                               await leader_of(CONSUMER_OFFSETS_TOPIC, partition))

    def coordinators_to_ask(self, live_stores: Collection[int] | None) -> list[int]:
        """The transaction coordinator nodes that a question for all of
        them (a listing) goes to: every one; or, where they follow
        leadership and `live_stores` (the stores whose lease is alive) is
        known, those in live stores, as Kafka's metadata names only live
        brokers. A dead store's partitions are led by live ones once its
        lease has ended, and listed there. Every one when none is live in
        this view (a process starting, or cut off from the metadata store)."""
        return self._in_live_stores(self.coordinators, live_stores,
                                    self.coordinators_follow_leaders)

    def group_coordinators_to_ask(self, live_stores: Collection[int] | None) -> list[int]:
        """The same for the group coordinators."""
        return self._in_live_stores(self.group_coordinators, live_stores,
                                    self.group_coordinators_follow_leaders)

    def coordinator_in_store(self, addresses: Sequence[str], store: int) -> int | None:
        """The coordinator node (of the kind whose `addresses` these are)
        that store node `store` runs, when the coordinators follow
        leadership; None when it runs none."""
        if not 0 <= store < len(self.stores) or self.stores[store] not in addresses:
            return None
        return addresses.index(self.stores[store])

    def _in_live_stores(self, addresses: Sequence[str], live_stores: Collection[int] | None,
                        follow: bool) -> list[int]:
        every = list(range(len(addresses)))
        if not follow or live_stores is None:
            return every
        live = sorted(node for store in live_stores
                      if (node := self.coordinator_in_store(addresses, store)) is not None)
        return live or every

    def _hosted_by(self, addresses: Sequence[str], topic: str, partition: int,
                   leader: int) -> int:
        node = self.coordinator_in_store(addresses, leader) if leader >= 0 else None
        if node is None:
            raise ServiceError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{topic}-{partition} has no leader that runs its coordinator right now "
                f"(leader: store node {leader}); retry")
        return node

    def internal_topics(self) -> dict[str, int]:
        """Internal topics and their partition counts, created on first start."""
        return {
            PRODUCER_IDS_TOPIC: 1,
            TRANSACTION_STATE_TOPIC: self.transaction_state_partitions,
            CONSUMER_OFFSETS_TOPIC: self.consumer_offsets_partitions,
            # The ACLs (docs/security.md); created on every cluster, read
            # only by services started with --authorizer acl.
            ACLS_TOPIC: ACLS_TOPIC_PARTITIONS,
        }


def _one_per_store(coordinators: Sequence[str], stores: Sequence[str]) -> bool:
    return len(coordinators) == len(stores) > 0 and set(coordinators) == set(stores)


def split_addresses(value: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in value.split(",") if a.strip())
