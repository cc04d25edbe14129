"""A whole oncelog cluster on this machine, each service its own OS process.

    with LocalCluster(data_dir) as cluster:
        producer = Producer(bootstrap=cluster.bootstrap)
        cluster.kill("partition_store", 0)      # SIGKILL
        cluster.restart("partition_store", 0)   # same data dir, same address

`LocalCluster()` without a data dir keeps everything in a temporary
directory that stop() (the end of the `with` block) deletes.

With `etcd_members=1` (or 3) the cluster also runs etcd, the metadata store
(oncelog_local.etcd.EtcdCluster, under the cluster's data dir), started before the
services and stopped after them; kind "etcd" with a member index works with
kill, terminate, restart, pause, resume, alive and wipe, and every service
gets the endpoints in ONCELOG_ETCD_ENDPOINTS.

Used by the tests, the demo, and `oncelog cluster up`. Addresses are chosen
once (free loopback ports) and kept across restarts, as a Kubernetes
StatefulSet keeps its DNS names; a port that another process takes between
the pick and the first start gets a fresh pick (`start`), so addresses are
final once `start` returns. A data dir given by the caller also keeps them
across runs: they are written to `<data_dir>/cluster-ports.json`
(oncelog_local.layout) and taken again by the next LocalCluster of that data
dir (a kept port another process holds by then is picked anew). `ports`
fixes the ports of chosen services instead (`oncelog cluster up` fixes the
kept ones): a fixed port that another process holds is not replaced; start() raises
PortTakenError naming it. Children die with the process that started them
(PR_SET_PDEATHSIG), so a crashed test run leaves nothing behind.

With `security=True` the cluster is secured as docs/security.md describes:
it makes a certificate authority and certificates (with `cryptography`, in
`<data_dir>/security/`: `ca.pem` and `ca.key`; `services/<kind>-<i>.pem`
and `.key`, subject `CN=oncelog-service` with the names 127.0.0.1 and
localhost, each service's server and client certificate; `clients/<name>.pem`
and `.key`; `issuer.key`, `issuer.pub.pem` and `oauth-issuers.json`, the
bearer-token issuer `oncelog-local`), kept for the next run of the data dir,
and starts every service serving TLS with client certificates verified
(`--tls-client-auth requested`), principals `User:<CN>`
(`--ssl-principal-mapping-rules 'RULE:^CN=([^,]+)$/$1/,DEFAULT'`), the
authorizer on (`--authorizer acl`, `--super-users
'User:admin;User:oncelog-service'`, ACLs read every 200 ms), the TLS files
checked for changes every second, and tokens of that issuer trusted.
Every service also has a token listener (`--token-listen`, a second port
serving TLS without asking for a client certificate) for clients that hold
only a bearer token: `token_bootstrap` is the first store's.
`client_config(name)` gives the SDK's keyword arguments that connect as
`User:<name>` with a certificate (`"admin"` is a super user),
`token_config(name)` those that connect with a bearer token alone (to
`token_bootstrap`), `token(name)` a bearer token for `User:<name>`,
`ca_file` the CA. The cluster's own health checks and
Metadata polls connect as `User:admin`. `extra_args` come after these flags
(and win); etcd's traffic stays plain text.

With `network="namespaces"` every process runs in a network namespace of its
own, on an address of a private subnet that exists only inside the
cluster's namespaces (oncelog_local.netns, docs/testing.md "Network
partitions"), and `isolate`, `cut` and `heal` drop packets between them.
Clients run in `client_namespace`: `client_call(fn, ...)` runs a Python
callable there, `client_popen(argv)` a command. Needs root and `ip`.

With `coordinators_in_stores=True` there is no coordinator process of
either kind: every partition store also runs a transaction coordinator
(`--transaction-coordinator`, docs/coordinator.md "The coordinator in a
store"), the one whose `__transaction_state` partitions it prefers to lead
(oncelog.wire.placement.store_of_coordinator), and a group coordinator
(`--group-coordinator`), the one whose `__consumer_offsets` partitions it
prefers to lead (store_of_group_coordinator); `coordinators` and
`group_coordinators` are not used. Killing that store kills its
coordinators with it. Their flags then go in `extra_args["partition_store"]`;
`extra_args` for either coordinator kind is refused (ValueError), as there is
no such process to give them to. `coordinators_in_stores=("coordinator",)`
(or `("group_coordinator",)`) places that kind alone in the stores and runs
the other as processes of their own, as Helm's `coordinator.inStores` and
`groupCoordinator.inStores` may be set apart.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from oncelog import errors
from oncelog.admin import Admin
from oncelog.wire.placement import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    owner_of_state_partition,
    state_partition,
    store_of_coordinator,
    store_of_group_coordinator,
)
from oncelog.wire.process import (
    GRPC,
    KAFKA,
    METRICS,
    TOKEN_GRPC,
    PortInUse,
)
from oncelog.wire.vocabulary import ServiceKind
from oncelog_local.argv import HOSTED_FLAGS, SERVER_PACKAGE, CommandLines
from oncelog_local.layout import KeptLayout, KeptPorts, load_kept_ports, save_kept_ports
from oncelog_local.partitions import PartitionPlacement, read_placements
from oncelog_local.pki import (
    SECURITY_DIR,
    ClientSecurityConfig,
    LocalPki,
    TokenSecurityConfig,
)
from oncelog_local.ports import PortBook
from oncelog_local.processes import (
    PortTakenError,
    ServiceProcess,
    Spawner,
    kill_process,
    log_tail,
    signal_process,
    terminate_process,
)
from oncelog_local.readiness import wait_all_ready

if TYPE_CHECKING:
    from oncelog_local.etcd import EtcdCluster
    from oncelog_local.netns import NamespaceNetwork

KINDS = tuple(kind.value for kind in ServiceKind)
# The coordinator kinds a partition store can run (coordinators_in_stores).
HOSTED_KINDS = tuple(kind for kind, _flag in HOSTED_FLAGS)
# The kind name of etcd members in kill/restart/... (not a service: not in KINDS).
ETCD = "etcd"
# The comma-separated etcd endpoints every service gets in its environment
# when the cluster runs etcd: the environment form of --etcd-endpoints (every
# flag has one), so a service with that flag uses etcd; the others ignore it.
ETCD_ENDPOINTS_ENV = "ONCELOG_ETCD_ENDPOINTS"
# How long a started process may take to answer its health check.
READY_TIMEOUT_S = 60.0
# How long a graceful stop (SIGTERM: drain, snapshot) may take before SIGKILL.
STOP_TIMEOUT_S = 15.0
# How many times one start() picks a fresh port after a process found the
# port it was given taken by another process; then start() fails.
START_PORT_RETRIES = 5
# The harness's own channels (readiness probes, Metadata, admin calls). A
# probe sent before a process listens fails, and gRPC then waits out its
# reconnect backoff (1 s at first, growing by 1.6 up to two minutes) before
# it tries again: a process that came up meanwhile would be seen that much
# later, at every start of every cluster.
PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
]
# network="namespaces": every process has an address of its own, so all
# take the same ports (nothing else listens in their namespaces).
NETWORKS = ("namespaces",)
NAMESPACED_PORTS = {GRPC: 7000, METRICS: 7001, TOKEN_GRPC: 7002, KAFKA: 9092}
# The kind name of the clients' namespace in cut() (not a service).
CLIENT = "client"


# Coordinator states of a transaction that is decided and whose markers are
# still being written: until they land, its records are not readable
# (read_committed) although commit_transaction() has returned.
MARKERS_IN_FLIGHT = ("PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def wait_for_markers(bootstrap: str, deadline_s: float = 60.0, **config: Any) -> None:
    """Waits until no transaction is decided with its markers on their way.

    commit_transaction() returns when the commit is decided and its markers
    follow (as in Kafka), so a read_committed reader that takes the last
    stable offset right after it can stop short of the transaction's
    records. A transaction still open (Ongoing, or Prepared under two-phase
    commit) is not waited for: it stays invisible, as it should. A cluster
    without a transaction coordinator has nothing to wait for. `config`
    goes to the Admin (security settings). Raises TimeoutError when
    markers are still on their way after deadline_s."""
    stop_at = time.monotonic() + deadline_s
    with Admin(bootstrap=bootstrap, **config) as admin:
        while True:
            try:
                pending = admin.list_transactions(states=MARKERS_IN_FLIGHT)
            except errors.OncelogError:
                return
            if not pending:
                return
            if time.monotonic() > stop_at:
                raise TimeoutError(f"markers still on their way after {deadline_s} s: "
                                     f"{[(t.transactional_id, t.state) for t in pending]}")
            time.sleep(0.05)


def _service_available(kind: str) -> bool:
    """Whether `python -m oncelog_server.<kind>` can run, found on disk: a
    spec of the top-level name imports nothing, while one of a submodule
    would import its parents into this process, where the tests of this
    repository have the same modules loaded as `services.*`."""
    spec = importlib.util.find_spec(SERVER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(location) / kind / "__main__.py").is_file()
               for location in spec.submodule_search_locations)


def _hosted_kinds(coordinators_in_stores: bool | Iterable[str]) -> frozenset[str]:
    """The coordinator kinds the stores run (LocalCluster's
    `coordinators_in_stores`): True both, False none, or the kinds named."""
    if isinstance(coordinators_in_stores, bool):
        return frozenset(HOSTED_KINDS) if coordinators_in_stores else frozenset()
    if isinstance(coordinators_in_stores, str):
        raise TypeError(f"coordinators_in_stores={coordinators_in_stores!r}: give True, False "
                        f"or a collection of kinds, such as ({coordinators_in_stores!r},)")
    kinds = frozenset(coordinators_in_stores)
    unknown = sorted(kinds - set(HOSTED_KINDS))
    if unknown:
        raise ValueError(f"coordinators_in_stores names {', '.join(map(repr, unknown))}; "
                         f"the kinds a store can run are {' and '.join(map(repr, HOSTED_KINDS))}")
    return kinds


def _check_no_coordinator_args(extra_args: Mapping[str, Sequence[str]],
                               hosted: frozenset[str]) -> None:
    """With coordinators in the stores: flags for coordinator processes,
    which are not started, would be dropped silently and leave the
    coordinators unconfigured."""
    named = sorted(kind for kind in hosted if extra_args.get(kind))
    if named:
        raise ValueError(
            f"extra_args names {' and '.join(map(repr, named))}, whose processes "
            "coordinators_in_stores does not start: each store runs those "
            "coordinators, so their flags go in extra_args['partition_store']")


class LocalCluster:
    """Partition stores, transaction coordinators and group coordinators as
    separate processes on 127.0.0.1, and optionally etcd (etcd_members).

    Their data and logs live under `data_dir`, kept for the next run; without
    one, under a temporary directory that stop() deletes (such a cluster
    cannot be started again after stop()). `security=True`: TLS, principals
    and ACLs (the module docstring)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        partition_stores: int = 1,
        coordinators: int = 1,
        group_coordinators: int = 1,
        *,
        extra_args: dict[str, list[str]] | None = None,
        env: dict[str, str] | None = None,
        transaction_state_partitions: int = 4,
        consumer_offsets_partitions: int = 4,
        etcd_members: int = 0,
        start: bool = True,
        ports: Mapping[tuple[str, int], tuple[int, int]] | None = None,
        security: bool = False,
        kafka_listener: bool = False,
        network: str | None = None,
        coordinators_in_stores: bool | Iterable[str] = False,
    ) -> None:
        hosted = _hosted_kinds(coordinators_in_stores)
        _check_no_coordinator_args(extra_args or {}, hosted)
        if "coordinator" in hosted:
            coordinators = 0
        if "group_coordinator" in hosted:
            group_coordinators = 0
        # The store that runs each coordinator, by kind (empty: they run as
        # processes of their own).
        self._hosts: dict[str, list[int]] = {
            kind: [place(c, partition_stores) for c in range(partition_stores)]
            if kind in hosted else []
            for kind, place in (("coordinator", store_of_coordinator),
                                ("group_coordinator", store_of_group_coordinator))}
        # The partitions of each coordinator kind's state topic.
        self._state_partitions = {"coordinator": transaction_state_partitions,
                                  "group_coordinator": consumer_offsets_partitions}
        if partition_stores < 1:
            raise ValueError("a cluster needs at least one partition store")
        if etcd_members not in (0, 1, 3):
            raise ValueError(f"etcd_members={etcd_members}; expected 0 (no etcd), 1 or 3")
        if network is not None and network not in NETWORKS:
            raise ValueError(f"network={network!r}; expected None (loopback) or "
                             f"{' or '.join(map(repr, NETWORKS))}")
        if network is not None and (security or ports):
            # The certificates name 127.0.0.1; each namespace has its ports.
            raise ValueError("network='namespaces' does not combine with security=True "
                             "or fixed ports")
        # Deleted by stop(): the cluster's data outlives nothing.
        self._temporary_dir: Path | None = None
        if data_dir is None:
            data_dir = self._temporary_dir = Path(tempfile.mkdtemp(prefix="oncelog-cluster-"))
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        self._env = {**os.environ, **(env or {})}
        self.security = security
        self.kafka_listener = kafka_listener
        self._pki = LocalPki(self.data_dir / SECURITY_DIR) if security else None
        self._command_lines = CommandLines(
            hosts=self._hosts, transaction_state_partitions=transaction_state_partitions,
            consumer_offsets_partitions=consumer_offsets_partitions, pki=self._pki,
            kafka_listener=kafka_listener, extra_args=extra_args or {})
        self._addresses_final = False
        counts = {
            "partition_store": partition_stores,
            "coordinator": coordinators,
            "group_coordinator": group_coordinators,
        }
        # A data dir's earlier run left its ports: taken again, as picks (a
        # port another process holds now gets a fresh pick at start). A
        # temporary dir and namespaces (fixed ports per namespace) keep none.
        keeps_ports = self._temporary_dir is None and network is None
        self._port_book = PortBook(ports or {}, counts,
                                   load_kept_ports(self.data_dir).ports if keeps_ports else {})
        self.network: NamespaceNetwork | None = None
        if network is not None:
            from oncelog_local.netns import NamespaceNetwork

            self.network = NamespaceNetwork()
        self.etcd: EtcdCluster | None = None
        if etcd_members:
            from oncelog_local.etcd import EtcdCluster

            net = self.network
            self.etcd = EtcdCluster(
                self.data_dir, etcd_members, log_dir=self.data_dir / "logs",
                pick_port=self._port_book.pick,
                hosts=None if net is None else [net.add(ETCD, i) for i in range(etcd_members)],
                child_args=None if net is None else lambda i: net.child_args(ETCD, i),
                reach=None if net is None else net.reach)
            # Ports kept from an earlier run of this data dir are not picked
            # by the port book: no service may get them.
            self._port_book.reserve(self.etcd.ports)
        # Services that this version does not ship yet are left out of the
        # layout (clients then see "no group coordinator" errors, not hangs).
        self.missing_kinds = {
            kind for kind in KINDS if counts[kind] and not _service_available(kind)
        }
        if "partition_store" in self.missing_kinds:
            raise ModuleNotFoundError(
                f"LocalCluster found no {SERVER_PACKAGE}.partition_store to run: the services "
                f"are installed with the server extra (pip install 'oncelog[server]')",
                name=SERVER_PACKAGE)
        self.processes: dict[str, list[ServiceProcess]] = {}
        for kind in KINDS:
            count = 0 if kind in self.missing_kinds else counts[kind]
            self.processes[kind] = [self._new_process(kind, i) for i in range(count)]
        self._command_lines.assign(self.processes)
        if start:
            try:
                self.start()
            except BaseException:
                # No stop() follows a constructor that raised.
                if self.network is not None:
                    self.network.close()
                raise

    def _new_process(self, kind: str, node_id: int) -> ServiceProcess:
        """A service's address and ports: the port book's on loopback
        (ports.py), or its own address in a network namespace."""
        token = self.security
        kafka = self.kafka_listener and kind == "partition_store"
        if self.network is not None:
            host = self.network.add(kind, node_id)
            ports = KeptPorts(NAMESPACED_PORTS[GRPC], NAMESPACED_PORTS[METRICS],
                              NAMESPACED_PORTS[TOKEN_GRPC] if token else 0,
                              NAMESPACED_PORTS[KAFKA] if kafka else 0)
        else:
            host = "127.0.0.1"
            ports = self._port_book.service_ports(kind, node_id, token=token, kafka=kafka)
        return ServiceProcess(
            kind=kind, node_id=node_id, address=f"{host}:{ports.grpc_port}",
            metrics_port=ports.metrics_port, data_dir=self.data_dir / f"{kind}-{node_id}",
            log_path=self.data_dir / "logs" / f"{kind}-{node_id}.log", argv=[],
            token_port=ports.token_port, kafka_port=ports.kafka_port, host=host,
        )

    # -------------------------------------------------------------- security

    def _secured(self) -> LocalPki:
        if self._pki is None:
            raise ValueError("this cluster runs without security; start it with "
                             "LocalCluster(..., security=True)")
        return self._pki

    @property
    def ca_file(self) -> str:
        """The CA certificate (PEM) that signs every certificate of a secured cluster."""
        return str(self._secured().ca_file)

    def client_config(self, name: str) -> ClientSecurityConfig:
        """The SDK's keyword arguments that connect to this secured cluster
        as `User:<name>` over TLS with a client certificate (made on first
        use): `Producer(bootstrap=cluster.bootstrap, **cluster.client_config("alice"))`.
        `"admin"` is a super user; anyone else may do what the ACLs allow."""
        return self._secured().client_config(name)

    def token(self, name: str, ttl_s: float = 300) -> str:
        """A bearer token (JWT, ES256) for `User:<name>` from the cluster's
        issuer, expiring `ttl_s` from now (a negative ttl_s: already expired)."""
        return self._secured().token(name, ttl_s)

    def token_config(self, name: str, ttl_s: float = 300) -> TokenSecurityConfig:
        """The SDK's keyword arguments that connect as `User:<name>` with a
        bearer token and no client certificate, for the token listeners:
        `Producer(bootstrap=cluster.token_bootstrap, **cluster.token_config("bob"))`.
        The provider makes a fresh token (valid `ttl_s`) whenever the client
        asks for one."""
        return self._secured().token_config(name, ttl_s)

    def _channel(self, address: str) -> grpc.Channel:
        """A channel to one of the cluster's services, as `User:admin` over
        TLS when the cluster is secured; with network="namespaces" through the
        harness namespace, which no cut touches."""
        if self.network is not None:
            return grpc.insecure_channel(self.network.reach(address), options=PROBE_OPTIONS)
        if self._pki is None:
            return grpc.insecure_channel(address, options=PROBE_OPTIONS)
        return grpc.secure_channel(address, self._pki.admin_credentials(),
                                   options=PROBE_OPTIONS)

    # ------------------------------------------------------------------ info

    @property
    def bootstrap(self) -> str:
        """The first partition store's address (one address: also usable as
        a gRPC target)."""
        return self.processes["partition_store"][0].address

    @property
    def token_bootstrap(self) -> str:
        """The first partition store's token listener (a secured cluster's
        address for clients that hold only a bearer token)."""
        self._secured()
        return self.processes["partition_store"][0].token_address

    @property
    def kafka_bootstrap(self) -> str:
        """Every store's Kafka listener, comma-separated: what a Kafka
        client takes as `bootstrap.servers` (LocalCluster(kafka_listener=True))."""
        if not self.kafka_listener:
            raise ValueError("this cluster runs no Kafka listener; start it with "
                             "LocalCluster(..., kafka_listener=True)")
        return ",".join(p.kafka_address for p in self.processes["partition_store"])

    @property
    def bootstrap_servers(self) -> str:
        """Every partition store's address, comma-separated: what a client of
        a replicated cluster should be given, so it can start while any one
        store is down."""
        return ",".join(p.address for p in self.processes["partition_store"])

    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        """etcd's client addresses ("host:port"); empty without etcd."""
        return () if self.etcd is None else self.etcd.endpoints

    def address(self, kind: str, index: int = 0) -> str:
        if kind == ETCD:
            return self._etcd_cluster(index).endpoints[index]
        return self._proc(kind, index).address

    def store_running(self, kind: str, key: str) -> int:
        """The partition store whose process runs the coordinator of `key`:
        a transactional id for kind "coordinator", a group id for
        "group_coordinator", when that kind runs in the stores
        (coordinators_in_stores). It is the store to kill to take that
        coordinator down. With etcd, that is the store that leads the key's
        state partition now: a coordinator in every store owns what its store
        leads, and moves with leadership (docs/coordinator.md); ValueError
        while no store leads it."""
        hosts = self._hosts.get(kind)
        if hosts is None:
            raise ValueError(f"unknown coordinator kind {kind!r}; expected one of {HOSTED_KINDS}")
        if not hosts:
            raise ValueError(f"the {kind.replace('_', ' ')}s run as processes of their own "
                             f"(coordinators_in_stores does not name {kind!r})")
        partition = state_partition(key, self._state_partitions[kind])
        if self.etcd is None:
            return hosts[owner_of_state_partition(partition, len(hosts))]
        topic = TRANSACTION_STATE_TOPIC if kind == "coordinator" else CONSUMER_OFFSETS_TOPIC
        placement = self.partition_states([topic]).get((topic, partition))
        if placement is None or placement.leader < 0:
            raise ValueError(f"{topic}-{partition}, which holds {key!r}, has no leader now")
        return placement.leader

    def metrics_url(self, kind: str, index: int = 0) -> str:
        proc = self._proc(kind, index)
        address = f"{proc.host}:{proc.metrics_port}"
        if self.network is not None:
            address = self.network.reach(address)
        return f"http://{address}/metrics"

    def _etcd_cluster(self, index: int) -> EtcdCluster:
        """The cluster's etcd, with member `index` checked to exist."""
        if self.etcd is None:
            raise ValueError("this cluster runs no etcd (etcd_members=0)")
        if not 0 <= index < len(self.etcd.members):
            raise ValueError(f"etcd member {index} does not exist; the cluster has "
                             f"{len(self.etcd.members)}")
        return self.etcd

    def _proc(self, kind: str, index: int) -> ServiceProcess:
        if kind not in self.processes:
            raise ValueError(f"unknown service kind {kind!r}; expected one of "
                             f"{(*KINDS, ETCD)}")
        procs = self.processes[kind]
        hosts = self._hosts.get(kind)
        if hosts:
            where = (f"partition store {hosts[index]}" if 0 <= index < len(hosts)
                     else "a partition store")
            raise ValueError(f"{kind.replace('_', ' ')} {index} is no process of its own: it "
                             f"runs in {where} (coordinators_in_stores)")
        if not 0 <= index < len(procs):
            raise ValueError(f"{kind} {index} does not exist; the cluster has {len(procs)}")
        return procs[index]

    # ------------------------------------------------------------- lifecycle

    def _all(self) -> list[ServiceProcess]:
        return [proc for procs in self.processes.values() for proc in procs]

    def start(self) -> None:
        """Starts every process and waits until each serves. If one exits
        because another process took its port since free_port picked it, the
        port is picked again and the process started again, up to
        START_PORT_RETRIES times; any other failure (or one more taken port)
        stops every process of the cluster and raises, with the log's tail.

        Why retry rather than reserve the ports: a port cannot be held for a
        child until it binds, because the services bind by number (gRPC's
        Python server cannot adopt a socket the parent opened) and refuse
        SO_REUSEPORT on purpose, so that two stores never share a port.
        A taken metrics port concerns its process alone: only that one starts
        again. A taken gRPC port changes the layout that every process got on
        its command line, so every process started with the old layout is
        killed and the whole cluster starts again with the new one; that is
        rare and costs a second, and no process can ever talk to a stale
        address. Nothing was served yet, and the stores recover from a kill
        by design, so a restart loses nothing. Once a start has succeeded
        the addresses are final (clients know them), and a later start()
        fails on a taken port as restart() does.
        """
        if self._temporary_dir is not None and not self._temporary_dir.exists():
            raise RuntimeError(f"this cluster kept its data in the temporary directory "
                               f"{self._temporary_dir}, which stop() deleted; give LocalCluster "
                               f"a data_dir to start a cluster again after stop()")
        running = [f"{proc.kind} {proc.node_id}" for proc in self._all() if proc.alive()]
        if self.etcd is not None:
            running += [f"etcd {m.index}" for m in self.etcd.members if m.alive()]
        if running:
            raise RuntimeError(f"{', '.join(running)} already running; start() starts a "
                               f"stopped cluster (restart() starts one process again)")
        try:
            # etcd first: the services find their metadata there.
            if self.etcd is not None:
                self.etcd.start()
            for proc in self._all():
                self._spawn(proc)
            for retry in range(START_PORT_RETRIES + 1):
                try:
                    wait_all_ready(self._all(), READY_TIMEOUT_S, self._channel)
                    self._addresses_final = True
                    self._save_layout()
                    return
                except PortTakenError as exc:
                    # A fixed port is the caller's choice: not replaced.
                    if self._addresses_final or self._port_book.is_fixed(exc.kind, exc.node_id):
                        raise
                    if retry == START_PORT_RETRIES:
                        raise RuntimeError(
                            f"{exc}\n(gave up after {START_PORT_RETRIES} fresh ports)"
                        ) from exc
                    self._move(self._proc(exc.kind, exc.node_id), exc.taken)
        except BaseException:
            for proc in self._all():
                self.kill(proc.kind, proc.node_id)
            if self.etcd is not None:
                for member in self.etcd.members:
                    self.etcd.kill(member.index)
            raise

    def add_partition_store(self, *, wait: bool = True) -> int:
        """Starts one more partition store in a running replicated cluster
        (etcd_members > 0) and returns its node id. The running processes
        learn about it from etcd; their command lines name it from their next
        restart on. It holds partitions of topics created from now on, and
        any moved to it (Admin.alter_partition_reassignments)."""
        if self.etcd is None:
            raise ValueError("adding a store needs a replicated cluster (etcd_members > 0): "
                             "without etcd the layout is fixed for the cluster's life")
        procs = self.processes["partition_store"]
        proc = self._new_process("partition_store", len(procs))
        node_id = proc.node_id
        procs.append(proc)
        self._command_lines.assign(self.processes)
        self._spawn(proc)
        self._save_layout()
        if wait:
            self.wait_ready("partition_store", node_id)
        return node_id

    def _save_layout(self) -> None:
        """Writes the services' ports into the data dir for its next run
        (PORTS_FILE); a temporary data dir has no next run."""
        if self._temporary_dir is None and self.network is None:
            save_kept_ports(self.data_dir, KeptLayout({
                (p.kind, p.node_id): KeptPorts(int(p.address.rsplit(":", 1)[1]), p.metrics_port,
                                               p.token_port, p.kafka_port)
                for p in self._all()}, kafka=self.kafka_listener,
                etcd_members=0 if self.etcd is None else len(self.etcd.members),
                security=self.security))

    def _move(self, proc: ServiceProcess, taken: PortInUse) -> None:
        """Gives `proc` a fresh port for the one that was taken and starts
        what must start again (see start)."""
        if taken.purpose == METRICS:
            proc.metrics_port = self._port_book.pick()
            self._command_lines.assign(self.processes)
            self._spawn(proc)
            return
        # An address in the layout: every process is told the new one.
        if taken.purpose == TOKEN_GRPC:
            proc.token_port = self._port_book.pick()
        elif taken.purpose == KAFKA:
            proc.kafka_port = self._port_book.pick()
        else:
            proc.address = f"127.0.0.1:{self._port_book.pick()}"
        self._command_lines.assign(self.processes)
        for other in self._all():
            self.kill(other.kind, other.node_id)
        for other in self._all():
            self._spawn(other)

    def _spawn(self, proc: ServiceProcess, env: dict[str, str] | None = None) -> None:
        if proc.alive():
            raise RuntimeError(f"{proc.kind} {proc.node_id} is already running")
        proc.data_dir.mkdir(parents=True, exist_ok=True)
        proc.log_offset = proc.log_path.stat().st_size if proc.log_path.exists() else 0
        netns = [] if self.network is None else self.network.child_args(proc.kind, proc.node_id)
        argv = [sys.executable, "-m", "oncelog_local.child", str(os.getpid()), *netns, *proc.argv]

        etcd_env = {} if self.etcd is None else {ETCD_ENDPOINTS_ENV: ",".join(self.etcd.endpoints)}

        def start() -> subprocess.Popen[bytes]:
            with open(proc.log_path, "ab") as log_file:
                return subprocess.Popen(
                    argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**self._env, **etcd_env, **(env or {})},
                )

        proc.process = Spawner.get().spawn(start)

    def wait_ready(self, kind: str, index: int = 0, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Blocks until the process answers its gRPC health check with SERVING,
        under its own pid's service name (another process that holds the port
        does not know that name); an etcd member: until it is healthy (has a
        leader).
        Raises PortTakenError if it exited because another process holds its
        port (a restarted process keeps its address, so it is not moved),
        RuntimeError if it exited for another reason, TimeoutError after
        timeout_s."""
        if kind == ETCD:
            self._etcd_cluster(index).wait_ready(timeout_s, members=[index])
            return
        wait_all_ready([self._proc(kind, index)], timeout_s, self._channel)

    def log_tail(self, kind: str, index: int = 0, lines: int = 30) -> str:
        if kind == ETCD:
            return self._etcd_cluster(index).log_tail(index, lines)
        return log_tail(self._proc(kind, index).log_path, lines)

    def kill(self, kind: str, index: int = 0) -> None:
        """SIGKILL: no drain, no snapshot — a crash."""
        if kind == ETCD:
            self._etcd_cluster(index).kill(index)
            return
        kill_process(self._proc(kind, index).process)

    def terminate(self, kind: str, index: int = 0, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait: a graceful shutdown. Returns the exit code."""
        if kind == ETCD:
            return self._etcd_cluster(index).terminate(index, timeout_s)
        return terminate_process(self._proc(kind, index).process, timeout_s)

    def restart(self, kind: str, index: int = 0, *, wait: bool = True,
                env: dict[str, str] | None = None) -> None:
        """Starts the process again (after kill or terminate; kills it first if
        still running) with the same data directory and address. `env` adds to
        or overrides the cluster's environment for this start only. If another
        process took its port meanwhile, waiting raises PortTakenError naming
        the port: every other process knows the address, so it stays.
        An etcd member rejoins its cluster; waiting for it needs a majority
        of the members running (`env` does not apply to etcd)."""
        if kind == ETCD:
            if env:
                raise ValueError("env applies to oncelog services, not to etcd members")
            self._etcd_cluster(index).restart(index, wait=wait)
            return
        proc = self._proc(kind, index)
        if proc.alive():
            self.kill(kind, index)
        self._spawn(proc, env)
        if wait:
            self.wait_ready(kind, index)

    def wait_exit(self, kind: str, index: int = 0, timeout_s: float = 60.0) -> int:
        """Waits for a process to exit on its own (a crash point, say); returns
        its exit code (negative: the signal that ended it)."""
        proc = self._proc(kind, index)
        if proc.process is None:
            raise RuntimeError(f"{kind} {index} was never started")
        return int(proc.process.wait(timeout_s))

    def pause(self, kind: str, index: int = 0) -> None:
        """SIGSTOP: the process stops answering but keeps its sockets (a GC pause,
        a partitioned zombie)."""
        if kind == ETCD:
            self._etcd_cluster(index).pause(index)
            return
        signal_process(self._proc(kind, index).process, signal.SIGSTOP)

    def resume(self, kind: str, index: int = 0) -> None:
        if kind == ETCD:
            self._etcd_cluster(index).resume(index)
            return
        signal_process(self._proc(kind, index).process, signal.SIGCONT)

    def alive(self, kind: str, index: int = 0) -> bool:
        """Whether the process (or etcd member) is running (paused counts)."""
        if kind == ETCD:
            return self._etcd_cluster(index).alive(index)
        return self._proc(kind, index).alive()

    def partition_states(
        self, topics: Sequence[str] = (), *, stores: Sequence[int] | None = None,
        timeout_s: float = 1.0,
    ) -> dict[tuple[str, int], PartitionPlacement]:
        """Leader, leader epoch, replicas and ISR of every partition of
        `topics` (empty: every topic, internal ones included), from the first
        running store of `stores` (default: all) that answers Metadata within
        `timeout_s` - a paused store does not, and is skipped. Each store reads
        the metadata every 100 ms, so the answer is at most that old. {} when
        no store answers or a topic is unknown."""
        indexes = range(len(self.processes["partition_store"])) if stores is None else stores
        # A generator: each store is checked to run when its turn comes.
        running = (self.address("partition_store", index) for index in indexes
                   if self.alive("partition_store", index))
        return read_placements(running, self._channel, topics, timeout_s)

    def wait_in_sync(self, topics: Sequence[str] = (), *, preferred: bool = False,
                     timeout_s: float = 60.0) -> float:
        """Waits until every partition of `topics` (empty: all, internal ones
        included) is led with every replica in sync - and, with `preferred`,
        led by its preferred replica; returns the seconds it took. Raises
        TimeoutError naming the partitions still out of sync."""
        started = time.monotonic()
        while True:
            states = self.partition_states(topics)
            behind = sorted(f"{t}-{p}" for (t, p), s in states.items()
                            if not s.in_sync or (preferred and not s.preferred))
            if states and not behind:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"not in sync after {timeout_s:.0f} s: "
                    f"{', '.join(behind[:10]) if states else 'no store answered Metadata'}")
            time.sleep(0.1)

    def wipe(self, kind: str, index: int = 0) -> None:
        """Deletes the data directory of a process that is down (after kill or
        terminate): its next start begins with nothing, as on a new disk.
        Raises RuntimeError while it runs. A wiped etcd member of three is
        removed from etcd's cluster and added again, and then joins empty
        (oncelog_local.etcd); a single member starts a new, empty etcd."""
        if kind == ETCD:
            self._etcd_cluster(index).wipe(index)
            return
        proc = self._proc(kind, index)
        if proc.alive():
            raise RuntimeError(f"{kind} {index} (pid {proc.pid}) is running; kill or "
                               f"terminate it before wiping {proc.data_dir}")
        shutil.rmtree(proc.data_dir, ignore_errors=True)

    # ------------------------------------------------------- network faults

    def _network(self) -> NamespaceNetwork:
        if self.network is None:
            raise ValueError("this cluster runs on loopback; network faults need "
                             "LocalCluster(..., network='namespaces')")
        return self.network

    def _member(self, member: tuple[str, int]) -> tuple[str, int]:
        """A (kind, index) of cut()'s lists, checked: a service, an etcd
        member or the clients ("client", 0)."""
        kind, index = member
        if kind == CLIENT:
            if index != 0:
                raise ValueError(f"the clients share one namespace: (\"{CLIENT}\", 0), "
                                 f"not index {index}")
        elif kind == ETCD:
            self._etcd_cluster(index)
        else:
            self._proc(kind, index)
        return kind, index

    def isolate(self, kind: str, index: int = 0) -> None:
        """Cuts one process off from every other process and from the
        clients, both ways (LocalCluster's own checks still reach it)."""
        self._network().isolate(*self._member((kind, index)))

    def cut(self, side_a: Sequence[tuple[str, int]], side_b: Sequence[tuple[str, int]],
            one_way: bool = False) -> None:
        """Drops the packets between two groups of processes, given as
        (kind, index): ("partition_store", 0), ("etcd", 2), ("client", 0).
        Two-way unless one_way, which drops A's packets to B and lets B's
        to A pass. Cuts add up until heal()."""
        self._network().cut([self._member(m) for m in side_a],
                            [self._member(m) for m in side_b], one_way=one_way)

    def heal(self) -> None:
        """Undoes every cut and isolation."""
        self._network().heal()

    @property
    def client_namespace(self) -> str:
        """The network namespace the clients run in (`ip netns exec` takes
        this name): it reaches every process until a cut says otherwise."""
        return self._network().namespace(CLIENT, 0)

    def client_popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Starts a command in the client namespace (it dies with this
        process); `env` adds to the cluster's environment."""
        prefix = [sys.executable, "-m", "oncelog_local.child", str(os.getpid()),
                  *self._network().child_args(CLIENT, 0)]
        full_env = {**self._env, **(env or {})}
        return Spawner.get().spawn(lambda: subprocess.Popen(
            [*prefix, *argv], env=full_env, **popen_kwargs))

    def client_call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = 600.0,
                    **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in a fresh Python in the client namespace, and
        its result: fn, its arguments and result are pickled (a module's
        top-level function). An exception in fn is raised here, with the
        child's traceback as a note. TimeoutError after timeout_s."""
        from oncelog_local.netns import run_callable

        def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
            return self.client_popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

        return run_callable(spawn, self.client_namespace, fn, args, kwargs,
                            timeout_s=timeout_s)

    def stop(self) -> None:
        """Graceful stop of every process (coordinators first, stores last, so
        coordinators can still write their final state; etcd after them all,
        so the services can still write their metadata)."""
        for kind in ("group_coordinator", "coordinator", "partition_store"):
            for proc in self.processes[kind]:
                self.terminate(kind, proc.node_id)
        if self.etcd is not None:
            self.etcd.stop()
        if self.network is not None:
            self.network.close()
        if self._temporary_dir is not None:
            shutil.rmtree(self._temporary_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
