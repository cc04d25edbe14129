"""`oncelog groups`: list, describe, offsets and lag, reset offsets, delete."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog import errors
from oncelog.admin import Admin
from oncelog.cli._common import (
    JSON,
    CliError,
    add_output_option,
    admin_client,
    emit_json,
    print_table,
    tp_json,
)
from oncelog.types import (
    TopicPartition,
)
from oncelog.wire.errors import ErrorCode


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
    groups = commands.add_parser(
        "groups", help="list and describe consumer groups; show, reset and delete their offsets",
    )
    group_cmds = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    group_list = group_cmds.add_parser("list", parents=[common],
                                       help="every group the group coordinators know")
    group_list.add_argument("--state", action="append", default=None,
                            help="only groups in this state (repeatable)")
    add_output_option(group_list)
    group_describe = group_cmds.add_parser(
        "describe", parents=[common], help="a group's state, epoch, members and assignment",
    )
    group_describe.add_argument("group")
    add_output_option(group_describe)
    group_offsets = group_cmds.add_parser(
        "offsets", parents=[common],
        help="committed offsets, end offsets (read_committed) and lag per partition",
    )
    group_offsets.add_argument("group")
    add_output_option(group_offsets)
    reset = group_cmds.add_parser(
        "reset-offsets", parents=[common],
        help="plan (or with --execute, make) a move of an empty group's committed offsets",
        description=(
            "Plans a move of the committed offsets of a group without members: prints, per "
            "partition, the current and the new offset, and changes nothing unless "
            "--execute is given (Kafka's safety default). Say where (one of --to-earliest, "
            "--to-latest, --to-offset, --to-timestamp-ms) and which partitions (--topic, "
            "repeatable, or --all-topics: every partition with a committed offset)."
        ),
    )
    reset.add_argument("group")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true",
                    help="the end for a read_committed reader (the last stable offset)")
    to.add_argument("--to-offset", type=int, metavar="N")
    to.add_argument("--to-timestamp-ms", type=int, metavar="T",
                    help="the first record at or after T (ms since the epoch)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", action="append", metavar="TOPIC[:P,P...]",
                       help="a topic's partitions (all, or those listed); repeatable")
    which.add_argument("--all-topics", action="store_true",
                       help="every partition the group has a committed offset for")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true",
                      help="commit the new offsets (without it, only the plan is printed)")
    mode.add_argument("--dry-run", action="store_true",
                      help="print the plan and commit nothing (the default)")
    add_output_option(reset)
    group_delete = group_cmds.add_parser(
        "delete", parents=[common], help="delete an empty group and its offsets",
    )
    group_delete.add_argument("group")




def run_groups(args: argparse.Namespace) -> int:
    with admin_client(args) as admin, admin._within(args.timeout_ms):
        rows: list[tuple[str, ...]]
        if args.action == "list":
            listed = admin.list_groups(args.state)
            if args.output == JSON:
                emit_json([{"group_id": g.group_id, "state": g.state} for g in listed])
                return 0
            rows = [("group_id", "state")]
            rows += [(g.group_id, g.state) for g in listed]
            print_table(rows)
        elif args.action == "describe":
            d = admin.describe_group(args.group)
            if args.output == JSON:
                emit_json({
                    "group_id": d.group_id, "state": d.state, "group_epoch": d.group_epoch,
                    "coordinator_epoch": d.coordinator_epoch,
                    "members": [{
                        "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "member_epoch": m.member_epoch,
                        "subscribed_topics": list(m.subscribed_topics),
                        "assignment": [tp_json(tp) for tp in m.assignment],
                    } for m in d.members],
                })
                return 0
            print(f"group {d.group_id}  state {d.state}  group_epoch {d.group_epoch}  "
                  f"members {len(d.members)}")
            rows = [("member_id", "instance_id", "member_epoch", "topics", "assignment")]
            rows += [
                (m.member_id, m.group_instance_id or "-", str(m.member_epoch),
                 ",".join(m.subscribed_topics) or "-",
                 " ".join(f"{tp.topic}-{tp.partition}" for tp in m.assignment) or "-")
                for m in d.members
            ]
            print_table(rows)
        elif args.action == "offsets":
            owners = {tp: m.member_id for m in admin.describe_group(args.group).members
                      for tp in m.assignment}
            offsets = admin.list_group_offsets(args.group)
            if args.output == JSON:
                emit_json([{
                    **tp_json(tp), "committed_offset": o.offset, "end_offset": o.end_offset,
                    "lag": o.lag, "member_id": owners.get(tp),
                } for tp, o in offsets.items()])
                return 0
            rows = [("topic", "partition", "committed", "end", "lag", "member_id")]
            rows += [
                (tp.topic, str(tp.partition), str(o.offset),
                 "-" if o.end_offset is None else str(o.end_offset),
                 "-" if o.lag is None else str(o.lag), owners.get(tp, "-"))
                for tp, o in offsets.items()
            ]
            print_table(rows)
        elif args.action == "reset-offsets":
            _reset_group_offsets(admin, args)
        else:
            admin.delete_group(args.group)
            print(f"deleted group {args.group}")
    return 0


def _reset_group_offsets(admin: Admin, args: argparse.Namespace) -> None:
    """Prints the plan (per partition the current and the new committed
    offset); commits it only with --execute, as Kafka's
    kafka-consumer-groups --reset-offsets does."""
    partitions: list[TopicPartition] | None = None
    if args.topic:
        topics = admin.list_topics()
        partitions = []
        for spec in args.topic:
            name, sep, numbers = spec.partition(":")
            if name not in topics:
                raise CliError(f"topic {name!r} does not exist")
            if not sep:
                partitions += [TopicPartition(name, p) for p in range(topics[name])]
                continue
            try:
                partitions += [TopicPartition(name, int(p)) for p in numbers.split(",")]
            except ValueError:
                raise CliError(f"--topic takes TOPIC or TOPIC:P,P,..., got {spec!r}") from None
    if not args.execute:
        # A plan for a group in use would not be carried out: say so now, as
        # Kafka does for its dry runs (the commit itself is refused then).
        try:
            members = admin.describe_group(args.group).members
        except errors.OncelogError as exc:
            if exc.code is not ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            members = ()
        if members:
            raise errors.error_for(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"group {args.group!r} has members, so its offsets cannot be changed from "
                "outside; stop its consumers first",
            )
    current = admin.list_group_offsets(args.group, partitions)
    new = admin.reset_group_offsets(
        args.group, partitions,
        to="earliest" if args.to_earliest else "latest" if args.to_latest else None,
        offset=args.to_offset, timestamp_ms=args.to_timestamp_ms, dry_run=not args.execute,
    )
    plan = [(tp, current[tp].offset if tp in current else None, offset)
            for tp, offset in sorted(new.items())]
    if args.output == JSON:
        emit_json({
            "group_id": args.group, "executed": bool(args.execute),
            "offsets": [{**tp_json(tp), "current_offset": old, "new_offset": offset}
                        for tp, old, offset in plan],
        })
        return
    rows = [("topic", "partition", "current_offset", "new_offset")]
    rows += [(tp.topic, str(tp.partition), "-" if old is None else str(old), str(offset))
             for tp, old, offset in plan]
    print_table(rows)
    if args.execute:
        print(f"reset {len(new)} offsets of group {args.group}")
    else:
        print(f"plan only: nothing committed for group {args.group} (--execute commits it)")

