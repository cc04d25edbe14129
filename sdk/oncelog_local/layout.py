"""The ports a local cluster's services had at a data dir's last start.

LocalCluster (oncelog.testing) writes them into the data dir once its
addresses are final and takes them again at the next run of that data dir,
so clients, scripts and a pasted `export ONCELOG_BOOTSTRAP=...` stay right
across runs; `oncelog cluster up` reads the same file to check, before
anything starts, that no other process holds one of them. Kept apart from
oncelog.testing so that the CLI can name the file without importing the
process machinery.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

PORTS_FILE = "cluster-ports.json"


@dataclass(frozen=True, slots=True)
class KeptPorts:
    """The ports one service had at its data dir's last start (0: none)."""

    grpc_port: int
    metrics_port: int
    token_port: int = 0
    kafka_port: int = 0


class KeptLayout(NamedTuple):
    """What a data dir's last start left for the next one (PORTS_FILE)."""

    ports: dict[tuple[str, int], KeptPorts]
    # Whether it served Kafka's protocol (`oncelog cluster up` keeps doing so).
    kafka: bool
    # Its etcd members (0: not replicated) and whether it was secured; files
    # written before these existed have neither.
    etcd_members: int = 0
    security: bool = False


def load_kept_ports(data_dir: str | os.PathLike[str]) -> KeptLayout:
    """The layout a data dir's last start wrote; empty when it has none.
    Raises ValueError naming the file when it is not a ports file."""
    path = Path(data_dir) / PORTS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return KeptLayout({}, kafka=False)
    ports: dict[tuple[str, int], KeptPorts] = {}
    try:
        doc = json.loads(text)
        for entry in doc["services"]:
            ports[(str(entry["kind"]), int(entry["node_id"]))] = KeptPorts(
                int(entry["grpc_port"]), int(entry["metrics_port"]),
                int(entry.get("token_port", 0)), int(entry.get("kafka_port", 0)))
        # Files written before Kafka's listener existed have no "kafka".
        kafka, security = doc.get("kafka", False), doc.get("security", False)
        etcd_members = doc.get("etcd_members", 0)
        for name, value in (("kafka", kafka), ("security", security)):
            if not isinstance(value, bool):
                raise TypeError(f'"{name}" is {value!r}, not true or false')
        if type(etcd_members) is not int or etcd_members < 0:
            raise TypeError(f'"etcd_members" is {etcd_members!r}, not a count')
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a ports file ({type(exc).__name__}: {exc}); delete "
                         "it to start on new ports") from exc
    return KeptLayout(ports, kafka=kafka, etcd_members=etcd_members, security=security)


def save_kept_ports(data_dir: Path, layout: KeptLayout) -> None:
    """Writes the layout for the data dir's next start, atomically."""
    path = data_dir / PORTS_FILE
    doc = {"kafka": layout.kafka, "etcd_members": layout.etcd_members,
           "security": layout.security, "services": [
        {"kind": kind, "node_id": node_id, "grpc_port": kept.grpc_port,
         "metrics_port": kept.metrics_port, "token_port": kept.token_port,
         "kafka_port": kept.kafka_port}
        for (kind, node_id), kept in sorted(layout.ports.items())
    ]}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(temporary, path)  # whole or not at all, should we die meanwhile
