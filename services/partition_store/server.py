"""Wiring of a partition store process: flags and environment, RocksDB,
recovery, the gRPC server (health, reflection), metrics, graceful shutdown.

    python -m services.partition_store --node-id 0 --stores 127.0.0.1:7000,... \\
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

The transaction coordinators (--coordinators) are asked to verify a
producer's first transactional write to each partition (verify_only).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc

from oncelog.v1 import partition_store_pb2_grpc
from services.common.server_base import (
    add_common_arguments,
    configure_logging,
    env_default,
    env_flag,
    layout_from_args,
    run,
    serve,
)
from services.partition_store.controller_link import GrpcControllerLink
from services.partition_store.coordinator_link import GrpcTxnVerifier
from services.partition_store.core.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from services.partition_store.runtime import (
    DEFAULT_COMPACTION_CHUNK_BYTES,
    DEFAULT_COMPACTION_INTERVAL_MS,
    DEFAULT_COMPACTION_MAX_KEYS_PER_PASS,
    StoreConfig,
    StoreRuntime,
)
from services.partition_store.servicer import SERVICE_NAME, PartitionStoreServicer
from services.partition_store.storage.port import KeyValueStore
from services.partition_store.storage.rocksdb import RocksStore

log = logging.getLogger("oncelog.partition_store")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.partition_store", description="oncelog partition store",
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
        help="how often retention and producer expiry run")
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
    return parser


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
    )


def wire(store: KeyValueStore, config: StoreConfig) -> StoreRuntime:
    """The store's runtime over `store`, connected to the controller and the
    transaction coordinators as every deployment connects it. `main_async`
    serves one over RocksDB; tests run one in-process over a MemoryStore
    (tests/support/inprocess_cluster.py)."""
    return StoreRuntime(
        store, config, controller=GrpcControllerLink(config.layout),
        txn_verifier=GrpcTxnVerifier(config.layout),
    )


async def main_async(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir (or ONCELOG_DATA_DIR) is required")
    configure_logging(args.log_format, args.log_level, f"partition_store[{args.node_id}]")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    layout = config.layout
    listen = args.listen or args.advertised or layout.stores[config.node_id]
    store = RocksStore(Path(args.data_dir) / "rocksdb")
    if config.unsafe_skip_txn_verification:
        log.warning(
            "--unsafe-skip-txn-verification is set: transactional writes are NOT verified "
            "with the transaction coordinator (test only; hanging transactions possible)"
        )
    runtime = wire(store, config)
    try:
        await runtime.start()

        def register(server: grpc.aio.Server) -> None:
            partition_store_pb2_grpc.add_PartitionStoreServicer_to_server(
                PartitionStoreServicer(runtime), server
            )

        async def draining() -> None:
            runtime.begin_shutdown()

        await serve(
            service_name="partition_store",
            full_service_names=[SERVICE_NAME],
            listen=listen,
            register=register,
            node_id=config.node_id,
            metrics_port=args.metrics_port,
            shutdown_grace_ms=args.shutdown_grace_ms,
            on_draining=draining,
            on_shutdown=runtime.close,
        )
    finally:
        # After serve() this is a no-op; it matters when start or serve failed.
        await runtime.close()


def main(argv: Sequence[str] | None = None) -> None:
    run(lambda: main_async(argv))
