"""Wiring of a partition store process: flags and environment, RocksDB,
recovery, the gRPC server (health, reflection), metrics, graceful shutdown.

    python -m oncelog_server.partition_store --node-id 0 --stores 127.0.0.1:7000,... \\
        --data-dir DIR [--fsync]

Store flags (each also ONCELOG_<NAME> in the environment; the flag wins):
  --data-dir                      where RocksDB lives (required)
  --fsync                         fsync the WAL once per group commit before
                                  acknowledging (survives power loss, not just kill -9)
  --snapshot-interval-batches     producer-state snapshot every N appended batches
  --snapshot-interval-ms          ... or every T ms with changes
  --retention-check-interval-ms   how often retention and producer expiry run
  --producer-id-expiration-ms     idle producers' dedup state is dropped after this
  --catalog-refresh-interval-ms   non-controller nodes re-read the catalog this often
  --compaction-interval-ms        how often compacted partitions are checked for a pass
  --compaction-max-keys-per-pass  keys one compaction pass may hold in memory
  --compaction-chunk-bytes        rewritten bytes per RocksDB write of a compaction pass
  --unsafe-skip-txn-verification  TEST ONLY: do not ask the transaction coordinator
                                  before a producer's first transactional write to a
                                  partition (makes hanging transactions possible)
  --resolve-hanging-transactions  end transactions that hold a partition open past their
                                  timeout plus --hanging-txn-margin-ms (default on)
  --hanging-txn-margin-ms         how long past its timeout a transaction may stay open
                                  before the store asks the coordinators about it
  --max-transaction-timeout-ms    the timeout assumed for a transaction whose timeout the
                                  store did not learn (>= the coordinators')
  --etcd-endpoints                replicate partitions, with the cluster's metadata in
                                  this etcd (host:port,...; docs/replication.md). Without
                                  it every partition is one copy on one store
  --metadata-root                 the etcd key prefix of this cluster (/oncelog)
  --lease-ttl-s                   this store's etcd lease: its partitions move to other
                                  replicas this long after it stops
  --replica-lag-time-max-ms       a follower this far behind leaves the ISR
  --unclean-leader-election       UNSAFE: let a replica outside the ISR lead when no
                                  in-sync one is alive (acknowledged records may be lost)
  --controlled-shutdown-timeout-ms on SIGTERM, how long the store waits for its
                                  leaderships to move to other in-sync replicas before
                                  it drains (0: no hand-over; they move at its lease end)
  --verify-checksums-on-start     read every stored key and check every batch's CRC32C
                                  before serving (damaged data: damage.py)
  --producer-byte-rate, --consumer-byte-rate, --client-quotas, --quota-window-num,
  --quota-window-size-ms          client quotas (quotas.py; Kafka's KIP-13)
  --transaction-coordinator       also run this transaction coordinator (a node id, or
                                  auto) in this process, with the coordinator's own flags
                                  (docs/coordinator.md, "The coordinator in a store")
  --group-coordinator             likewise a group coordinator, with its own flags

Health: besides "" and the service's name, a replicated store serves the
health status IN_SYNC_HEALTH_SERVICE, SERVING while it is in the ISR of
every partition it holds that has a leader (the Helm chart's readiness
probe asks for it, so a rolling restart waits for a restarted store to
catch up before it stops the next one).

The transaction coordinators (--coordinators) are asked to verify a
producer's first transactional write to each partition (verify_only), and
about transactions that hold a partition open past their timeout
(ResolveTransaction; docs/partition-store.md, "Hanging transactions").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from oncelog.v1 import partition_store_pb2_grpc
from oncelog.wire.process import KAFKA

from ..common.metadata.cluster import split_addresses
from ..common.metadata.etcd import EtcdMetadataStore
from ..common.metadata.store import MetadataStore, MetadataUnavailable
from ..common.rpc.local_calls import InProcess
from ..common.rpc.server_base import (
    add_common_arguments,
    configure_logging,
    env_default,
    env_flag,
    layout_from_args,
    listen_failure,
    run,
    serve,
    token_advertised,
)
from ..common.rpc.store_client import StoreClient
from ..common.security.service_security import ServiceSecurity
from .acls import AclService
from .api import ControllerLink
from .core.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from .core.replicas import (
    DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS,
    DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT,
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    in_sync_everywhere,
)
from .damage import open_store, record_and_stop
from .hosted_coordinators import add_hosting_arguments, coordinator_node, group_coordinator_node
from .quotas import StoreQuotas, add_quota_arguments, quota_config_from_args
from .replication.controlled_shutdown import (
    DEFAULT_CONTROLLED_SHUTDOWN_TIMEOUT_MS,
    ControlledShutdown,
)
from .replication.fetcher import START_METADATA_WAIT_MS, LeaderLink, ReplicaFetcherManager
from .replication.lease_heartbeat import DEFAULT_LOOP_STALL_LIMIT_TTLS, LeaseHeartbeat
from .replication.metadata_link import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_ROOT,
    KAFKA_LISTENER,
    TOKEN_LISTENER,
    MetadataLink,
    sole_in_sync_replica_of,
)
from .rpc.controller_link import GrpcControllerLink
from .rpc.coordinator_link import GrpcTxnResolver, GrpcTxnVerifier
from .rpc.replica_link import GrpcLeaderLink
from .rpc.servicer import SERVICE_NAME, PartitionStoreServicer
from .runtime import (
    DEFAULT_COMPACTION_CHUNK_BYTES,
    DEFAULT_COMPACTION_INTERVAL_MS,
    DEFAULT_COMPACTION_MAX_KEYS_PER_PASS,
    DEFAULT_HANGING_TXN_MARGIN_MS,
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    StoreConfig,
    StoreRuntime,
    wall_clock_ms,
)
from .storage.port import CorruptionError, KeyValueStore
from .transactions.resolver import TxnResolver
from .transactions.verifier import TxnVerifier
from .writer import storage_refusal

if TYPE_CHECKING:
    from ..kafka.listener import KafkaListener
    from .rpc.hosting import HostedCoordinators

log = logging.getLogger("oncelog.partition_store")

# One metadata-store call (etcd) may take this long before it counts as
# unreachable.
METADATA_TIMEOUT_MS = 2_000
# The health service name that is SERVING while the store is in the ISR of
# every partition it holds that has a leader (`Wired.in_sync`).
IN_SYNC_HEALTH_SERVICE = "oncelog.replication.InSync"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_server.partition_store", description="oncelog partition store",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_arguments(parser)
    add = parser.add_argument
    add("--data-dir", default=env_default("data-dir"),
        help="directory of this node's RocksDB (env ONCELOG_DATA_DIR)")
    add("--fsync", action="store_true", default=env_flag("fsync"),
        help="fsync the write-ahead log once per group commit before acknowledging")
    add("--snapshot-interval-batches", type=int,
        default=env_default("snapshot-interval-batches", "1000"),
        help="producer-state snapshot every N appended batches per partition")
    add("--snapshot-interval-ms", type=int, default=env_default("snapshot-interval-ms", "60000"),
        help="... or every T ms with changes")
    add("--retention-check-interval-ms", type=int,
        default=env_default("retention-check-interval-ms", "300000"),
        help="how often retention and producer expiry run (and, with --group-coordinator, "
             "how often that coordinator removes expired groups and offsets)")
    add("--producer-id-expiration-ms", type=int,
        default=env_default("producer-id-expiration-ms", str(DEFAULT_PRODUCER_ID_EXPIRATION_MS)),
        help="an idle producer's deduplication state is dropped after this")
    add("--catalog-refresh-interval-ms", type=int,
        default=env_default("catalog-refresh-interval-ms", str(10_000)),
        help="how often a store other than node 0 re-reads the topic catalog")
    add("--compaction-interval-ms", type=int,
        default=env_default("compaction-interval-ms", str(DEFAULT_COMPACTION_INTERVAL_MS)),
        help="how often compacted topics' partitions are checked and, when due, compacted")
    add("--compaction-max-keys-per-pass", type=int,
        default=env_default("compaction-max-keys-per-pass",
                            str(DEFAULT_COMPACTION_MAX_KEYS_PER_PASS)),
        help="distinct keys one compaction pass may hold in memory; a pass that reaches "
             "it stops there and the next pass goes on")
    add("--compaction-chunk-bytes", type=int,
        default=env_default("compaction-chunk-bytes", str(DEFAULT_COMPACTION_CHUNK_BYTES)),
        help="rewritten bytes a compaction pass collects before writing them (each chunk "
             "is one atomic RocksDB write)")
    add("--unsafe-skip-txn-verification", action="store_true",
        default=env_flag("unsafe-skip-txn-verification"),
        help="TEST ONLY, never in production: accept a producer's first transactional "
             "write to a partition without verifying with the transaction coordinator that "
             "the partition is in its transaction. Lets tests create hanging transactions "
             "on purpose (and lets a buggy client create them by accident). Off by default")
    add("--resolve-hanging-transactions", action=argparse.BooleanOptionalAction,
        default=(env_default("resolve-hanging-transactions", "true") or "").strip().lower()
        in ("1", "true", "yes", "on"),
        help="end a transaction that holds a partition's last stable offset past its "
             "timeout plus --hanging-txn-margin-ms: its coordinator aborts it, or (when no "
             "coordinator knows it) this store writes its ABORT marker (off: left to an "
             "operator, as Kafka does)")
    add("--hanging-txn-margin-ms", type=int,
        default=env_default("hanging-txn-margin-ms", str(DEFAULT_HANGING_TXN_MARGIN_MS)),
        help="how long past its timeout a transaction may hold a partition open before the "
             "store asks the transaction coordinators about it")
    add("--max-transaction-timeout-ms", type=int,
        default=env_default("max-transaction-timeout-ms",
                            str(DEFAULT_MAX_TRANSACTION_TIMEOUT_MS)),
        help="the timeout assumed for a transaction whose timeout this store did not learn "
             "from its coordinator (written before a restart or a leader change); at least "
             "the coordinators' --max-transaction-timeout-ms")
    add("--etcd-endpoints", default=env_default("etcd-endpoints", ""),
        help="replicated mode: host:port,... of the etcd that holds the cluster's metadata "
             "(env ONCELOG_ETCD_ENDPOINTS); empty: single copies, no etcd")
    add("--metadata-root", default=env_default("metadata-root", DEFAULT_ROOT),
        help="the etcd key prefix under which this cluster keeps its metadata")
    add("--lease-ttl-s", type=int, default=env_default("lease-ttl-s", str(DEFAULT_LEASE_TTL_S)),
        help="time-to-live of this store's etcd lease: its partitions get new leaders this "
             "long after it stops or is cut off")
    add("--replica-lag-time-max-ms", type=int,
        default=env_default("replica-lag-time-max-ms", str(DEFAULT_REPLICA_LAG_TIME_MAX_MS)),
        help="a follower that has not reached the leader's log end for this long leaves "
             "the in-sync replica set")
    add("--leader-imbalance-check-interval-ms", type=int,
        default=env_default("leader-imbalance-check-interval-ms",
                            str(DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS)),
        help="the controller moves leadership back to preferred replicas (each partition's "
             "first) this often, for the stores above --leader-imbalance-per-store-pct "
             "(Kafka's leader.imbalance.check.interval.seconds)")
    add("--leader-imbalance-per-store-pct", type=int,
        default=env_default("leader-imbalance-per-store-pct",
                            str(DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT)),
        help="a store is rebalanced when more than this percentage of the partitions it "
             "prefers to lead are led elsewhere (Kafka's "
             "leader.imbalance.per.broker.percentage)")
    add("--unclean-leader-election", action="store_true",
        default=env_flag("unclean-leader-election"),
        help="UNSAFE, off by default: when no in-sync replica of a partition is alive, let "
             "another replica lead (records only the lost ones had are gone; counted in "
             "oncelog_store_unclean_leader_elections_total and logged)")
    add("--controlled-shutdown-timeout-ms", type=int,
        default=env_default("controlled-shutdown-timeout-ms",
                            str(DEFAULT_CONTROLLED_SHUTDOWN_TIMEOUT_MS)),
        help="replicated stores, on SIGTERM (Kafka's controlled shutdown): the longest the "
             "store waits, still serving, for the controller to move the partitions it "
             "leads to other in-sync replicas before it drains and stops; what has not "
             "moved by then moves when its lease ends. 0: no hand-over")
    add("--verify-checksums-on-start", action="store_true",
        default=env_flag("verify-checksums-on-start"),
        help="before serving, read every stored key and check every stored batch's CRC32C "
             "(time grows with the data held): damage in data that recovery does not "
             "read is found at start rather than by the first read of it")
    add("--kafka-listen", default=env_default("kafka-listen", ""),
        help="also serve Kafka's wire protocol on host:port (docs/kafka-protocol.md); every "
             "store of the cluster needs one for Kafka clients. Empty: no Kafka listener")
    add("--kafka-advertised", default=env_default("kafka-advertised", ""),
        help="host:port Kafka clients are told for this store (default: its entry in "
             "--kafka-stores, else --kafka-listen)")
    add("--kafka-stores", default=env_default("kafka-stores", ""),
        help="comma-separated Kafka-listener addresses of every store, by node id (a "
             "replicated cluster also learns them from the stores' registrations)")
    add_hosting_arguments(parser)
    add_quota_arguments(parser)
    return parser


def kafka_advertised(args: argparse.Namespace, kafka_addresses: Sequence[str],
                     node_id: int) -> str | None:
    """This store's Kafka address as clients are told it; None without a
    Kafka listener."""
    if not args.kafka_listen:
        return None
    if args.kafka_advertised:
        return str(args.kafka_advertised)
    if node_id < len(kafka_addresses):
        return kafka_addresses[node_id]
    return str(args.kafka_listen)


def config_from_args(args: argparse.Namespace) -> StoreConfig:
    return StoreConfig(
        node_id=args.node_id,
        layout=layout_from_args(args),
        fsync=args.fsync,
        snapshot_interval_batches=args.snapshot_interval_batches,
        snapshot_interval_ms=args.snapshot_interval_ms,
        retention_check_interval_ms=args.retention_check_interval_ms,
        producer_id_expiration_ms=args.producer_id_expiration_ms,
        catalog_refresh_interval_ms=args.catalog_refresh_interval_ms,
        compaction_interval_ms=args.compaction_interval_ms,
        compaction_max_keys_per_pass=args.compaction_max_keys_per_pass,
        compaction_chunk_bytes=args.compaction_chunk_bytes,
        unsafe_skip_txn_verification=args.unsafe_skip_txn_verification,
        resolve_hanging_txns=args.resolve_hanging_transactions,
        hanging_txn_margin_ms=args.hanging_txn_margin_ms,
        max_transaction_timeout_ms=args.max_transaction_timeout_ms,
        replicated=bool(split_addresses(args.etcd_endpoints)),
        replica_lag_time_max_ms=args.replica_lag_time_max_ms,
    )


@dataclass(frozen=True, slots=True)
class Wired:
    runtime: StoreRuntime
    # Replicated clusters only.
    replication: ReplicaFetcherManager | None = None
    metadata: MetadataLink | None = None

    async def hand_over_leadership(self, *, timeout_ms: int) -> None:
        """The controlled shutdown (replication/controlled_shutdown.py), when replicated
        and asked for (timeout_ms > 0); nothing else."""
        if self.metadata is None or self.replication is None or timeout_ms <= 0:
            return
        await ControlledShutdown(self.runtime, self.metadata, timeout_ms=timeout_ms).run()

    def in_sync(self) -> bool:
        """Whether this store is in the ISR of every partition it holds that
        has a leader, by the metadata it read last (a single-copy store
        always is)."""
        if self.metadata is None:
            return True
        return in_sync_everywhere(self.metadata.view.states.values(),
                                  self.runtime.config.node_id)

    async def start(self) -> None:
        await self.runtime.start()
        if self.replication is not None:
            await self.replication.start()

    async def close(self) -> None:
        if self.replication is not None:
            await self.replication.close()
        await self.runtime.close()


def wire(
    store: KeyValueStore, config: StoreConfig, *, metadata: MetadataStore | None = None,
    address: str = "", listeners: Mapping[str, str] | None = None,
    metadata_root: str = DEFAULT_ROOT, lease_ttl_s: int = DEFAULT_LEASE_TTL_S,
    unclean_leader_election: bool = False,
    leader_imbalance_check_interval_ms: int = DEFAULT_LEADER_IMBALANCE_CHECK_INTERVAL_MS,
    leader_imbalance_per_store_pct: int = DEFAULT_LEADER_IMBALANCE_PER_STORE_PCT,
    txn_verifier: TxnVerifier | None = None, txn_resolver: TxnResolver | None = None,
    controller: ControllerLink | None = None, leaders: LeaderLink | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms, lease_heartbeat: LeaseHeartbeat | None = None,
) -> Wired:
    """The store's runtime over `store`, connected as every deployment
    connects it: to the transaction coordinators, and to the catalog's owner
    (single copies) or to the metadata store and the other replicas
    (replicated). `main_async` serves one over RocksDB; tests run one
    in-process over a MemoryStore (tests/support/inprocess_cluster.py), and
    the simulation (tests/sim/real) passes its own ports for the links
    that go over the network (`txn_verifier`, `txn_resolver`, `controller`,
    `leaders`; gRPC when left out) and its clock."""
    verifier = txn_verifier if txn_verifier is not None else GrpcTxnVerifier(config.layout)
    resolver = txn_resolver if txn_resolver is not None else GrpcTxnResolver(config.layout)
    if not config.replicated:
        return _leaders_to_links(Wired(StoreRuntime(
            store, config,
            controller=controller if controller is not None else GrpcControllerLink(
                config.layout),
            txn_verifier=verifier, txn_resolver=resolver, clock_ms=clock_ms,
        )), verifier, resolver)
    if metadata is None:
        raise ValueError("a replicated store needs its metadata store")
    link = MetadataLink(
        metadata, layout=config.layout, node_id=config.node_id, root=metadata_root,
        lease_ttl_s=lease_ttl_s, unclean_leader_election=unclean_leader_election,
        leader_imbalance_check_interval_ms=leader_imbalance_check_interval_ms,
        leader_imbalance_per_store_pct=leader_imbalance_per_store_pct,
        clock_ms=clock_ms, lease_heartbeat=lease_heartbeat,
    )
    runtime = StoreRuntime(store, config, controller=link, txn_verifier=verifier,
                           txn_resolver=resolver, clock_ms=clock_ms)
    runtime.hooks.store_addresses = link.store_addresses
    runtime.hooks.token_store_addresses = link.token_store_addresses
    runtime.hooks.kafka_store_addresses = link.kafka_store_addresses
    runtime.hooks.reassigner = link.alter_reassignments
    runtime.hooks.live_stores = lambda: link.view.live_stores.keys()
    manager = ReplicaFetcherManager(
        runtime, link,
        leaders if leaders is not None else GrpcLeaderLink(link.store_addresses),
        address=address or config.layout.stores[config.node_id], listeners=listeners,
    )
    return _leaders_to_links(Wired(runtime, manager, link), verifier, resolver)


def _leaders_to_links(wired: Wired, verifier: TxnVerifier, resolver: TxnResolver) -> Wired:
    """The gRPC links to the transaction coordinators learn who leads each
    partition from this store's runtime (made after them, with them):
    where a coordinator runs in every store, the one to ask is in the
    store that leads the transactional id's `__transaction_state`
    partition (ClusterLayout.coordinator_now)."""
    for coordinator_link in (verifier, resolver):
        if isinstance(coordinator_link, (GrpcTxnVerifier, GrpcTxnResolver)):
            coordinator_link.leader_of = wired.runtime.leader_of
    return wired


async def main_async(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir (or ONCELOG_DATA_DIR) is required")
    if args.controlled_shutdown_timeout_ms < 0:
        parser.error(f"--controlled-shutdown-timeout-ms is {args.controlled_shutdown_timeout_ms}; "
                     "it must be >= 0 (0: no hand-over)")
    configure_logging(args.log_format, args.log_level, f"partition_store[{args.node_id}]")
    try:
        config = config_from_args(args)
        quotas = StoreQuotas(quota_config_from_args(args))
    except ValueError as exc:
        parser.error(str(exc))
    # First: it makes every channel of this process use TLS when it serves TLS.
    security = ServiceSecurity.from_args(args, "partition_store")
    layout = config.layout
    advertised = args.advertised or layout.stores[config.node_id]
    listen = args.listen or advertised
    try:
        coordinator_id = coordinator_node(args, layout, advertised)
        group_coordinator_id = group_coordinator_node(args, layout, advertised)
    except ValueError as exc:
        parser.error(str(exc))
    # What this process answers itself when it also runs a coordinator (of
    # either kind, or both): the layout gives the store and its coordinators
    # its one address.
    local = (None if coordinator_id is None and group_coordinator_id is None
             else InProcess({advertised}))
    data_dir = Path(args.data_dir)
    if config.unsafe_skip_txn_verification:
        log.warning(
            "--unsafe-skip-txn-verification is set: transactional writes are NOT verified "
            "with the transaction coordinator (test only; hanging transactions possible)"
        )
    metadata = None
    heartbeat = None
    if config.replicated:
        endpoints = split_addresses(args.etcd_endpoints)
        metadata = EtcdMetadataStore(endpoints, timeout_ms=METADATA_TIMEOUT_MS)
        # The lease stands for this process and its event loop running, not
        # for how late the loop runs under load (replication/lease_heartbeat.py).
        heartbeat = LeaseHeartbeat(
            endpoints, timeout_ms=METADATA_TIMEOUT_MS, interval_s=args.lease_ttl_s / 3,
            loop_stall_limit_s=DEFAULT_LOOP_STALL_LIMIT_TTLS * args.lease_ttl_s)
        heartbeat.start(asyncio.get_running_loop())
        log.info("replicated mode: cluster metadata in etcd at %s under %s",
                 ",".join(endpoints), args.metadata_root)
        if args.unclean_leader_election:
            log.warning("--unclean-leader-election is set: a replica outside the ISR may "
                        "lead, and acknowledged records may be lost when it does")
    else:
        log.info("single-copy mode (no --etcd-endpoints): each partition is one copy on "
                 "one store")
    store = await open_store(
        data_dir, node_id=config.node_id, verify=args.verify_checksums_on_start,
        sole_copies=None if metadata is None else partial(
            _sole_copies, metadata, root=args.metadata_root, node_id=config.node_id))
    kafka_address = kafka_advertised(args, layout.kafka_stores, config.node_id)
    listeners = {TOKEN_LISTENER: token_advertised(args, layout.token_stores, config.node_id),
                 KAFKA_LISTENER: kafka_address}
    wired = wire(
        store, config, metadata=metadata, address=advertised,
        listeners={kind: address for kind, address in listeners.items() if address},
        metadata_root=args.metadata_root, lease_ttl_s=args.lease_ttl_s,
        unclean_leader_election=args.unclean_leader_election,
        leader_imbalance_check_interval_ms=args.leader_imbalance_check_interval_ms,
        leader_imbalance_per_store_pct=args.leader_imbalance_per_store_pct,
        lease_heartbeat=heartbeat,
        txn_verifier=None if local is None else GrpcTxnVerifier(layout, local=local),
    )
    runtime = wired.runtime
    runtime.hooks.on_damage = partial(record_and_stop, data_dir, config.node_id)
    # With --authorizer acl: this store's own client of the stores, through
    # which it reads and appends __acls at whichever store leads it.
    acl_client = StoreClient(layout) if security.settings.authorizer is not None else None
    acls = None
    if acl_client is not None:
        watcher = security.watch_acls(acl_client)
        if watcher is not None:
            acls = AclService(watcher, acl_client)

    store_servicer = PartitionStoreServicer(runtime, acls=acls, quotas=quotas)
    hosted: HostedCoordinators | None = None
    if local is not None:
        store_servicer.serve_in_process(local)
        # Imported here, not at the top: a store that runs no coordinator,
        # the default, never needs them (rpc/hosting.py).
        from .rpc.hosting import host
        hosted = host(args, layout, local, coordinator_id=coordinator_id,
                      group_coordinator_id=group_coordinator_id, leader_of=runtime.leader_of)

    kafka: KafkaListener | None = None

    async def close() -> None:
        nonlocal kafka, hosted
        if kafka is not None:
            listener, kafka = kafka, None
            await listener.close()
            await listener.broker.coordinators.close()
        if hosted is not None:
            # Before the store: their last appends and markers go to it.
            coordinators, hosted = hosted, None
            await coordinators.stop()
        await wired.close()
        if acl_client is not None:
            await acl_client.close()

    try:
        try:
            await wired.start()
        except CorruptionError as exc:
            # Recovery read damaged data: the next start decides (damage.py).
            record_and_stop(data_dir, config.node_id, exc)
        if hosted is not None:
            # From here on, each change of leadership reaches them; start
            # then tells them what this store leads already.
            runtime.hooks.on_leadership = hosted.follow
            await hosted.start(partial(_led_here, runtime))
        if kafka_address is not None:
            kafka = kafka_listener(args, runtime, security, kafka_address, quotas=quotas,
                                   local=local)
            try:
                await kafka.start()
            except OSError as exc:
                raise SystemExit(listen_failure("partition_store", KAFKA, args.kafka_listen,
                                                exc)) from exc

        def register(server: grpc.aio.Server) -> None:
            partition_store_pb2_grpc.add_PartitionStoreServicer_to_server(store_servicer, server)
            if hosted is not None:
                hosted.register(server)

        async def hand_over() -> None:
            await wired.hand_over_leadership(timeout_ms=args.controlled_shutdown_timeout_ms)

        async def draining() -> None:
            runtime.begin_shutdown()

        await serve(
            service_name="partition_store",
            full_service_names=[SERVICE_NAME, *(hosted.service_names if hosted else [])],
            listen=listen,
            register=register,
            node_id=config.node_id,
            metrics_port=args.metrics_port,
            shutdown_grace_ms=args.shutdown_grace_ms,
            before_draining=hand_over,
            on_draining=draining,
            on_shutdown=close,
            security=security,
            health_checks={IN_SYNC_HEALTH_SERVICE: wired.in_sync},
            translate_error=storage_refusal,
        )
    finally:
        # After serve() this is a no-op; it matters when start or serve failed.
        await close()


def _led_here(runtime: StoreRuntime, topic: str, partition: int) -> tuple[bool, int]:
    """Whether this store leads a partition now, and at which leader epoch."""
    part = runtime.led_partition(topic, partition)
    return (part is not None, part.state.leader_epoch if part is not None else -1)


async def _sole_copies(metadata: MetadataStore, *, root: str, node_id: int) -> list[str]:
    """sole_in_sync_replica_of, retried while the metadata store is out of
    reach (a whole cluster starting), up to START_METADATA_WAIT_MS."""
    deadline_s = time.monotonic() + START_METADATA_WAIT_MS / 1000
    while True:
        try:
            return await sole_in_sync_replica_of(metadata, root=root, node_id=node_id)
        except MetadataUnavailable:
            if time.monotonic() > deadline_s:
                raise
            await asyncio.sleep(0.5)


def kafka_listener(args: argparse.Namespace, runtime: StoreRuntime, security: ServiceSecurity,
                   advertised: str, *, quotas: StoreQuotas | None = None,
                   local: InProcess | None = None) -> KafkaListener:
    """The store's Kafka listener (services/kafka), secured as its gRPC
    port is: TLS when the store serves TLS, client certificates and
    SASL/OAUTHBEARER with the same principals, the same ACLs."""
    # Imported here, not at the top: Kafka's protocol library takes about a
    # second of CPU to import (most of a store's start), and a store
    # without --kafka-listen, the default, never needs it.
    from ..kafka.broker import KafkaBroker, cluster_id_for
    from ..kafka.handlers import HANDLERS
    from ..kafka.listener import KafkaListener, ListenerSecurity
    from ..kafka.rpc.forward import CoordinatorClient

    node_id = runtime.config.node_id
    settings = security.settings

    def addresses() -> dict[int, str]:
        return {**runtime.hooks.kafka_store_addresses(), node_id: advertised}

    broker = KafkaBroker(
        runtime=runtime, node_id=node_id,
        cluster_id=cluster_id_for(runtime.layout, args.metadata_root),
        addresses=addresses,
        coordinators=CoordinatorClient(runtime.layout, runtime.leader_of, local=local,
                                       live_stores=runtime.hooks.live),
        handlers=HANDLERS, guard=security.guard(), quotas=quotas)
    return KafkaListener(broker, args.kafka_listen, ListenerSecurity(
        tls=security.tls_files, sasl_oauthbearer=bool(settings.authentication.issuers),
        anonymous=not settings.authentication.required))


def main(argv: Sequence[str] | None = None) -> None:
    run(lambda: main_async(argv))
