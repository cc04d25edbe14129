"""`oncelog transactions`: list, describe, abort; producers and hanging
transactions of a partition."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.admin import DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
from oncelog.cli._common import (
    JSON,
    CliError,
    add_output_option,
    admin_client,
    check_partition,
    emit_json,
    print_table,
    tp_json,
)
from oncelog.types import (
    TopicPartition,
)


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
    txns = commands.add_parser(
        "transactions", help="list, describe and abort transactions; find hanging ones",
    )
    txn_cmds = txns.add_subparsers(dest="action", required=True, metavar="ACTION")
    txn_list = txn_cmds.add_parser("list", parents=[common],
                                   help="every transactional id the coordinators know")
    add_output_option(txn_list)
    txn_describe = txn_cmds.add_parser(
        "describe", parents=[common],
        help="a transactional id's state, producer id/epoch and open transaction",
    )
    txn_describe.add_argument("transactional_id")
    add_output_option(txn_describe)
    producers = txn_cmds.add_parser(
        "describe-producers", parents=[common],
        help="the producers active on a partition and their open transactions",
    )
    producers.add_argument("topic")
    producers.add_argument("partition", type=int)
    add_output_option(producers)
    hanging = txn_cmds.add_parser(
        "find-hanging", parents=[common],
        help="open transactions on partitions that no coordinator will end",
    )
    hanging.add_argument(
        "--max-timeout-ms", type=int, default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
        help="a transaction open longer than this is hanging "
             f"(default {DEFAULT_MAX_TRANSACTION_TIMEOUT_MS}, the coordinators' maximum)",
    )
    hanging.add_argument("--topic", action="append", default=None,
                         help="look only at this topic (repeatable; default: every topic)")
    add_output_option(hanging)
    txn_abort = txn_cmds.add_parser(
        "abort", parents=[common],
        help="abort a transactional id's open transaction at its coordinator",
    )
    txn_abort.add_argument("transactional_id")
    abort_hanging = txn_cmds.add_parser(
        "abort-hanging", parents=[common],
        help="write an ABORT marker for a producer's open transaction on one partition",
    )
    abort_hanging.add_argument("topic")
    abort_hanging.add_argument("partition", type=int)
    abort_hanging.add_argument("producer_id", type=int)




def run_transactions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin, admin._within(args.timeout_ms):
        rows: list[tuple[str, ...]]
        if args.action == "list":
            listed = admin.list_transactions()
            if args.output == JSON:
                emit_json([{"transactional_id": t.transactional_id,
                             "producer_id": t.producer_id, "state": t.state} for t in listed])
                return 0
            rows = [("transactional_id", "producer_id", "state")]
            rows += [(t.transactional_id, str(t.producer_id), t.state) for t in listed]
            print_table(rows)
        elif args.action == "describe":
            d = admin.describe_transaction(args.transactional_id)
            prepared = d.prepared_transaction
            if args.output == JSON:
                emit_json({
                    "transactional_id": d.transactional_id, "state": d.state,
                    "producer_id": d.producer_id, "producer_epoch": d.producer_epoch,
                    "coordinator_epoch": d.coordinator_epoch,
                    "transaction_timeout_ms": d.transaction_timeout_ms,
                    "transaction_start_time_ms": d.transaction_start_time_ms,
                    "partitions": [tp_json(tp) for tp in d.partitions],
                    "two_phase_commit": d.two_phase_commit,
                    "prepared_transaction": None if prepared is None else {
                        "producer_id": prepared.producer_id,
                        "producer_epoch": prepared.producer_epoch,
                    },
                })
                return 0
            print(f"transactional_id {d.transactional_id}")
            print(f"state {d.state}")
            print(f"producer_id {d.producer_id}  producer_epoch {d.producer_epoch}  "
                  f"coordinator_epoch {d.coordinator_epoch}")
            print(f"transaction_timeout_ms {d.transaction_timeout_ms}  "
                  f"transaction_start_time_ms {d.transaction_start_time_ms}")
            parts = " ".join(f"{tp.topic}-{tp.partition}" for tp in d.partitions)
            print(f"partitions {parts or '-'}")
            if d.two_phase_commit:
                print("two_phase_commit yes  prepared_transaction "
                      f"{'-' if prepared is None else prepared}")
        elif args.action == "describe-producers":
            check_partition(args.partition)
            states = admin.describe_producers(TopicPartition(args.topic, args.partition))
            if args.output == JSON:
                emit_json([{
                    "producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
                    "last_sequence": s.last_sequence, "last_timestamp_ms": s.last_timestamp_ms,
                    "coordinator_epoch": s.coordinator_epoch,
                    "current_txn_start_offset": s.current_txn_start_offset,
                } for s in states])
                return 0
            rows = [("producer_id", "producer_epoch", "last_sequence", "last_timestamp_ms",
                     "coordinator_epoch", "current_txn_start_offset")]
            rows += [
                (str(s.producer_id), str(s.producer_epoch), str(s.last_sequence),
                 str(s.last_timestamp_ms), str(s.coordinator_epoch),
                 "-" if s.current_txn_start_offset is None else str(s.current_txn_start_offset))
                for s in states
            ]
            print_table(rows)
        elif args.action == "find-hanging":
            if args.max_timeout_ms <= 0:
                raise CliError("--max-timeout-ms must be positive")
            found = admin.find_hanging_transactions(
                max_transaction_timeout_ms=args.max_timeout_ms, topics=args.topic,
            )
            if args.output == JSON:
                emit_json([{
                    **tp_json(h.topic_partition), "producer_id": h.producer_id,
                    "producer_epoch": h.producer_epoch, "coordinator_epoch": h.coordinator_epoch,
                    "current_txn_start_offset": h.current_txn_start_offset,
                    "last_timestamp_ms": h.last_timestamp_ms, "reason": h.reason,
                } for h in found])
                return 0
            rows = [("topic", "partition", "producer_id", "producer_epoch",
                     "coordinator_epoch", "start_offset", "last_timestamp_ms", "reason")]
            rows += [
                (h.topic_partition.topic, str(h.topic_partition.partition), str(h.producer_id),
                 str(h.producer_epoch), str(h.coordinator_epoch),
                 str(h.current_txn_start_offset), str(h.last_timestamp_ms), h.reason)
                for h in found
            ]
            print_table(rows)
        elif args.action == "abort":
            d = admin.abort_transaction(args.transactional_id)
            print(f"aborted the open transaction of {d.transactional_id} "
                  f"(producer {d.producer_id}, now epoch {d.producer_epoch}, {d.state})")
        else:
            check_partition(args.partition)
            admin.abort_hanging_transaction(
                TopicPartition(args.topic, args.partition), args.producer_id,
            )
            print(f"aborted the open transaction of producer {args.producer_id} on "
                  f"{args.topic}-{args.partition}")
    return 0

