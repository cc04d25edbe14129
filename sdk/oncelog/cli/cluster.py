"""`oncelog cluster up`: a local cluster in the foreground (oncelog.testing)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from oncelog.cli._common import (
    BOOTSTRAP_ENV,
    COMMAND_CONFIG_ENV,
    LOCK_FILE,
    SECURITY_SETTINGS,
    STOP_POLL_INTERVAL_S,
    CliError,
    UsageError,
)
from oncelog.signals import stop_on_signals
from oncelog_local.layout import PORTS_FILE, load_kept_ports


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
    cluster = commands.add_parser("cluster", help="run a local cluster")
    cluster_cmds = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = cluster_cmds.add_parser(
        "up", help="start a cluster on this machine in the foreground (Ctrl-C stops it)",
        description=(
            "Starts a cluster in the foreground; Ctrl-C or SIGTERM stops it. The ports (and "
            f"--kafka) are kept in DATA_DIR/{PORTS_FILE} and used again by the next start of "
            "the same data dir; one data dir serves one running cluster at a time."
        ),
    )
    up.add_argument("--data-dir", required=True, help="where the services keep their data")
    up.add_argument("--port", type=int,
                    help="the bootstrap port (the first partition store's); default: the "
                         "port of the last start of this data dir, else a free one")
    up.add_argument("--stores", "--partition-stores", dest="partition_stores", type=int,
                    metavar="N", help="partition stores (default: 3 with --replicated, else 1)")
    up.add_argument("--coordinators", type=int, default=1)
    up.add_argument("--coordinators-in-stores", action="store_true",
                    help="run a transaction coordinator and a group coordinator in every "
                         "partition store's process instead of --coordinators and "
                         "--group-coordinators processes of their own; their calls to each "
                         "other then take no gRPC (docs/coordinator.md, 'The coordinator in "
                         "a store')")
    up.add_argument("--group-coordinators", type=int, default=1)
    up.add_argument("--replicated", action=argparse.BooleanOptionalAction,
                    help="run etcd and keep min(3, stores) copies of every partition "
                         "(docs/replication.md); default: as at the last start of this data "
                         "dir, else off. A data dir keeps what its first start chose")
    up.add_argument("--etcd-members", type=int, choices=(1, 3),
                    help="etcd members of a replicated cluster (default 1)")
    up.add_argument("--secure", action=argparse.BooleanOptionalAction,
                    help="TLS with client certificates and ACLs (docs/security.md); writes "
                         "DATA_DIR/admin.properties for --command-config; default: as at the "
                         "last start of this data dir, else off")
    up.add_argument("--kafka", action=argparse.BooleanOptionalAction,
                    help="also serve Kafka's wire protocol on every partition store, for "
                         "Kafka's own clients (docs/kafka-protocol.md), and print their "
                         "bootstrap.servers; default: as at the last start of this data dir, "
                         "else off")




ServicePorts = dict[tuple[str, int], tuple[int, int]]
_BOOTSTRAP_SERVICE = ("partition_store", 0)


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Holds an exclusive lock on DATA_DIR/cluster.lock for the cluster's
    life (the kernel drops it when the process ends, however it ends), so a
    second `cluster up` of the same data dir is refused instead of running
    two sets of stores on one set of files."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CliError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise CliError(f"data dir {data_dir} is in use by another `oncelog cluster up`"
                           f"{pid}; stop it first, or give another --data-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _port_free(port: int) -> bool:
    """Whether a service could listen on 127.0.0.1:port now. SO_REUSEADDR
    as gRPC's servers set it: a port whose old connections linger in
    TIME_WAIT (our own last run) is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_taken(port: int, kind: str, node_id: int, purpose: str, *, data_dir: Path,
                from_option: bool) -> CliError:
    why = "given by --port" if from_option else f"kept from its last start in {PORTS_FILE}"
    return CliError(
        f"port {port} is taken by another process: {kind} {node_id} of the cluster in "
        f"{data_dir} listens there for {purpose} ({why}); free the port, or give "
        "another --port or --data-dir"
    )


def _etcd_members(args: argparse.Namespace, kept: int, *, started: bool) -> int:
    """How many etcd members this start runs: what the flags ask, else what
    the data dir's last start ran. A data dir stays replicated or not for
    its life: its stores' data is laid out for one or the other."""
    wanted = kept if args.replicated is None else (
        (args.etcd_members or kept or 1) if args.replicated else 0)
    if args.etcd_members is not None:
        if args.replicated is False:
            raise UsageError("--etcd-members needs a replicated cluster, not --no-replicated")
        wanted = args.etcd_members
    if started and bool(wanted) != bool(kept):
        was = "replicated (with etcd)" if kept else "not replicated (no etcd)"
        raise CliError(f"this data dir was started {was}, and stays so: its stores' data is "
                       f"laid out for it; use another --data-dir")
    return wanted


def _write_admin_properties(data_dir: Path, config: Mapping[str, object]) -> Path:
    """DATA_DIR/admin.properties: the super user's TLS files as a client
    properties file, for --command-config (Kafka's property names)."""
    by_dest = {dest: prop for dest, _env, prop in SECURITY_SETTINGS}
    path = data_dir / "admin.properties"
    lines = ["# oncelog cluster up --secure: connect as User:admin (a super user)"]
    lines += [f"{by_dest[key]}={value}" for key, value in config.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cluster_up(args: argparse.Namespace) -> int:
    # Lazily: it pulls in process management, and needs the services.
    try:
        from oncelog.testing import LocalCluster, PortTakenError, free_port
    except ModuleNotFoundError as exc:
        raise CliError(f"cluster up runs the oncelog services, which are not installed "
                       f"here ({exc})") from exc

    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError(f"--port must be within 1..65535, got {args.port}")
    data_dir = Path(args.data_dir).resolve()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {data_dir}: {exc.strerror}") from exc
    with _data_dir_lock(data_dir), stop_on_signals() as stop:
        # LocalCluster keeps a data dir's ports itself; `cluster up` makes the
        # gRPC and metrics ones fixed, so that a port another process took
        # since is an error naming it rather than a silent move.
        try:
            kept = load_kept_ports(data_dir)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        etcd_members = _etcd_members(args, kept.etcd_members, started=bool(kept.ports))
        stores = args.partition_stores or (3 if etcd_members else 1)
        if stores < 1:
            raise UsageError(f"--stores must be at least 1, got {stores}")
        counts = {"partition_store": stores,
                  "coordinator": 0 if args.coordinators_in_stores else args.coordinators,
                  "group_coordinator": 0 if args.coordinators_in_stores
                  else args.group_coordinators}
        security: bool = kept.security if args.secure is None else args.secure
        ports: ServicePorts = {
            (kind, node_id): (k.grpc_port, k.metrics_port)
            for (kind, node_id), k in kept.ports.items() if node_id < counts.get(kind, 0)}
        kafka: bool = kept.kafka if args.kafka is None else args.kafka
        if args.port is not None:
            # --port wins; another service that had that port gets new ones.
            others = {service: pair for service, pair in ports.items()
                      if service != _BOOTSTRAP_SERVICE and args.port not in pair}
            used = {port for pair in others.values() for port in pair} | {args.port}
            metrics_port = ports.get(_BOOTSTRAP_SERVICE, (0, 0))[1]
            while metrics_port == 0 or metrics_port in used:
                metrics_port = free_port()
            ports = {**others, _BOOTSTRAP_SERVICE: (args.port, metrics_port)}
        # Checked before anything starts, to say which port in one line (a
        # process that takes one meanwhile is caught by start() below).
        for (kind, node_id), pair in sorted(ports.items()):
            for port, purpose in zip(pair, ("gRPC", "metrics"), strict=True):
                if not _port_free(port):
                    raise _port_taken(port, kind, node_id, purpose, data_dir=data_dir,
                                      from_option=args.port == port
                                      and (kind, node_id) == _BOOTSTRAP_SERVICE)
        try:
            cluster = LocalCluster(
                data_dir, partition_stores=stores,
                coordinators=args.coordinators, group_coordinators=args.group_coordinators,
                ports=ports, kafka_listener=kafka, etcd_members=etcd_members,
                security=security, coordinators_in_stores=args.coordinators_in_stores,
            )
        except PortTakenError as exc:
            raise _port_taken(exc.taken.port, exc.kind, exc.node_id, exc.taken.purpose,
                              data_dir=data_dir, from_option=args.port == exc.taken.port) from exc
        except (RuntimeError, TimeoutError) as exc:
            raise CliError(f"the cluster did not start: {exc}") from exc
        try:
            # Kafka clients take every store's listener as bootstrap.servers.
            beside = f"; kafka bootstrap {cluster.kafka_bootstrap}" if kafka else ""
            print(f"oncelog cluster up; bootstrap {cluster.bootstrap}{beside}", flush=True)
            print(f"export {BOOTSTRAP_ENV}={cluster.bootstrap}", flush=True)
            if security:
                # The CLI and the SDK read the same files (a Kafka client's
                # properties: docs/cli.md, "Secured clusters").
                properties = _write_admin_properties(data_dir, cluster.client_config("admin"))
                print(f"export {COMMAND_CONFIG_ENV}={properties}", flush=True)
            for kind in sorted(cluster.missing_kinds):
                print(f"note: this version has no {kind} service; left out", flush=True)
            print("Ctrl-C stops it.", flush=True)
            # A signal interrupts the sleep (oncelog.signals.stop_on_signals says why not wait()).
            while not stop.is_set():
                time.sleep(STOP_POLL_INTERVAL_S)
        finally:
            print("stopping...", file=sys.stderr, flush=True)
            cluster.stop()
    return 0

