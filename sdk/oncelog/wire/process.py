"""What a service process says about itself to whoever started it.

* The line a service prints when it cannot listen because another process
  holds its port, and the parser that finds it in a service's log. The
  services write it (services/common/rpc/server_base.py) and LocalCluster
  (oncelog.testing) reads it to tell "my port was taken between the pick and
  the bind, pick another" from every other reason a process exits at start.
* The health-check service name by which a service process answers for
  itself, and not for whatever else holds its port: every service registers
  the gRPC health service `oncelog.process.<pid>` with the same status as its
  other services. LocalCluster waits for that name with the pid it started:
  a process that took the port before ours could bind answers "" as SERVING,
  but not our pid's name, so a process about to exit because its port is
  taken is never mistaken for ready.

One definition keeps writer and reader from drifting apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What a service listens for: its gRPC port, its token listener (a second
# gRPC port, TLS without client certificates), its Prometheus metrics port,
# and a store's Kafka listener.
GRPC = "gRPC"
TOKEN_GRPC = "token gRPC"
METRICS = "metrics"
KAFKA = "Kafka"
PURPOSES = (GRPC, TOKEN_GRPC, METRICS, KAFKA)

_LINE = re.compile(
    r"cannot listen for (?P<purpose>" + "|".join(PURPOSES) + r") on (?P<address>\S+?)"
    r": the port is in use"
)


@dataclass(frozen=True, slots=True)
class PortInUse:
    purpose: str
    address: str

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


def port_in_use_line(service: str, purpose: str, address: str) -> str:
    """The message of a service that cannot listen on `address` ("host:port")
    because another socket holds that port."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r}: expected one of {PURPOSES}")
    return f"{service}: cannot listen for {purpose} on {address}: the port is in use"


def find_ports_in_use(log_text: str) -> list[PortInUse]:
    """Every port-in-use line in a service's log text, in order (JSON log
    lines carry the message unescaped: it has no quotes or backslashes)."""
    return [PortInUse(m["purpose"], m["address"]) for m in _LINE.finditer(log_text)]


def grpc_port_taken(log_text: str, address: str) -> bool:
    """Whether a service's log says that another process holds the gRPC
    address it was given."""
    return any(taken.purpose == GRPC and taken.address == address
               for taken in find_ports_in_use(log_text))


def process_health_service(pid: int) -> str:
    """The health service name of the service process with this pid."""
    if pid <= 0:
        raise ValueError(f"pid is {pid}; it must be > 0")
    return f"oncelog.process.{pid}"
