"""The partition store as a Kafka broker: what the handlers are given.

One KafkaBroker per store process. Kafka's node ids are the stores' node
ids, and a store's Kafka address is its listener's advertised address
(`--kafka-advertised`, else `--kafka-listen`); every store learns the
others' from `--kafka-stores` (single copies) or from their registrations
in etcd (replicated), as it learns their gRPC addresses.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..common.metadata.cluster import ClusterLayout
from ..common.security.guard import SecurityGuard
from ..partition_store.quotas import StoreQuotas
from ..partition_store.runtime import StoreRuntime
from .apis import ApiKey
from .context import Handler
from .rpc.forward import CoordinatorClient

# The namespace of the cluster ids this module derives (uuid5).
_CLUSTER_ID_NAMESPACE = uuid.UUID("6f6e6365-6c6f-6700-8000-6b61666b6121")


def cluster_id_for(layout: ClusterLayout, metadata_root: str) -> str:
    """A Kafka cluster id (22 characters of URL-safe base64, as Kafka's):
    the same in every store of one cluster, derived from what they share —
    the first store's address and the metadata root — so it needs no
    coordination and survives restarts."""
    digest = uuid.uuid5(_CLUSTER_ID_NAMESPACE, f"{layout.stores[0]}|{metadata_root}")
    return base64.urlsafe_b64encode(digest.bytes).decode().rstrip("=")


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


@dataclass(slots=True)
class KafkaBroker:
    runtime: StoreRuntime
    node_id: int
    cluster_id: str
    # Node id -> advertised Kafka listener address of every store known now.
    addresses: Callable[[], Mapping[int, str]]
    coordinators: CoordinatorClient
    handlers: Mapping[ApiKey, Handler]
    # None: no authentication or authorization (a plain-text cluster).
    guard: SecurityGuard | None = None
    # The store's client quotas, the same as its gRPC port's; None: unlimited.
    quotas: StoreQuotas | None = None

    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every store with a Kafka listener."""
        out = []
        for node_id, address in sorted(self.addresses().items()):
            host, port = split_host_port(address)
            out.append((node_id, host, port))
        return out
