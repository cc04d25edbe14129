"""`oncelog topics` and `oncelog partitions`: create, list, describe, delete,
grow topics; partition reassignments."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli._common import (
    JSON,
    CliError,
    add_output_option,
    admin_client,
    emit_json,
    print_table,
    tp_json,
    working,
)
from oncelog.types import (
    TopicPartition,
)


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
    topics = commands.add_parser("topics",
                                 help="create, list, describe, delete topics, add partitions")
    topic_cmds = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = topic_cmds.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=0,
                        help="copies of each partition (default: the cluster's, min(3, stores) "
                             "on a replicated cluster)")
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE",
        help="topic configuration, e.g. retention.ms=86400000 (repeatable)",
    )
    topic_list = topic_cmds.add_parser("list", parents=[common], help="list user topics")
    add_output_option(topic_list)
    describe = topic_cmds.add_parser(
        "describe", parents=[common], help="partitions, stores, offsets, configuration"
    )
    describe.add_argument("name")
    add_output_option(describe)
    delete = topic_cmds.add_parser("delete", parents=[common], help="delete a topic")
    delete.add_argument("name")
    grow = topic_cmds.add_parser(
        "add-partitions", parents=[common],
        help="grow a topic to more partitions (existing ones keep their records)")
    grow.add_argument("name")
    grow.add_argument("--partitions", type=int, required=True, metavar="N",
                      help="the topic's new total partition count (more than it has)")
    grow.add_argument("--validate-only", action="store_true",
                      help="check with the cluster, change nothing")
    partitions = commands.add_parser(
        "partitions", help="move partition replicas (a replicated cluster)")
    partition_cmds = partitions.add_subparsers(dest="action", required=True, metavar="ACTION")
    reassign = partition_cmds.add_parser(
        "reassign", parents=[common],
        help="move a partition to new replicas (store node ids, the preferred leader first)")
    reassign.add_argument("topic")
    reassign.add_argument("partition", type=int)
    reassign.add_argument("--replicas", required=True, metavar="ID,ID,...",
                          help="the store node ids to hold the partition, e.g. 3,1,2")
    moves = partition_cmds.add_parser("list-reassignments", parents=[common],
                                      help="moves in progress")
    add_output_option(moves)



def run_topics(args: argparse.Namespace) -> int:
    # --timeout-ms bounds the whole command, not each of its requests.
    with admin_client(args) as admin, admin._within(args.timeout_ms):
        if args.action == "create":
            config = _parse_config(args.config)
            with working(f"creating topic {args.name} ({args.partitions} partitions)"):
                admin.create_topic(args.name, partitions=args.partitions, config=config,
                                   replication_factor=args.replication_factor)
            print(f"created topic {args.name} with {args.partitions} partitions")
        elif args.action == "list":
            listed = sorted(admin.list_topics().items())
            if args.output == JSON:
                emit_json([{"name": name, "partitions": count} for name, count in listed])
            else:
                for name, partitions in listed:
                    print(f"{name}\t{partitions}")
        elif args.action == "describe":
            with working(f"describing topic {args.name}"):
                d = admin.describe_topic(args.name)
            if args.output == JSON:
                emit_json({
                    "name": d.name, "topic_id": d.topic_id, "internal": d.internal,
                    "config": dict(sorted(d.config.items())),
                    "partitions": [{
                        "partition": p.partition, "leader_node_id": p.leader_node_id,
                        "leader_address": p.leader_address, "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas), "isr": list(p.isr),
                        "target_replicas": list(p.target_replicas),
                        "earliest_offset": p.earliest_offset,
                        "high_watermark": p.high_watermark,
                        "last_stable_offset": p.last_stable_offset,
                    } for p in d.partitions],
                })
                return 0
            print(f"topic {d.name}  id {d.topic_id}  partitions {len(d.partitions)}")
            print("config " + " ".join(f"{k}={v}" for k, v in sorted(d.config.items())))
            rows = [("partition", "leader", "address", "epoch", "replicas", "in_sync",
                     "earliest", "high_watermark", "last_stable")]
            rows += [
                (str(p.partition), str(p.leader_node_id), p.leader_address,
                 str(p.leader_epoch), ",".join(map(str, p.replicas)),
                 ",".join(map(str, p.isr)), str(p.earliest_offset), str(p.high_watermark),
                 str(p.last_stable_offset))
                for p in d.partitions
            ]
            print_table(rows)
        elif args.action == "add-partitions":
            with working(f"growing topic {args.name} to {args.partitions} partitions"):
                admin.create_partitions({args.name: args.partitions},
                                        validate_only=args.validate_only)
            if args.validate_only:
                print(f"topic {args.name} can grow to {args.partitions} partitions "
                      "(validate only: nothing changed)")
            else:
                print(f"topic {args.name} now has {args.partitions} partitions")
        else:
            with working(f"deleting topic {args.name}"):
                admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def run_partitions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin, admin._within(args.timeout_ms):
        if args.action == "reassign":
            try:
                replicas = [int(r) for r in args.replicas.split(",") if r.strip()]
            except ValueError:
                raise CliError(f"--replicas takes store node ids like 3,1,2, got "
                               f"{args.replicas!r}") from None
            tp = TopicPartition(args.topic, args.partition)
            error = admin.alter_partition_reassignments({tp: replicas})[tp]
            if error is not None:
                raise error
            print(f"moving {args.topic}-{args.partition} to replicas "
                  f"{','.join(map(str, replicas))}; `oncelog topics describe {args.topic}` "
                  "shows the progress")
        else:
            moves = sorted(admin.list_partition_reassignments().items())
            if args.output == JSON:
                emit_json([{**tp_json(tp), "target_replicas": list(target)}
                            for tp, target in moves])
                return 0
            rows = [("topic", "partition", "target_replicas")]
            rows += [(tp.topic, str(tp.partition), ",".join(map(str, target)))
                     for tp, target in moves]
            print_table(rows)
    return 0


def _parse_config(items: list[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--config takes KEY=VALUE, got {item!r}")
        config[key] = value
    return config

