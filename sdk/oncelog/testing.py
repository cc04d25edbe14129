"""A whole oncelog cluster on this machine, each service its own OS process.

    with LocalCluster(data_dir) as cluster:
        producer = Producer(bootstrap=cluster.bootstrap)
        cluster.kill("partition_store", 0)      # SIGKILL
        cluster.restart("partition_store", 0)   # same data dir, same address

The public name of the `oncelog_local` package (its docstring and
oncelog_local/cluster.py say everything LocalCluster does). It runs the
services, so it needs the server extra: pip install 'oncelog[server]'.
"""

from __future__ import annotations

from oncelog_local.cluster import (
    CLIENT,
    ETCD,
    KINDS,
    STOP_TIMEOUT_S,
    LocalCluster,
    wait_for_markers,
)
from oncelog_local.partitions import PartitionPlacement
from oncelog_local.pki import (
    SECURITY_DIR,
    SERVICE_COMMON_NAME,
    ClientSecurityConfig,
    TokenSecurityConfig,
)
from oncelog_local.processes import PortTakenError, ServiceProcess, free_port

__all__ = [
    "CLIENT",
    "ETCD",
    "KINDS",
    "SECURITY_DIR",
    "SERVICE_COMMON_NAME",
    "STOP_TIMEOUT_S",
    "ClientSecurityConfig",
    "LocalCluster",
    "PartitionPlacement",
    "PortTakenError",
    "ServiceProcess",
    "TokenSecurityConfig",
    "free_port",
    "wait_for_markers",
]
