"""Which loopback ports a local cluster's services get: `PortBook`.

A port comes from one of three places: fixed by the caller (LocalCluster's
`ports`), kept from the data dir's last run (layout.py), or picked free now.
The book also remembers every port it has handed out, because free_port can
return a number twice and two processes of one cluster on one port would
fail each other. Kept apart from cluster.py so that the rules of where a
port comes from read in one place, away from starting and stopping the
processes that use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from oncelog_local.layout import KeptPorts
from oncelog_local.processes import free_port

# A service of the cluster, as (kind, node id).
Service = tuple[str, int]


def _check_fixed_ports(
    ports: Mapping[Service, tuple[int, int]], counts: Mapping[str, int],
) -> dict[Service, tuple[int, int]]:
    """LocalCluster's `ports`, checked: existing services, ports in
    1..65535, no port twice."""
    seen: dict[int, Service] = {}
    for (kind, index), pair in ports.items():
        if kind not in counts or not 0 <= index < counts[kind]:
            raise ValueError(f"ports names {kind} {index}, which this cluster does not have "
                             f"(it has {dict(counts)})")
        if len(pair) != 2:
            raise ValueError(f"ports: {kind} {index} got {pair!r}; expected (grpc_port, "
                             "metrics_port)")
        for port in pair:
            if type(port) is not int or not 0 < port < 65536:
                raise ValueError(f"ports: {kind} {index} got port {port!r}; expected 1..65535")
            if port in seen:
                raise ValueError(f"ports: port {port} is given to both {seen[port][0]} "
                                 f"{seen[port][1]} and {kind} {index}")
            seen[port] = (kind, index)
    return dict(ports)


def _all_ports(kept: KeptPorts) -> set[int]:
    """Every port of a kept service that it has (0: none)."""
    return {port for port in (kept.grpc_port, kept.metrics_port, kept.token_port,
                              kept.kafka_port) if port}


class PortBook:
    """The loopback ports of one cluster's services: fixed, kept or picked,
    and never one number for two of them."""

    def __init__(self, fixed: Mapping[Service, tuple[int, int]], counts: Mapping[str, int],
                 kept: Mapping[Service, KeptPorts]) -> None:
        """`fixed`: LocalCluster's `ports`, checked against `counts` (the
        services of each kind). `kept`: the ports of the data dir's last run
        (empty for a cluster that keeps none), taken again as picks: a port
        another process holds by the start gets a fresh pick there."""
        self._fixed = _check_fixed_ports(fixed, counts)
        fixed_ports = {port for pair in self._fixed.values() for port in pair}
        # No picked port may equal a fixed one.
        self._given: set[int] = set(fixed_ports)
        # A service whose kept port is now fixed for another picks anew.
        self._kept = {service: ports for service, ports in kept.items()
                      if service in self._fixed or not fixed_ports & _all_ports(ports)}
        for ports in self._kept.values():
            self._given.update(_all_ports(ports))

    def pick(self) -> int:
        """A free loopback port not handed to a process of this cluster before:
        free_port can return a number twice, and two of our own processes on
        one port would fail each other."""
        for _ in range(100):
            port = free_port()
            if port not in self._given:
                self._given.add(port)
                return port
        raise RuntimeError(f"free_port kept returning ports this cluster was given already "
                           f"({sorted(self._given)})")

    def reserve(self, ports: Iterable[int]) -> None:
        """Ports that something else of the cluster holds (etcd's members,
        kept from an earlier run and so not from pick): no service gets them."""
        self._given.update(ports)

    def is_fixed(self, kind: str, node_id: int) -> bool:
        """Whether the caller fixed this service's ports (a taken one is then
        not replaced)."""
        return (kind, node_id) in self._fixed

    def service_ports(self, kind: str, node_id: int, *, token: bool, kafka: bool) -> KeptPorts:
        """A new service's ports: fixed ones (gRPC and metrics), else the
        ones it kept, else fresh picks; a token and a Kafka listener's port
        only when asked for (0 otherwise). Picked in that order: gRPC,
        metrics, token, Kafka."""
        kept = self._kept.get((kind, node_id), KeptPorts(0, 0))
        grpc_port, metrics_port = self._fixed.get((kind, node_id)) or (
            kept.grpc_port or self.pick(), kept.metrics_port or self.pick())
        token_port = (kept.token_port or self.pick()) if token else 0
        kafka_port = (kept.kafka_port or self.pick()) if kafka else 0
        return KeptPorts(grpc_port, metrics_port, token_port, kafka_port)
