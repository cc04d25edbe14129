"""The transaction coordinator's settings and the flags that set them.

Apart from the runtime (txn_runtime.py) so that a partition store, which
takes these flags for the coordinator it may run in its process
(`--transaction-coordinator`), does not import the coordinator to parse
them: a store that runs none never imports it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..common.rpc.server_base import add_int_flags, env_default
from .core.producer_ids import DEFAULT_BLOCK_SIZE


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnConfig:
    max_transaction_timeout_ms: int = 900_000
    # Idle transactional ids are forgotten after this (Kafka: 7 days).
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # How often timeouts and expirations are checked.
    check_interval_ms: int = 1000
    max_partitions_per_txn: int = 1000
    marker_retry_backoff_ms_max: int = 1000
    # How long a request for a transactional id whose markers are in flight
    # waits for them before answering CONCURRENT_TRANSACTIONS.
    wait_for_markers_ms: int = 5000
    # Whether producers may initialize with two-phase commit (KIP-939), whose
    # transactions never time out (Kafka gates it with an ACL).
    allow_two_phase_commit: bool = True


def add_coordinator_arguments(parser: argparse.ArgumentParser, *,
                              max_transaction_timeout: bool = True) -> None:
    """The coordinator's own flags: also a partition store's, which can run
    a coordinator in its process (--transaction-coordinator). A store has
    its own --max-transaction-timeout-ms (the timeout it assumes for a
    transaction it was not told about, at least the coordinators'): one
    flag then sets both, so `max_transaction_timeout=False` leaves it out."""
    parser.add_argument(
        "--producer-id-block-size", type=int,
        default=env_default("producer-id-block-size", str(DEFAULT_BLOCK_SIZE)),
        help="producer ids claimed per durable block",
    )
    defaults = TxnConfig()
    add_int_flags(parser, [
        ("max-transaction-timeout-ms", defaults.max_transaction_timeout_ms,
         "the longest transaction timeout a producer may ask for"),
        ("transactional-id-expiration-ms", defaults.transactional_id_expiration_ms,
         "an idle transactional id is forgotten after this"),
        ("transaction-check-interval-ms", defaults.check_interval_ms,
         "how often transaction timeouts and expirations are checked"),
    ], leave_out=() if max_transaction_timeout else ("max-transaction-timeout-ms",))
    parser.add_argument(
        "--allow-two-phase-commit", action=argparse.BooleanOptionalAction,
        default=(env_default("allow-two-phase-commit", "true") or "").strip().lower()
        in ("1", "true", "yes", "on"),
        help="let producers initialize with two-phase commit (KIP-939): their "
             "transactions never time out and can be prepared and completed by another "
             "process (default on; --no-allow-two-phase-commit refuses them)",
    )


def txn_config_from_args(args: argparse.Namespace) -> TxnConfig:
    return TxnConfig(
        max_transaction_timeout_ms=args.max_transaction_timeout_ms,
        transactional_id_expiration_ms=args.transactional_id_expiration_ms,
        check_interval_ms=args.transaction_check_interval_ms,
        allow_two_phase_commit=args.allow_two_phase_commit,
    )
