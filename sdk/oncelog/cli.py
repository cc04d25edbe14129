"""The `oncelog` command: a local cluster, topics, and producing/consuming lines.

    oncelog cluster up --data-dir ./data [--port 9092]  # prints the bootstrap address
    oncelog cluster up --data-dir ./data --kafka        # and a Kafka bootstrap too
    export ONCELOG_BOOTSTRAP=127.0.0.1:PORT
    oncelog topics create payments --partitions 3 --config retention.ms=86400000
    oncelog topics list | describe payments | delete payments
    oncelog topics add-partitions payments --partitions 6
    printf 'a\\nb\\n' | oncelog produce payments
    oncelog produce payments --file lines.txt --parse-key --headers
    oncelog consume payments --from-beginning
    oncelog consume payments --group ledger --print partition,offset,key,value
    oncelog consume payments --output json --idle-timeout-ms 5000
    oncelog transactions list | describe copier-0 | abort copier-0
    oncelog transactions describe-producers payments 0
    oncelog transactions find-hanging [--max-timeout-ms N] [--topic T]
    oncelog transactions abort-hanging payments 0 4001
    oncelog groups list | describe ledger | offsets ledger | delete ledger
    oncelog groups reset-offsets ledger --to-earliest --topic payments [--execute]
    oncelog acls add --allow-principal User:alice --operation Write --topic payments
    oncelog acls list [--principal User:alice] [--topic payments] | remove ...

Every command that talks to a cluster takes --bootstrap (default: the
ONCELOG_BOOTSTRAP environment variable, else 127.0.0.1:9092, Kafka's usual
port) and --timeout-ms: how long it keeps trying to reach the cluster (a
topics, transactions or groups command as a whole; consume and produce, each
step of getting started). A failure prints one line naming the problem to
stderr and exits 1 (2 for bad usage, with the subcommand's usage and, for a
mistyped option or command, the closest valid one); when no cluster
answered, a second line says what to do about it. gRPC's own status text is
shown only with --verbose.

A secured cluster (docs/security.md): --security-protocol SSL|SASL_SSL,
--ssl-cafile, --ssl-certfile, --ssl-keyfile, --sasl-oauth-token-file; each
also from the environment (ONCELOG_SECURITY_PROTOCOL, ONCELOG_SSL_CAFILE,
...) or from a client properties file, --command-config FILE (Kafka's
name), with Kafka's property names (security.protocol, ssl.cafile, ...). A
flag wins over the environment, which wins over the file.

Every command that lists something takes --output table (the default) or
--output json (one JSON document on stdout; `consume`: one JSON object per
record and line). docs/cli.md describes the JSON shapes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import difflib
import fcntl
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from oncelog import __version__, errors
from oncelog._client import unreachable_addresses
from oncelog._security import OAUTHBEARER, SECURITY_PROTOCOLS, TokenFileProvider
from oncelog.admin import DEFAULT_MAX_TRANSACTION_TIMEOUT_MS, Admin
from oncelog.consumer import Consumer
from oncelog.producer import Producer
from oncelog.signals import stop_on_signals
from oncelog.types import (
    ACL_CLUSTER_NAME,
    AclBinding,
    AclFilter,
    ConsumerRecord,
    Header,
    RecordMetadata,
    TopicPartition,
)
from oncelog.wire.errors import ErrorCode
from oncelog_local.layout import PORTS_FILE, load_kept_ports

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP"
# How long a command waits for the cluster before giving up.
DEFAULT_TIMEOUT_MS = 15_000
# gRPC's status text inside an error message ("StatusCode.UNAVAILABLE: failed
# to connect to all addresses; ..."): shown only with --verbose.
_GRPC_STATUS = re.compile(r"StatusCode\.[A-Z_]+.*", re.DOTALL)

TABLE = "table"
JSON = "json"
TEXT = "text"
# What `consume --print` can name, in the order `--output json` prints them
# by default. "timestamp" is the JSON key "timestamp_ms".
CONSUME_FIELDS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")
# Kafka's console producer defaults (key.separator, headers.delimiter,
# headers.separator, headers.key.separator).
DEFAULT_KEY_SEPARATOR = "\t"
DEFAULT_HEADERS_DELIMITER = "\t"
DEFAULT_HEADERS_SEPARATOR = ","
DEFAULT_HEADERS_KEY_SEPARATOR = ":"
# In a cluster up data dir: the lock a running `cluster up` holds (the ports
# kept for the next start are oncelog_local.layout.PORTS_FILE).
LOCK_FILE = "cluster.lock"
# How often a running `cluster up` looks whether it was asked to stop.
STOP_POLL_INTERVAL_S = 0.1
# The progress line is redrawn at most this often.
PROGRESS_INTERVAL_S = 0.2
# A topics operation shows its elapsed time once it has taken this long.
WORKING_AFTER_S = 1.0

# The security settings: each flag's dest, its environment variable, and
# its name in a --command-config file (Kafka's property names).
SECURITY_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("security_protocol", "ONCELOG_SECURITY_PROTOCOL", "security.protocol"),
    ("ssl_cafile", "ONCELOG_SSL_CAFILE", "ssl.cafile"),
    ("ssl_certfile", "ONCELOG_SSL_CERTFILE", "ssl.certfile"),
    ("ssl_keyfile", "ONCELOG_SSL_KEYFILE", "ssl.keyfile"),
    ("sasl_oauth_token_file", "ONCELOG_SASL_OAUTH_TOKEN_FILE", "sasl.oauthbearer.token.file"),
)
COMMAND_CONFIG_ENV = "ONCELOG_COMMAND_CONFIG"
_PEM_TRUST = "JKS/PKCS12 truststores are not read: give ssl.cafile, the CA bundle as PEM"
_PEM_KEYS = "JKS/PKCS12 keystores are not read: give ssl.certfile and ssl.keyfile as PEM"
_TOKEN_FILE = "give the bearer token in a file: sasl.oauthbearer.token.file"
# Kafka client properties a --command-config file may hold that oncelog
# takes otherwise: refused with what to write instead.
_COMMAND_CONFIG_REFUSED = {
    "ssl.truststore.location": _PEM_TRUST,
    "ssl.truststore.password": _PEM_TRUST,
    "ssl.truststore.type": _PEM_TRUST,
    "ssl.keystore.location": _PEM_KEYS,
    "ssl.keystore.password": _PEM_KEYS,
    "ssl.keystore.type": _PEM_KEYS,
    "ssl.key.password": "encrypted keys are not read: give ssl.keyfile unencrypted (PEM)",
    "sasl.jaas.config": _TOKEN_FILE,
    "sasl.login.callback.handler.class": _TOKEN_FILE,
}


class CliError(Exception):
    """A problem to report in one line and exit 1."""


class UsageError(Exception):
    """Options that do not go together: the subcommand's usage, exit 2."""


class CliParser(argparse.ArgumentParser):
    """argparse with hints: a mistyped option or command is answered with the
    subcommand's usage, the error and the closest valid name ("did you
    mean"), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        lines = [f"{self.prog}: error: {message}", *self._hints(message)]
        self.exit(2, "\n".join(lines) + "\n")

    def _hints(self, message: str) -> list[str]:
        unrecognized = re.match(r"unrecognized arguments: (.*)", message)
        if unrecognized:
            options = sorted(o for o in self._option_string_actions if o.startswith("--"))
            hints = []
            for token in unrecognized.group(1).split():
                if not token.startswith("-"):
                    continue
                name = token.split("=", 1)[0]
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
                if close:
                    hints.append(f"{self.prog}: did you mean {close[0]} (not {name})?")
            return hints or [f"{self.prog}: `{self.prog} -h` lists its options"]
        choice = re.search(r"invalid choice: (.+?) \(choose from (.*)\)$", message)
        if choice:
            value = choice.group(1).strip("'\"")
            choices = [c.strip().strip("'\"") for c in choice.group(2).split(",")]
            close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
            if close:
                return [f"{self.prog}: did you mean {close[0]} (not {value})?"]
        return []


def parse_args(parser: argparse.ArgumentParser,
               argv: Sequence[str] | None) -> argparse.Namespace:
    """parser.parse_args, except that arguments no parser knew are reported
    by the subcommand they were given to (its usage, its options)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        leaf_parser(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def leaf_parser(parser: argparse.ArgumentParser,
                args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)subcommand that `args` ran, e.g. `topics list`'s."""
    current = parser
    while True:
        sub = next((a for a in current._actions
                    if isinstance(a, argparse._SubParsersAction)), None)
        name = None if sub is None else getattr(args, sub.dest, None)
        if sub is None or name not in sub.choices:
            return current
        current = sub.choices[name]


def leaf_commands(parser: argparse.ArgumentParser,
                  prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every runnable command path (("topics", "list"), ("produce",), ...)
    with its parser: what the tests enumerate."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return {prefix: parser}
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name, child in sub.choices.items():
        found.update(leaf_commands(child, (*prefix, name)))
    return found


def _add_connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--bootstrap and --timeout-ms, accepted before or after the subcommand:
    the subcommand's copies have no defaults, so they override the top-level
    ones only when given."""
    bootstrap_default = os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP)
    parser.add_argument(
        "--bootstrap", default=bootstrap_default if defaults else argparse.SUPPRESS,
        help=f"host:port of a partition store (env {BOOTSTRAP_ENV}; "
             f"default {bootstrap_default})",
    )
    parser.add_argument(
        "--timeout-ms", type=int, default=DEFAULT_TIMEOUT_MS if defaults else argparse.SUPPRESS,
        help=f"how long to keep trying to reach the cluster (default {DEFAULT_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--verbose", action="store_true", default=False if defaults else argparse.SUPPRESS,
        help="on failure, also print the errors behind it, gRPC's status text included",
    )
    security = parser.add_argument_group("security (a secured cluster; docs/security.md)")
    helps = {
        "security_protocol": "PLAINTEXT, SSL (TLS) or SASL_SSL (TLS and a bearer token); "
                             "default: SSL when a TLS file is given, SASL_SSL when a token "
                             "file is, else PLAINTEXT",
        "ssl_cafile": "the CA bundle (PEM) that signed the cluster's certificates",
        "ssl_certfile": "this client's certificate (PEM), for mutual TLS",
        "ssl_keyfile": "the private key (PEM) of --ssl-certfile",
        "sasl_oauth_token_file": "a file holding the bearer token (a JWT), read again for "
                                 "each new token",
    }
    for dest, env, _prop in SECURITY_SETTINGS:
        flag = "--" + dest.replace("_", "-")
        extra: dict[str, Any] = ({"type": str.upper, "choices": SECURITY_PROTOCOLS}
                                 if dest == "security_protocol" else {"metavar": "FILE"})
        default = (os.environ.get(env) or None) if defaults else argparse.SUPPRESS
        security.add_argument(flag, dest=dest, default=default,
                              help=f"{helps[dest]} (env {env})", **extra)
    security.add_argument(
        "--command-config", metavar="FILE",
        default=(os.environ.get(COMMAND_CONFIG_ENV) or None) if defaults else argparse.SUPPRESS,
        help="a client properties file (Kafka's): security.protocol, ssl.cafile, ssl.certfile, "
             f"ssl.keyfile, sasl.oauthbearer.token.file (env {COMMAND_CONFIG_ENV})",
    )


def _add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", choices=(TABLE, JSON), default=TABLE,
        help="table (default) or json: one JSON document, keys as in docs/cli.md",
    )


def build_parser() -> CliParser:
    """The whole command line (main uses it; tests enumerate its commands)."""
    common = CliParser(add_help=False)
    _add_connection_options(common, defaults=False)

    parser = CliParser(
        prog="oncelog", description="oncelog: a transactional, partitioned log.",
    )
    parser.add_argument("--version", action="version", version=f"oncelog {__version__}")
    _add_connection_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    _add_output_option(topic_list)
    describe = topic_cmds.add_parser(
        "describe", parents=[common], help="partitions, stores, offsets, configuration"
    )
    describe.add_argument("name")
    _add_output_option(describe)
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
    _add_output_option(moves)

    produce = commands.add_parser(
        "produce", parents=[common], help="send lines (stdin or --file) as records",
        description=(
            "Sends one record per input line: [HEADERS<TAB>][KEY<TAB>]VALUE, with the "
            "headers part only with --headers and the key part only with --parse-key or "
            "--key-separator (the separators are Kafka's console producer defaults). "
            "HEADERS is k1:v1,k2:v2 (a pair without ':' is a header with a null value; "
            "an empty part, no headers). On a terminal, stderr shows the progress."
        ),
    )
    produce.add_argument("topic")
    produce.add_argument("--file", help="read lines from this file instead of stdin")
    produce.add_argument("--parse-key", action="store_true",
                         help="each line is KEY<SEP>VALUE, SEP --key-separator (default tab)")
    produce.add_argument(
        "--key-separator", metavar="SEP",
        help="the key separator; implies --parse-key (split at the first SEP; default tab)",
    )
    produce.add_argument("--headers", action="store_true",
                         help="each line starts with HEADERS<DELIM> (Kafka's parse.headers)")
    produce.add_argument("--headers-delimiter", metavar="DELIM",
                         help="ends the headers part of a line (default tab)")
    produce.add_argument("--headers-separator", metavar="SEP",
                         help="separates header pairs (default ',')")
    produce.add_argument("--headers-key-separator", metavar="SEP",
                         help="separates a header's key from its value (default ':')")
    produce.add_argument("--partition", type=int, help="send every record to this partition")

    consume = commands.add_parser(
        "consume", parents=[common], help="print records, one per line",
        description=(
            "Prints records, one per line: their values, or the fields --print names. "
            "Without --from-beginning or --offset it starts at the beginning, or with "
            "--follow at the end (new records only). Without --follow it stops at the end "
            "offsets it saw when it started. With --group it reads as a member of that "
            "consumer group, from the group's committed offsets, and commits what it "
            "printed. On a terminal, with stdout redirected, stderr shows the progress."
        ),
    )
    consume.add_argument("topic")
    where = consume.add_mutually_exclusive_group()
    where.add_argument("--from-beginning", action="store_true",
                       help="start at the beginning (with --group: where the group has "
                            "no committed offset)")
    where.add_argument("--offset", type=int, help="start every partition read at this offset")
    consume.add_argument("--partition", type=int, help="read only this partition")
    consume.add_argument("--group", metavar="GROUP_ID",
                         help="read as a member of this consumer group and commit the "
                              "offsets of the printed records")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new records")
    consume.add_argument("--max-records", type=int, help="stop after this many records")
    consume.add_argument("--idle-timeout-ms", type=int, metavar="MS",
                         help="stop after this long without a record (Kafka's --timeout-ms)")
    consume.add_argument(
        "--isolation-level", choices=("read_committed", "read_uncommitted"),
        default="read_committed",
    )
    fields = consume.add_mutually_exclusive_group()
    fields.add_argument(
        "--print", metavar="FIELD,...", dest="print_fields",
        help=f"the fields to print, in this order, of {', '.join(CONSUME_FIELDS)} "
             "(default: value; with --output json, all)",
    )
    fields.add_argument("--print-key", action="store_true", help="the same as --print key,value")
    consume.add_argument("--key-separator", default=DEFAULT_KEY_SEPARATOR, metavar="SEP",
                         help="separates the printed fields (default: tab)")
    consume.add_argument("--output", choices=(TEXT, JSON), default=TEXT,
                         help="text (default) or json: one JSON object per record and line")

    txns = commands.add_parser(
        "transactions", help="list, describe and abort transactions; find hanging ones",
    )
    txn_cmds = txns.add_subparsers(dest="action", required=True, metavar="ACTION")
    txn_list = txn_cmds.add_parser("list", parents=[common],
                                   help="every transactional id the coordinators know")
    _add_output_option(txn_list)
    txn_describe = txn_cmds.add_parser(
        "describe", parents=[common],
        help="a transactional id's state, producer id/epoch and open transaction",
    )
    txn_describe.add_argument("transactional_id")
    _add_output_option(txn_describe)
    producers = txn_cmds.add_parser(
        "describe-producers", parents=[common],
        help="the producers active on a partition and their open transactions",
    )
    producers.add_argument("topic")
    producers.add_argument("partition", type=int)
    _add_output_option(producers)
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
    _add_output_option(hanging)
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

    groups = commands.add_parser(
        "groups", help="list and describe consumer groups; show, reset and delete their offsets",
    )
    group_cmds = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    group_list = group_cmds.add_parser("list", parents=[common],
                                       help="every group the group coordinators know")
    group_list.add_argument("--state", action="append", default=None,
                            help="only groups in this state (repeatable)")
    _add_output_option(group_list)
    group_describe = group_cmds.add_parser(
        "describe", parents=[common], help="a group's state, epoch, members and assignment",
    )
    group_describe.add_argument("group")
    _add_output_option(group_describe)
    group_offsets = group_cmds.add_parser(
        "offsets", parents=[common],
        help="committed offsets, end offsets (read_committed) and lag per partition",
    )
    group_offsets.add_argument("group")
    _add_output_option(group_offsets)
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
    _add_output_option(reset)
    group_delete = group_cmds.add_parser(
        "delete", parents=[common], help="delete an empty group and its offsets",
    )
    group_delete.add_argument("group")

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
    _add_output_option(acl_list)
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
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.timeout_ms <= 0:
        parser.error(f"--timeout-ms must be positive, got {args.timeout_ms}")
    verbose: bool = args.verbose
    bootstrap: str = args.bootstrap
    try:
        if args.command == "cluster":
            return _cluster_up(args)
        if args.command == "topics":
            return _topics(args)
        if args.command == "produce":
            return _produce(args)
        if args.command == "transactions":
            return _transactions(args)
        if args.command == "groups":
            return _groups(args)
        if args.command == "partitions":
            return _partitions(args)
        if args.command == "acls":
            return _acls(args)
        return _consume(args)
    except UsageError as exc:
        leaf_parser(parser, args).error(str(exc))
    except errors.OncelogError as exc:
        message = f"{type(exc).__name__}: {exc.message or exc.code.name}"
        if exc.code is ErrorCode.SASL_AUTHENTICATION_FAILED:
            message += (" (the CLI connects with --security-protocol, --ssl-cafile, "
                        "--ssl-certfile, --ssl-keyfile, --sasl-oauth-token-file or "
                        "--command-config FILE)")
        _fail(message, exc, verbose=verbose, bootstrap=bootstrap)
    except CliError as exc:
        _fail(str(exc), exc, verbose=verbose, bootstrap=bootstrap)
    except ValueError as exc:  # bad option values the SDK refuses (bootstrap, sizes)
        _fail(str(exc), exc, verbose=verbose, bootstrap=bootstrap)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        _silence_stdout()
        return 0
    return 1  # pragma: no cover - _fail exits


def _fail(message: str, exc: BaseException | None = None, *, verbose: bool,
          bootstrap: str = "") -> None:
    """Prints the error in one line, then what to do when a service did not
    answer; with verbose, every error behind it (raw gRPC status included),
    else no gRPC status text at all. Exits 1."""
    if not verbose:
        message = _GRPC_STATUS.sub(
            "the connection failed (--verbose shows gRPC's status)", message
        )
    print(f"oncelog: error: {' '.join(message.split())}", file=sys.stderr)
    unreachable = _unreachable(exc)
    bootstrap_addresses = {a.strip() for a in bootstrap.split(",")}
    if unreachable and bootstrap_addresses.intersection(unreachable):
        print(
            f"oncelog: no cluster answered at {bootstrap}. Start one with "
            f"`oncelog cluster up --data-dir DIR`, or point --bootstrap (or {BOOTSTRAP_ENV}) "
            f"at a running cluster.",
            file=sys.stderr,
        )
    elif unreachable:
        print(
            f"oncelog: the cluster at {bootstrap} answered, but its service at "
            f"{', '.join(unreachable)} did not: is it running, and not paused or overloaded?",
            file=sys.stderr,
        )
    if verbose:
        seen: set[int] = set()
        cause = None if exc is None else exc.__cause__ or exc.__context__
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            text = str(cause).replace("\n", "\n    ")
            print(f"  caused by {type(cause).__name__}: {text}", file=sys.stderr)
            cause = cause.__cause__ or cause.__context__
    sys.exit(1)


def _unreachable(exc: BaseException | None) -> tuple[str, ...]:
    """The addresses at which no service answered, if that is what `exc`
    (or an error behind it) says."""
    while exc is not None:
        addresses = unreachable_addresses(exc)
        if addresses:
            return addresses
        exc = exc.__cause__
    return ()


def _silence_stdout() -> None:
    # Python flushes stdout at exit; to a closed pipe that fails again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


# ---------------------------------------------------------------- output

def _emit_json(doc: object) -> None:
    """One JSON document on stdout (what `--output json` prints)."""
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _tp_json(tp: TopicPartition) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition}


def _bytes_json(doc: dict[str, Any], name: str, data: bytes | None) -> None:
    """doc[name]: the bytes as a UTF-8 string (None: null); bytes that are
    not UTF-8 are base64, flagged by doc[name + "_encoding"] = "base64"."""
    if data is None:
        doc[name] = None
        return
    try:
        doc[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        doc[name] = base64.b64encode(data).decode("ascii")
        doc[f"{name}_encoding"] = "base64"


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{nbytes} B"  # pragma: no cover - the loop returns


class _Progress:
    """One updating line on stderr while records flow: how many, their bytes
    (keys and values), the rate. Only on a terminal (`enabled`): piped or
    redirected runs get no noise. The last state stays on its own line."""

    def __init__(self, verb: str, *, enabled: bool) -> None:
        self.enabled = enabled
        self._verb = verb
        self._records = 0
        self._bytes = 0
        self._start_s = time.monotonic()
        self._next_draw_s = 0.0  # the first record draws at once

    def add(self, records: int, nbytes: int) -> None:
        if not self.enabled:
            return
        self._records += records
        self._bytes += nbytes
        now = time.monotonic()
        if now >= self._next_draw_s:
            self._draw(now)
            self._next_draw_s = now + PROGRESS_INTERVAL_S

    def finish(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, now: float) -> None:
        rate = self._records / max(now - self._start_s, 1e-3)
        # \r back to the line's start, \x1b[K clears what a longer line left.
        sys.stderr.write(f"\r{self._verb} {self._records} records, {_size(self._bytes)}, "
                         f"{rate:.0f} records/s\x1b[K")
        sys.stderr.flush()


@contextlib.contextmanager
def _working(label: str) -> Iterator[None]:
    """While a single long call runs (a topic of many partitions), a stderr
    line with the time it has taken so far, from WORKING_AFTER_S on and only
    on a terminal; cleared when the call returns."""
    if not sys.stderr.isatty():
        yield
        return
    done = threading.Event()
    drawn = threading.Event()
    start_s = time.monotonic()

    def tick() -> None:
        if done.wait(WORKING_AFTER_S):
            return
        while not done.is_set():
            sys.stderr.write(f"\r{label}: {time.monotonic() - start_s:.1f} s\x1b[K")
            sys.stderr.flush()
            drawn.set()
            done.wait(PROGRESS_INTERVAL_S)

    thread = threading.Thread(target=tick, name="oncelog-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn.is_set():
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


# --------------------------------------------------------------------- cluster

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


def _cluster_up(args: argparse.Namespace) -> int:
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
        counts = {"partition_store": stores, "coordinator": args.coordinators,
                  "group_coordinator": args.group_coordinators}
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
                security=security,
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


# --------------------------------------------------------------------- topics

def _admin(args: argparse.Namespace) -> Admin:
    return Admin(
        bootstrap=args.bootstrap, request_timeout_ms=args.timeout_ms,
        default_api_timeout_ms=args.timeout_ms, **client_security(args),
    )


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's security options from the flags, the environment (the
    flags' defaults) and --command-config, in that order of precedence.
    Without a protocol: SSL when a TLS file is given, SASL_SSL when a token
    file is, else PLAINTEXT."""
    values: dict[str, str | None] = {dest: getattr(args, dest, None)
                                     for dest, _env, _prop in SECURITY_SETTINGS}
    config_file = getattr(args, "command_config", None)
    if config_file:
        for dest, value in read_command_config(config_file).items():
            if values.get(dest) is None:
                values[dest] = value
    protocol = values.pop("security_protocol")
    token_file = values.pop("sasl_oauth_token_file")
    if protocol is None:
        protocol = ("SASL_SSL" if token_file else
                    "SSL" if any(values.values()) else "PLAINTEXT")
    options: dict[str, Any] = {"security_protocol": protocol.upper(),
                               **{k: v for k, v in values.items() if v}}
    if token_file:
        if not Path(token_file).is_file():
            raise CliError(f"--sasl-oauth-token-file: no such file {token_file!r}")
        options["sasl_mechanism"] = OAUTHBEARER
        options["sasl_oauth_token_provider"] = TokenFileProvider(token_file)
    return options


def read_command_config(path: str) -> dict[str, str]:
    """The security settings (by flag dest) of a client properties file:
    `key=value` (or `key: value`) lines, `#` and `!` comments, Kafka's
    property names. An unknown or unsupported property is an error naming it
    and its line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"--command-config: cannot read {path}: {exc.strerror or exc}") from None
    by_property = {prop: dest for dest, _env, prop in SECURITY_SETTINGS}
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if match is None:
            raise CliError(f"--command-config {path}:{number}: expected key=value, got {line!r}")
        key, value = match.group(1), match.group(2).strip()
        if key == "sasl.mechanism":
            if value.upper() != OAUTHBEARER:
                raise CliError(f"--command-config {path}:{number}: sasl.mechanism must be "
                               f"OAUTHBEARER (the only mechanism), got {value!r}")
            continue
        if key in _COMMAND_CONFIG_REFUSED:
            raise CliError(f"--command-config {path}:{number}: {key} is not supported: "
                           f"{_COMMAND_CONFIG_REFUSED[key]}")
        if key not in by_property:
            raise CliError(
                f"--command-config {path}:{number}: unknown property {key!r}; known: "
                f"{', '.join(by_property)}, sasl.mechanism")
        found[by_property[key]] = value
    return found


def _topics(args: argparse.Namespace) -> int:
    # --timeout-ms bounds the whole command, not each of its requests.
    with _admin(args) as admin, admin._within(args.timeout_ms):
        if args.action == "create":
            config = _parse_config(args.config)
            with _working(f"creating topic {args.name} ({args.partitions} partitions)"):
                admin.create_topic(args.name, partitions=args.partitions, config=config,
                                   replication_factor=args.replication_factor)
            print(f"created topic {args.name} with {args.partitions} partitions")
        elif args.action == "list":
            listed = sorted(admin.list_topics().items())
            if args.output == JSON:
                _emit_json([{"name": name, "partitions": count} for name, count in listed])
            else:
                for name, partitions in listed:
                    print(f"{name}\t{partitions}")
        elif args.action == "describe":
            with _working(f"describing topic {args.name}"):
                d = admin.describe_topic(args.name)
            if args.output == JSON:
                _emit_json({
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
            _print_table(rows)
        elif args.action == "add-partitions":
            with _working(f"growing topic {args.name} to {args.partitions} partitions"):
                admin.create_partitions({args.name: args.partitions},
                                        validate_only=args.validate_only)
            if args.validate_only:
                print(f"topic {args.name} can grow to {args.partitions} partitions "
                      "(validate only: nothing changed)")
            else:
                print(f"topic {args.name} now has {args.partitions} partitions")
        else:
            with _working(f"deleting topic {args.name}"):
                admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def _partitions(args: argparse.Namespace) -> int:
    with _admin(args) as admin, admin._within(args.timeout_ms):
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
                _emit_json([{**_tp_json(tp), "target_replicas": list(target)}
                            for tp, target in moves])
                return 0
            rows = [("topic", "partition", "target_replicas")]
            rows += [(tp.topic, str(tp.partition), ",".join(map(str, target)))
                     for tp, target in moves]
            _print_table(rows)
    return 0


def _parse_config(items: list[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--config takes KEY=VALUE, got {item!r}")
        config[key] = value
    return config


# --------------------------------------------------------------- transactions

def _transactions(args: argparse.Namespace) -> int:
    with _admin(args) as admin, admin._within(args.timeout_ms):
        rows: list[tuple[str, ...]]
        if args.action == "list":
            listed = admin.list_transactions()
            if args.output == JSON:
                _emit_json([{"transactional_id": t.transactional_id,
                             "producer_id": t.producer_id, "state": t.state} for t in listed])
                return 0
            rows = [("transactional_id", "producer_id", "state")]
            rows += [(t.transactional_id, str(t.producer_id), t.state) for t in listed]
            _print_table(rows)
        elif args.action == "describe":
            d = admin.describe_transaction(args.transactional_id)
            prepared = d.prepared_transaction
            if args.output == JSON:
                _emit_json({
                    "transactional_id": d.transactional_id, "state": d.state,
                    "producer_id": d.producer_id, "producer_epoch": d.producer_epoch,
                    "coordinator_epoch": d.coordinator_epoch,
                    "transaction_timeout_ms": d.transaction_timeout_ms,
                    "transaction_start_time_ms": d.transaction_start_time_ms,
                    "partitions": [_tp_json(tp) for tp in d.partitions],
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
            _check_partition(args.partition)
            states = admin.describe_producers(TopicPartition(args.topic, args.partition))
            if args.output == JSON:
                _emit_json([{
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
            _print_table(rows)
        elif args.action == "find-hanging":
            if args.max_timeout_ms <= 0:
                raise CliError("--max-timeout-ms must be positive")
            found = admin.find_hanging_transactions(
                max_transaction_timeout_ms=args.max_timeout_ms, topics=args.topic,
            )
            if args.output == JSON:
                _emit_json([{
                    **_tp_json(h.topic_partition), "producer_id": h.producer_id,
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
            _print_table(rows)
        elif args.action == "abort":
            d = admin.abort_transaction(args.transactional_id)
            print(f"aborted the open transaction of {d.transactional_id} "
                  f"(producer {d.producer_id}, now epoch {d.producer_epoch}, {d.state})")
        else:
            _check_partition(args.partition)
            admin.abort_hanging_transaction(
                TopicPartition(args.topic, args.partition), args.producer_id,
            )
            print(f"aborted the open transaction of producer {args.producer_id} on "
                  f"{args.topic}-{args.partition}")
    return 0


# --------------------------------------------------------------------- groups

def _groups(args: argparse.Namespace) -> int:
    with _admin(args) as admin, admin._within(args.timeout_ms):
        rows: list[tuple[str, ...]]
        if args.action == "list":
            listed = admin.list_groups(args.state)
            if args.output == JSON:
                _emit_json([{"group_id": g.group_id, "state": g.state} for g in listed])
                return 0
            rows = [("group_id", "state")]
            rows += [(g.group_id, g.state) for g in listed]
            _print_table(rows)
        elif args.action == "describe":
            d = admin.describe_group(args.group)
            if args.output == JSON:
                _emit_json({
                    "group_id": d.group_id, "state": d.state, "group_epoch": d.group_epoch,
                    "coordinator_epoch": d.coordinator_epoch,
                    "members": [{
                        "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "member_epoch": m.member_epoch,
                        "subscribed_topics": list(m.subscribed_topics),
                        "assignment": [_tp_json(tp) for tp in m.assignment],
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
            _print_table(rows)
        elif args.action == "offsets":
            owners = {tp: m.member_id for m in admin.describe_group(args.group).members
                      for tp in m.assignment}
            offsets = admin.list_group_offsets(args.group)
            if args.output == JSON:
                _emit_json([{
                    **_tp_json(tp), "committed_offset": o.offset, "end_offset": o.end_offset,
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
            _print_table(rows)
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
        _emit_json({
            "group_id": args.group, "executed": bool(args.execute),
            "offsets": [{**_tp_json(tp), "current_offset": old, "new_offset": offset}
                        for tp, old, offset in plan],
        })
        return
    rows = [("topic", "partition", "current_offset", "new_offset")]
    rows += [(tp.topic, str(tp.partition), "-" if old is None else str(old), str(offset))
             for tp, old, offset in plan]
    _print_table(rows)
    if args.execute:
        print(f"reset {len(new)} offsets of group {args.group}")
    else:
        print(f"plan only: nothing committed for group {args.group} (--execute commits it)")


# ----------------------------------------------------------------------- acls

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


def _acls(args: argparse.Namespace) -> int:
    with _admin(args) as admin, admin._within(args.timeout_ms):
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
                _emit_json([_acl_json(b) for b in listed])
                return 0
            rows = [("principal", "permission", "operation", "host", "resource_type",
                     "pattern_type", "resource_name")]
            rows += [(b.principal, b.permission, b.operation, b.host, b.resource_type,
                      b.pattern_type, b.resource_name) for b in listed]
            _print_table(rows)
        else:
            removed = admin.delete_acls(_acl_filters_to_remove(args))
            for binding in removed:
                print(f"removed {binding}")
            if not removed:
                print("no ACL binding matched; nothing removed")
    return 0


def _check_partition(partition: int) -> None:
    if partition < 0:
        raise CliError(f"partition must be >= 0, got {partition}")


# --------------------------------------------------------------------- produce

def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        yield line[:-1] if line.endswith(b"\n") else line


def _separator(option: str, given: str | None, default: str) -> bytes:
    value = default if given is None else given
    if value == "":
        raise UsageError(f"{option} must not be empty")
    return value.encode()


class _LineFormat:
    """How `produce` splits a line: [HEADERS<delim>][KEY<sep>]VALUE."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.parse_key = args.parse_key or args.key_separator is not None
        self.key_separator = _separator("--key-separator", args.key_separator,
                                        DEFAULT_KEY_SEPARATOR)
        self.headers = args.headers
        headers_options = (
            ("--headers-delimiter", args.headers_delimiter, DEFAULT_HEADERS_DELIMITER),
            ("--headers-separator", args.headers_separator, DEFAULT_HEADERS_SEPARATOR),
            ("--headers-key-separator", args.headers_key_separator,
             DEFAULT_HEADERS_KEY_SEPARATOR),
        )
        if not self.headers:
            given = [option for option, value, _default in headers_options if value is not None]
            if given:
                raise UsageError(f"{', '.join(given)} needs --headers")
        self.headers_delimiter, self.headers_separator, self.headers_key_separator = (
            _separator(option, value, default) for option, value, default in headers_options
        )

    def split(self, line: bytes, number: int) -> tuple[list[Header] | None, bytes | None, bytes]:
        """(headers, key, value) of input line `number`; CliError naming the
        line when it lacks a separator it must have."""
        headers: list[Header] | None = None
        if self.headers:
            part, sep, line = line.partition(self.headers_delimiter)
            if not sep:
                raise CliError(f"line {number} has no headers delimiter "
                               f"{self.headers_delimiter.decode()!r}")
            headers = self._headers(part, number)
        key = None
        if self.parse_key:
            key, sep, line = line.partition(self.key_separator)
            if not sep:
                raise CliError(f"line {number} has no key separator "
                               f"{self.key_separator.decode()!r}")
        return headers, key, line

    def _headers(self, part: bytes, number: int) -> list[Header]:
        headers: list[Header] = []
        if not part:
            return headers
        for pair in part.split(self.headers_separator):
            raw_key, sep, value = pair.partition(self.headers_key_separator)
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                raise CliError(f"line {number}: header key {raw_key!r} is not UTF-8") from None
            if not key:
                raise CliError(f"line {number}: a header without a key in {part!r}")
            headers.append((key, value if sep else None))
        return headers


def _produce(args: argparse.Namespace) -> int:
    line_format = _LineFormat(args)
    failures: list[BaseException] = []
    lock = threading.Lock()

    def on_done(fut: Future[RecordMetadata]) -> None:
        exc = fut.exception()
        if exc is not None:
            with lock:
                failures.append(exc)

    count = 0
    stream: BinaryIO
    if args.file:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc.strerror}") from exc
    else:
        stream = sys.stdin.buffer
    # Someone typing lines at a terminal needs no progress line over them.
    progress = _Progress("sent", enabled=sys.stderr.isatty()
                         and (bool(args.file) or not sys.stdin.isatty()))
    try:
        with Producer(
            bootstrap=args.bootstrap, request_timeout_ms=args.timeout_ms,
            delivery_timeout_ms=max(args.timeout_ms, 1_000), max_block_ms=args.timeout_ms,
            **client_security(args),
        ) as producer:
            for number, line in enumerate(_lines(stream), start=1):
                try:
                    headers, key, value = line_format.split(line, number)
                except CliError as exc:
                    producer.flush()
                    raise CliError(f"{exc}; {count - len(failures)} records were produced "
                                   "before it") from None
                producer.send(args.topic, value=value, key=key, partition=args.partition,
                              headers=headers).add_done_callback(on_done)
                count += 1
                progress.add(1, len(value) + len(key or b""))
                if failures:
                    break
            producer.flush()
    finally:
        progress.finish()
        if args.file:
            stream.close()
    if failures:
        first = failures[0]
        name = type(first).__name__
        detail = first.message if isinstance(first, errors.OncelogError) else str(first)
        raise CliError(
            f"{len(failures)} of {count} records failed; first: {name}: {detail}"
        ) from first
    print(f"{count} records produced to {args.topic}")
    return 0


# --------------------------------------------------------------------- consume

def _consume_fields(args: argparse.Namespace) -> tuple[str, ...]:
    if args.print_key:
        return ("key", "value")
    if args.print_fields is None:
        return CONSUME_FIELDS if args.output == JSON else ("value",)
    fields = tuple(name.strip() for name in args.print_fields.split(","))
    unknown = [name for name in fields if name not in CONSUME_FIELDS]
    if unknown or not fields:
        raise UsageError(f"--print takes fields of {', '.join(CONSUME_FIELDS)}, "
                         f"comma-separated; got {args.print_fields!r}")
    if len(set(fields)) != len(fields):
        raise UsageError(f"--print names a field twice: {args.print_fields!r}")
    return fields


def _record_text(record: ConsumerRecord, fields: Sequence[str], separator: bytes) -> bytes:
    """The record's fields as a line: numbers in decimal, null key or value
    as `null`, headers as k1:v1,k2:v2 (a null value: the key alone)."""
    parts: list[bytes] = []
    for name in fields:
        if name == "topic":
            parts.append(record.topic.encode())
        elif name in ("partition", "offset"):
            parts.append(str(getattr(record, name)).encode())
        elif name == "timestamp":
            parts.append(str(record.timestamp_ms).encode())
        elif name == "headers":
            parts.append(b",".join(key.encode() + (b"" if value is None else b":" + value)
                                   for key, value in record.headers))
        else:
            data = getattr(record, name)
            parts.append(b"null" if data is None else data)
    return separator.join(parts) + b"\n"


def _record_json(record: ConsumerRecord, fields: Sequence[str]) -> bytes:
    """The record's fields as one line of JSON (docs/cli.md: key, value and
    header values are UTF-8 text, or base64 flagged by `<name>_encoding`)."""
    doc: dict[str, Any] = {}
    for name in fields:
        if name in ("topic", "partition", "offset"):
            doc[name] = getattr(record, name)
        elif name == "timestamp":
            doc["timestamp_ms"] = record.timestamp_ms
        elif name == "headers":
            headers = []
            for key, value in record.headers:
                header: dict[str, Any] = {"key": key}
                _bytes_json(header, "value", value)
                headers.append(header)
            doc["headers"] = headers
        else:
            _bytes_json(doc, name, getattr(record, name))
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


def _consume(args: argparse.Namespace) -> int:
    if args.max_records is not None and args.max_records < 0:
        raise CliError("--max-records must be >= 0")
    if args.offset is not None and args.offset < 0:
        raise CliError("--offset must be >= 0")
    if args.idle_timeout_ms is not None and args.idle_timeout_ms <= 0:
        raise UsageError(f"--idle-timeout-ms must be positive, got {args.idle_timeout_ms}")
    if args.group is not None and (args.offset is not None or args.partition is not None):
        raise UsageError("--group reads from the group's committed offsets, on the partitions "
                         "the group assigns: it takes neither --offset nor --partition")
    fields = _consume_fields(args)
    separator = args.key_separator.encode()
    render: Callable[[ConsumerRecord], bytes] = (
        (lambda record: _record_json(record, fields)) if args.output == JSON
        else (lambda record: _record_text(record, fields, separator))
    )
    out = sys.stdout.buffer
    # Records printed to the terminal would scroll the progress line away.
    progress = _Progress("read", enabled=sys.stderr.isatty() and not sys.stdout.isatty())
    if args.offset is not None:
        reset = "none"  # an --offset outside the log is an error, not a silent jump
    elif args.follow and not args.from_beginning:
        reset = "latest"
    else:
        reset = "earliest"
    printed = 0
    with Consumer(
        bootstrap=args.bootstrap, group_id=args.group, isolation_level=args.isolation_level,
        request_timeout_ms=args.timeout_ms, default_api_timeout_ms=args.timeout_ms,
        auto_offset_reset=reset, **client_security(args),
    ) as consumer:
        partitions = consumer.partitions_for_topic(args.topic)
        # Without --follow: where to stop, per partition read (with --group
        # found when the group assigns the partition).
        ends: dict[TopicPartition, int] | None = None if args.follow else {}
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            tps = _assign(consumer, args, partitions)
            if ends is not None:
                ends.update(consumer.end_offsets(tps))
        idle_s = None if args.idle_timeout_ms is None else args.idle_timeout_ms / 1000
        last_record_s = time.monotonic()
        joined = args.group is None
        try:
            with stop_on_signals() as stop:
                while (args.max_records is None or printed < args.max_records) \
                        and not stop.is_set():
                    if not joined and consumer.assignment():
                        # Joining the group is not idling: the clock starts
                        # again with the first assignment (and runs out
                        # anyway for a member that never gets one).
                        joined = True
                        last_record_s = time.monotonic()
                    if ends is not None and _at_ends(consumer, ends):
                        break
                    poll_s = 0.5
                    if idle_s is not None:
                        left_s = last_record_s + idle_s - time.monotonic()
                        if left_s <= 0:
                            break
                        poll_s = min(poll_s, left_s)
                    done: dict[TopicPartition, int] = {}
                    for record in consumer.poll(timeout=poll_s):
                        tp = TopicPartition(record.topic, record.partition)
                        if ends is not None:
                            if tp not in ends:  # assigned during this poll
                                ends.update(consumer.end_offsets([tp]))
                            if record.offset >= ends[tp]:
                                continue
                        out.write(render(record))
                        printed += 1
                        done[tp] = record.offset + 1
                        progress.add(1, len(record.value or b"") + len(record.key or b""))
                        if args.max_records is not None and printed >= args.max_records:
                            break
                    out.flush()
                    if done:
                        last_record_s = time.monotonic()
                        if args.group is not None:
                            consumer.commit(done)
        finally:
            progress.finish()
        out.flush()
    return 0


def _assign(consumer: Consumer, args: argparse.Namespace,
            partitions: set[int]) -> list[TopicPartition]:
    """Assigns the partitions to read (all, or --partition) and seeks to
    where reading starts; returns them."""
    if args.partition is not None:
        if args.partition not in partitions:
            raise CliError(
                f"topic {args.topic} has partitions 0..{len(partitions) - 1}, "
                f"no partition {args.partition}"
            )
        partitions = {args.partition}
    tps = [TopicPartition(args.topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    if args.offset is not None:
        earliest = consumer.beginning_offsets(tps)
        latest = consumer.end_offsets(tps)
        for tp in tps:
            if not earliest[tp] <= args.offset <= latest[tp]:
                raise CliError(
                    f"offset {args.offset} is outside partition {tp.partition} of "
                    f"{args.topic}, which holds offsets {earliest[tp]}..{latest[tp] - 1}"
                )
            consumer.seek(tp, args.offset)
    elif args.from_beginning or not args.follow:
        consumer.seek_to_beginning(tps)
    else:
        consumer.seek_to_end(tps)
    return tps


def _at_ends(consumer: Consumer, ends: dict[TopicPartition, int]) -> bool:
    """Whether every partition read now has reached its end (fetching the
    end of a partition a group has just assigned)."""
    assigned = consumer.assignment()
    if not assigned:
        return False  # a group member before its first assignment
    new = [tp for tp in assigned if tp not in ends]
    if new:
        ends.update(consumer.end_offsets(new))
    return all(consumer.position(tp) >= ends[tp] for tp in assigned)


if __name__ == "__main__":
    sys.exit(main())
