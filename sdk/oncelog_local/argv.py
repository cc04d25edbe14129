"""The command line of every service of a local cluster: `CommandLines`.

Each service is told the whole layout on its command line (every store's,
coordinator's and group coordinator's address, and on a secured cluster
their token listeners), so a changed address changes every process's
command line; the rest is its own listeners, a store's data dir and the
coordinators it hosts, its security flags (pki.py) and the caller's extra
flags, last so that they win. Kept apart from cluster.py, which decides
when the command lines must be written again (a new store, a moved port)
and starts the processes with them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from oncelog_local.pki import LocalPki
from oncelog_local.processes import ServiceProcess

# The installed name of the services (services/ in the source tree): each
# process runs `python -m oncelog_server.<kind>`.
SERVER_PACKAGE = "oncelog_server"
# The partition store hosts these coordinators with these flags
# (LocalCluster(coordinators_in_stores=True)).
HOSTED_FLAGS = (("coordinator", "--transaction-coordinator"),
                ("group_coordinator", "--group-coordinator"))


class CommandLines:
    """Writes every service's argv from the cluster's layout and settings."""

    def __init__(self, *, hosts: Mapping[str, Sequence[int]],
                 transaction_state_partitions: int, consumer_offsets_partitions: int,
                 pki: LocalPki | None, kafka_listener: bool,
                 extra_args: Mapping[str, Sequence[str]]) -> None:
        """`hosts`: the store that runs each coordinator, by kind (empty:
        they run as processes of their own). `pki`: a secured cluster's
        (None: plain text). `extra_args`: flags by kind, after all others."""
        self._hosts = hosts
        self._transaction_state_partitions = transaction_state_partitions
        self._consumer_offsets_partitions = consumer_offsets_partitions
        self._pki = pki
        self._kafka_listener = kafka_listener
        self._extra_args = extra_args

    def assign(self, processes: Mapping[str, Sequence[ServiceProcess]]) -> None:
        """Sets every process's argv. Each names the whole layout (every
        process's gRPC address), so a changed address changes them all."""
        stores = processes["partition_store"]
        coordinators, group_coordinators = (
            processes[kind] or [stores[store] for store in self._hosts[kind]]
            for kind in ("coordinator", "group_coordinator"))
        layout_args = [
            "--stores", ",".join(p.address for p in stores),
            "--coordinators", ",".join(p.address for p in coordinators),
            "--group-coordinators", ",".join(p.address for p in group_coordinators),
            "--transaction-state-partitions", str(self._transaction_state_partitions),
            "--consumer-offsets-partitions", str(self._consumer_offsets_partitions),
        ]
        if self._pki is not None:
            for flag, procs in (("--token-stores", stores),
                                ("--token-coordinators", coordinators),
                                ("--token-group-coordinators", group_coordinators)):
                layout_args += [flag, ",".join(p.token_address for p in procs)]
        store_args: list[str] = []
        if self._kafka_listener:
            store_args = ["--kafka-stores", ",".join(p.kafka_address for p in stores)]
        for kind, procs in processes.items():
            for proc in procs:
                proc.argv = [
                    sys.executable, "-m", f"{SERVER_PACKAGE}.{kind}",
                    "--node-id", str(proc.node_id),
                    "--listen", proc.address,
                    "--metrics-port", str(proc.metrics_port),
                    *layout_args,
                ]
                if kind == "partition_store":
                    proc.argv += ["--data-dir", str(proc.data_dir), *store_args]
                    proc.argv += self._hosted_args(proc.node_id)
                    if proc.kafka_port:
                        proc.argv += ["--kafka-listen", proc.kafka_address]
                if self._pki is not None:
                    proc.argv += self._pki.service_args(proc.kind, proc.node_id,
                                                        proc.token_address)
                proc.argv += self._extra_args.get(kind, [])

    def _hosted_args(self, store: int) -> list[str]:
        """The flags of the coordinators a store runs: each names its index."""
        args: list[str] = []
        for hosted, flag in HOSTED_FLAGS:
            if store in self._hosts[hosted]:
                args += [flag, str(self._hosts[hosted].index(store))]
        return args
