"""`oncelog acls`: add, list and remove ACL bindings."""

from __future__ import annotations

import argparse
from typing import Any

from oncelog.cli._common import (
    JSON,
    UsageError,
    add_output_option,
    admin_client,
    emit_json,
    print_table,
)
from oncelog.types import (
    ACL_CLUSTER_NAME,
    AclBinding,
    AclFilter,
)


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
    acls = commands.add_parser(
        "acls", help="add, list and remove ACLs (a cluster with an authorizer)",
        description="ACLs with Kafka's kafka-acls.sh vocabulary; docs/security.md has the "
                    "resource types, operations and rules.",
    )
    acl_cmds = acls.add_subparsers(dest="action", required=True, metavar="ACTION")
    acl_add = acl_cmds.add_parser(
        "add", parents=[common], help="add ACL bindings",
        description="Adds one binding per principal, host, operation and resource: "
                    "--allow-principal/--deny-principal (repeatable), --operation "
                    "(repeatable), and the resources (--topic, --group, --transactional-id, "
                    "each repeatable, and --cluster). --producer and --consumer add what a "
                    "producer or a consumer needs, as Kafka's tool does.",
    )
    _add_acl_principals(acl_add)
    _add_acl_resources(acl_add, pattern_types=("literal", "prefixed"))
    acl_add.add_argument("--operation", action="append", default=[], metavar="OPERATION",
                         help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                              "DescribeConfigs, AlterConfigs, IdempotentWrite, "
                              "TwoPhaseCommit or All (repeatable)")
    acl_add.add_argument("--producer", action="store_true",
                         help="Write, Describe and Create on the topics; Write and Describe "
                              "on the transactional ids; with --idempotent, IdempotentWrite "
                              "on the cluster")
    acl_add.add_argument("--consumer", action="store_true",
                         help="Read and Describe on the topics, Read on the groups")
    acl_add.add_argument("--idempotent", action="store_true",
                         help="with --producer: IdempotentWrite on the cluster")
    acl_list = acl_cmds.add_parser(
        "list", parents=[common], help="list ACL bindings (all, or those the options select)",
    )
    acl_list.add_argument("--principal", help="only this principal's bindings")
    _add_acl_resources(acl_list, pattern_types=("literal", "prefixed", "any", "match"),
                       default_pattern_type="any")
    acl_list.add_argument("--operation", help="only bindings of this operation")
    add_output_option(acl_list)
    acl_remove = acl_cmds.add_parser(
        "remove", parents=[common], help="remove the ACL bindings the options select",
        description="Removes the bindings of the named resources (--topic, --group, "
                    "--transactional-id, --cluster) that the other options select "
                    "(--allow-principal/--deny-principal, --operation, "
                    "--allow-host/--deny-host; none: every binding of the resources). "
                    "--resource-pattern-type match removes every binding that applies to "
                    "them, prefixes and '*' included.",
    )
    _add_acl_principals(acl_remove)
    _add_acl_resources(acl_remove, pattern_types=("literal", "prefixed", "any", "match"))
    acl_remove.add_argument("--operation", action="append", default=[], metavar="OPERATION",
                            help="only bindings of this operation (repeatable)")



def _add_acl_principals(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL",
                        help="e.g. User:alice, or User:* for everyone (repeatable)")
    parser.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL",
                        help="a principal to deny (repeatable); deny wins over allow")
    parser.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                        help="an IP address the allowed principals connect from "
                             "(repeatable; default: every host, *)")
    parser.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                        help="an IP address the denied principals connect from "
                             "(repeatable; default: every host, *)")


def _add_acl_resources(parser: argparse.ArgumentParser, *, pattern_types: tuple[str, ...],
                       default_pattern_type: str = "literal") -> None:
    parser.add_argument("--topic", action="append", default=[], help="a topic (repeatable)")
    parser.add_argument("--group", action="append", default=[],
                        help="a consumer group (repeatable)")
    parser.add_argument("--transactional-id", action="append", default=[],
                        help="a transactional id (repeatable)")
    parser.add_argument("--cluster", action="store_true",
                        help=f"the cluster ({ACL_CLUSTER_NAME})")
    parser.add_argument(
        "--resource-pattern-type", type=str.lower, choices=pattern_types,
        default=default_pattern_type,
        help=f"how the resource names select (default {default_pattern_type})")




# What --producer and --consumer grant, per resource type (kafka-acls.sh's).
_PRODUCER_OPERATIONS = {"topic": ("write", "describe", "create"),
                        "transactional_id": ("write", "describe")}
_CONSUMER_OPERATIONS = {"topic": ("read", "describe"), "group": ("read",)}


def _acl_resources(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(resource type, name) of every resource the options name."""
    resources = [("topic", name) for name in args.topic]
    resources += [("group", name) for name in args.group]
    resources += [("transactional_id", name) for name in args.transactional_id]
    if args.cluster:
        resources.append(("cluster", ACL_CLUSTER_NAME))
    return resources


def _acl_principals(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(principal, permission, host) for each principal and host given."""
    out = [(p, "allow", h) for p in args.allow_principal for h in args.allow_host or ["*"]]
    out += [(p, "deny", h) for p in args.deny_principal for h in args.deny_host or ["*"]]
    return out


def _acl_bindings_to_add(args: argparse.Namespace) -> list[AclBinding]:
    principals = _acl_principals(args)
    if not principals:
        raise UsageError("name who the ACLs are for: --allow-principal or --deny-principal "
                         "(e.g. User:alice)")
    resources = _acl_resources(args)
    if not resources:
        raise UsageError("name the resources: --topic, --group, --transactional-id or "
                         "--cluster")
    if not (args.operation or args.producer or args.consumer):
        raise UsageError("name the operations: --operation (repeatable), or --producer / "
                         "--consumer")
    if args.idempotent and not args.producer:
        raise UsageError("--idempotent goes with --producer")
    wanted: list[tuple[str, str, str]] = [  # (resource type, name, operation)
        (kind, name, operation) for kind, name in resources for operation in args.operation]
    for role, grants, needs in (
            ("--producer", _PRODUCER_OPERATIONS, "topic"),
            ("--consumer", _CONSUMER_OPERATIONS, "topic")):
        if not getattr(args, role.lstrip("-")):
            continue
        if not any(kind == needs for kind, _name in resources):
            raise UsageError(f"{role} needs --topic")
        if role == "--consumer" and not args.group:
            raise UsageError("--consumer needs --group (the consumer group to read as)")
        wanted += [(kind, name, operation) for kind, name in resources
                   for operation in grants.get(kind, ())]
    if args.producer and args.idempotent:
        wanted.append(("cluster", ACL_CLUSTER_NAME, "idempotent_write"))
    bindings: dict[AclBinding, None] = {}
    for principal, permission, host in principals:
        for kind, name, operation in wanted:
            pattern = "literal" if kind == "cluster" else args.resource_pattern_type
            bindings[AclBinding(principal=principal, resource_type=kind, resource_name=name,
                                pattern_type=pattern, operation=operation,
                                permission=permission, host=host)] = None
    return list(bindings)


def _acl_filters_to_remove(args: argparse.Namespace) -> list[AclFilter]:
    resources = _acl_resources(args)
    if not resources:
        raise UsageError("name the resources whose ACLs to remove: --topic, --group, "
                         "--transactional-id or --cluster")
    principals: list[tuple[str | None, str | None, str | None]] = [
        *_acl_principals(args)] or [(None, None, None)]
    operations: list[str | None] = [*args.operation] or [None]
    return [
        AclFilter(principal=principal, permission=permission,
                  host=None if host == "*" and not (args.allow_host or args.deny_host)
                  else host,
                  resource_type=kind, resource_name=name,
                  pattern_type=("literal" if kind == "cluster"
                                and args.resource_pattern_type in ("literal", "prefixed")
                                else args.resource_pattern_type),
                  operation=operation)
        for kind, name in resources
        for principal, permission, host in principals
        for operation in operations
    ]


def _acl_filters_to_list(args: argparse.Namespace) -> list[AclFilter]:
    resources: list[tuple[str | None, str | None]] = [*_acl_resources(args)] or [(None, None)]
    return [AclFilter(principal=args.principal, resource_type=kind, resource_name=name,
                      pattern_type=args.resource_pattern_type, operation=args.operation)
            for kind, name in resources]


def _acl_json(b: AclBinding) -> dict[str, Any]:
    return {"principal": b.principal, "permission": b.permission, "operation": b.operation,
            "host": b.host, "resource_type": b.resource_type,
            "resource_name": b.resource_name, "pattern_type": b.pattern_type}


def run_acls(args: argparse.Namespace) -> int:
    with admin_client(args) as admin, admin._within(args.timeout_ms):
        if args.action == "add":
            bindings = _acl_bindings_to_add(args)
            admin.create_acls(bindings)
            for binding in bindings:
                print(f"added {binding}")
        elif args.action == "list":
            found: dict[AclBinding, None] = {}
            for acl_filter in _acl_filters_to_list(args):
                found.update(dict.fromkeys(admin.describe_acls(acl_filter)))
            listed = list(found)
            if args.output == JSON:
                emit_json([_acl_json(b) for b in listed])
                return 0
            rows = [("principal", "permission", "operation", "host", "resource_type",
                     "pattern_type", "resource_name")]
            rows += [(b.principal, b.permission, b.operation, b.host, b.resource_type,
                      b.pattern_type, b.resource_name) for b in listed]
            print_table(rows)
        else:
            removed = admin.delete_acls(_acl_filters_to_remove(args))
            for binding in removed:
                print(f"removed {binding}")
            if not removed:
                print("no ACL binding matched; nothing removed")
    return 0

