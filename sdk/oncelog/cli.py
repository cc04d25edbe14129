"""The `oncelog` command: a local cluster, topics, and producing/consuming lines.

    oncelog cluster up --data-dir ./data            # prints the bootstrap address
    export ONCELOG_BOOTSTRAP=127.0.0.1:PORT
    oncelog topics create payments --partitions 3 --config retention.ms=86400000
    oncelog topics list | describe payments | delete payments
    printf 'a\\nb\\n' | oncelog produce payments
    oncelog consume payments --from-beginning
    oncelog transactions list | describe copier-0 | abort copier-0
    oncelog transactions describe-producers payments 0
    oncelog transactions find-hanging [--max-timeout-ms N] [--topic T]
    oncelog transactions abort-hanging payments 0 4001
    oncelog groups list | describe ledger | offsets ledger | delete ledger
    oncelog groups reset-offsets ledger --to-earliest --topic payments [--dry-run]

Every command that talks to a cluster takes --bootstrap (default: the
ONCELOG_BOOTSTRAP environment variable, else 127.0.0.1:9092, Kafka's usual
port) and --timeout-ms: how long it keeps trying to reach the cluster (a
topics, transactions or groups command as a whole; consume and produce, each
step of getting started). A failure prints one line naming the problem to
stderr and exits 1 (2 for bad usage); when no cluster answered, a second line
says what to do about it. gRPC's own status text is shown only with
--verbose.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import BinaryIO

from oncelog import __version__, errors
from oncelog._client import unreachable_addresses
from oncelog.admin import DEFAULT_MAX_TRANSACTION_TIMEOUT_MS, Admin
from oncelog.consumer import Consumer
from oncelog.producer import Producer
from oncelog.types import RecordMetadata, TopicPartition

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "ONCELOG_BOOTSTRAP"
# How long a command waits for the cluster before giving up.
DEFAULT_TIMEOUT_MS = 15_000
# gRPC's status text inside an error message ("StatusCode.UNAVAILABLE: failed
# to connect to all addresses; ..."): shown only with --verbose.
_GRPC_STATUS = re.compile(r"StatusCode\.[A-Z_]+.*", re.DOTALL)


class CliError(Exception):
    """A problem to report in one line and exit 1."""


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


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_connection_options(common, defaults=False)

    parser = argparse.ArgumentParser(
        prog="oncelog", description="oncelog: a transactional, partitioned log.",
    )
    parser.add_argument("--version", action="version", version=f"oncelog {__version__}")
    _add_connection_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cluster = commands.add_parser("cluster", help="run a local cluster")
    cluster_cmds = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = cluster_cmds.add_parser(
        "up", help="start a cluster on this machine in the foreground (Ctrl-C stops it)"
    )
    up.add_argument("--data-dir", required=True, help="where the services keep their data")
    up.add_argument("--partition-stores", type=int, default=1)
    up.add_argument("--coordinators", type=int, default=1)
    up.add_argument("--group-coordinators", type=int, default=1)

    topics = commands.add_parser("topics", help="create, list, describe, delete topics")
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
    topic_cmds.add_parser("list", parents=[common], help="list user topics")
    describe = topic_cmds.add_parser(
        "describe", parents=[common], help="partitions, stores, offsets, configuration"
    )
    describe.add_argument("name")
    delete = topic_cmds.add_parser("delete", parents=[common], help="delete a topic")
    delete.add_argument("name")

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
    partition_cmds.add_parser("list-reassignments", parents=[common],
                              help="moves in progress")

    produce = commands.add_parser(
        "produce", parents=[common], help="send lines (stdin or --file) as records",
    )
    produce.add_argument("topic")
    produce.add_argument("--file", help="read lines from this file instead of stdin")
    produce.add_argument(
        "--key-separator", metavar="SEP",
        help="each line is KEY<SEP>VALUE (split at the first SEP)",
    )
    produce.add_argument("--partition", type=int, help="send every record to this partition")

    consume = commands.add_parser(
        "consume", parents=[common], help="print record values, one per line",
        description=(
            "Prints record values, one per line. Without --from-beginning or --offset it "
            "starts at the beginning, or with --follow at the end (new records only). "
            "Without --follow it stops at the end offsets it saw when it started."
        ),
    )
    consume.add_argument("topic")
    where = consume.add_mutually_exclusive_group()
    where.add_argument("--from-beginning", action="store_true")
    where.add_argument("--offset", type=int, help="start every partition read at this offset")
    consume.add_argument("--partition", type=int, help="read only this partition")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new records")
    consume.add_argument("--max-records", type=int, help="stop after this many records")
    consume.add_argument(
        "--isolation-level", choices=("read_committed", "read_uncommitted"),
        default="read_committed",
    )
    consume.add_argument("--print-key", action="store_true", help="print KEY<SEP>VALUE")
    consume.add_argument("--key-separator", default="\t", metavar="SEP",
                         help="separator for --print-key (default: tab)")

    txns = commands.add_parser(
        "transactions", help="list, describe and abort transactions; find hanging ones",
    )
    txn_cmds = txns.add_subparsers(dest="action", required=True, metavar="ACTION")
    txn_cmds.add_parser("list", parents=[common],
                        help="every transactional id the coordinators know")
    txn_describe = txn_cmds.add_parser(
        "describe", parents=[common],
        help="a transactional id's state, producer id/epoch and open transaction",
    )
    txn_describe.add_argument("transactional_id")
    producers = txn_cmds.add_parser(
        "describe-producers", parents=[common],
        help="the producers active on a partition and their open transactions",
    )
    producers.add_argument("topic")
    producers.add_argument("partition", type=int)
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
    group_describe = group_cmds.add_parser(
        "describe", parents=[common], help="a group's state, epoch, members and assignment",
    )
    group_describe.add_argument("group")
    group_offsets = group_cmds.add_parser(
        "offsets", parents=[common],
        help="committed offsets, end offsets (read_committed) and lag per partition",
    )
    group_offsets.add_argument("group")
    reset = group_cmds.add_parser(
        "reset-offsets", parents=[common],
        help="move an empty group's committed offsets",
        description=(
            "Moves the committed offsets of a group without members. Say where (one of "
            "--to-earliest, --to-latest, --to-offset, --to-timestamp-ms) and which partitions "
            "(--topic, repeatable, or --all-topics: every partition with a committed offset)."
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
    reset.add_argument("--dry-run", action="store_true",
                       help="print the new offsets without committing them")
    group_delete = group_cmds.add_parser(
        "delete", parents=[common], help="delete an empty group and its offsets",
    )
    group_delete.add_argument("group")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
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
        return _consume(args)
    except errors.OncelogError as exc:
        _fail(f"{type(exc).__name__}: {exc.message or exc.code.name}", exc,
              verbose=verbose, bootstrap=bootstrap)
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


# --------------------------------------------------------------------- cluster

@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set an event instead of raising KeyboardInterrupt in the
    middle of SDK code (which could leave a client half-way through a call
    and hang its close())."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _cluster_up(args: argparse.Namespace) -> int:
    from oncelog.testing import LocalCluster  # lazily: it pulls in process management

    with _stop_on_signals() as stop:
        try:
            cluster = LocalCluster(
                args.data_dir, partition_stores=args.partition_stores,
                coordinators=args.coordinators, group_coordinators=args.group_coordinators,
            )
        except (RuntimeError, TimeoutError) as exc:
            raise CliError(f"the cluster did not start: {exc}") from exc
        try:
            print(f"oncelog cluster up; bootstrap {cluster.bootstrap}", flush=True)
            print(f"export {BOOTSTRAP_ENV}={cluster.bootstrap}", flush=True)
            for kind in sorted(cluster.missing_kinds):
                print(f"note: this version has no {kind} service; left out", flush=True)
            print("Ctrl-C stops it.", flush=True)
            stop.wait()
        finally:
            print("stopping...", file=sys.stderr, flush=True)
            cluster.stop()
    return 0


# --------------------------------------------------------------------- topics

def _admin(args: argparse.Namespace) -> Admin:
    return Admin(
        bootstrap=args.bootstrap, request_timeout_ms=args.timeout_ms,
        default_api_timeout_ms=args.timeout_ms,
    )


def _topics(args: argparse.Namespace) -> int:
    # --timeout-ms bounds the whole command, not each of its requests.
    with _admin(args) as admin, admin._within(args.timeout_ms):
        if args.action == "create":
            config = _parse_config(args.config)
            admin.create_topic(args.name, partitions=args.partitions, config=config,
                               replication_factor=args.replication_factor)
            print(f"created topic {args.name} with {args.partitions} partitions")
        elif args.action == "list":
            for name, partitions in sorted(admin.list_topics().items()):
                print(f"{name}\t{partitions}")
        elif args.action == "describe":
            d = admin.describe_topic(args.name)
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
        else:
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
            rows = [("topic", "partition", "target_replicas")]
            rows += [(tp.topic, str(tp.partition), ",".join(map(str, target)))
                     for tp, target in sorted(admin.list_partition_reassignments().items())]
            _print_table(rows)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


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
            rows = [("transactional_id", "producer_id", "state")]
            rows += [(t.transactional_id, str(t.producer_id), t.state)
                     for t in admin.list_transactions()]
            _print_table(rows)
        elif args.action == "describe":
            d = admin.describe_transaction(args.transactional_id)
            print(f"transactional_id {d.transactional_id}")
            print(f"state {d.state}")
            print(f"producer_id {d.producer_id}  producer_epoch {d.producer_epoch}  "
                  f"coordinator_epoch {d.coordinator_epoch}")
            print(f"transaction_timeout_ms {d.transaction_timeout_ms}  "
                  f"transaction_start_time_ms {d.transaction_start_time_ms}")
            parts = " ".join(f"{tp.topic}-{tp.partition}" for tp in d.partitions)
            print(f"partitions {parts or '-'}")
            if d.two_phase_commit:
                prepared = d.prepared_transaction
                print("two_phase_commit yes  prepared_transaction "
                      f"{'-' if prepared is None else prepared}")
        elif args.action == "describe-producers":
            _check_partition(args.partition)
            states = admin.describe_producers(TopicPartition(args.topic, args.partition))
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
            rows = [("group_id", "state")]
            rows += [(g.group_id, g.state) for g in admin.list_groups(args.state)]
            _print_table(rows)
        elif args.action == "describe":
            d = admin.describe_group(args.group)
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
            rows = [("topic", "partition", "committed", "end", "lag", "member_id")]
            rows += [
                (tp.topic, str(tp.partition), str(o.offset),
                 "-" if o.end_offset is None else str(o.end_offset),
                 "-" if o.lag is None else str(o.lag), owners.get(tp, "-"))
                for tp, o in admin.list_group_offsets(args.group).items()
            ]
            _print_table(rows)
        elif args.action == "reset-offsets":
            _reset_group_offsets(admin, args)
        else:
            admin.delete_group(args.group)
            print(f"deleted group {args.group}")
    return 0


def _reset_group_offsets(admin: Admin, args: argparse.Namespace) -> None:
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
    new = admin.reset_group_offsets(
        args.group, partitions,
        to="earliest" if args.to_earliest else "latest" if args.to_latest else None,
        offset=args.to_offset, timestamp_ms=args.to_timestamp_ms, dry_run=args.dry_run,
    )
    rows = [("topic", "partition", "new_offset")]
    rows += [(tp.topic, str(tp.partition), str(offset)) for tp, offset in sorted(new.items())]
    _print_table(rows)
    if args.dry_run:
        print(f"dry run: nothing committed for group {args.group}")
    else:
        print(f"reset {len(new)} offsets of group {args.group}")


def _check_partition(partition: int) -> None:
    if partition < 0:
        raise CliError(f"partition must be >= 0, got {partition}")


# --------------------------------------------------------------------- produce

def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        yield line[:-1] if line.endswith(b"\n") else line


def _produce(args: argparse.Namespace) -> int:
    separator = None if args.key_separator is None else args.key_separator.encode()
    if separator == b"":
        raise CliError("--key-separator must not be empty")
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
    try:
        with Producer(
            bootstrap=args.bootstrap, request_timeout_ms=args.timeout_ms,
            delivery_timeout_ms=max(args.timeout_ms, 1_000), max_block_ms=args.timeout_ms,
        ) as producer:
            for number, line in enumerate(_lines(stream), start=1):
                key = None
                value = line
                if separator is not None:
                    key, sep, value = line.partition(separator)
                    if not sep:
                        producer.flush()
                        raise CliError(
                            f"line {number} has no key separator {args.key_separator!r}; "
                            f"{count - len(failures)} records were produced before it"
                        )
                producer.send(args.topic, value=value, key=key,
                              partition=args.partition).add_done_callback(on_done)
                count += 1
                if failures:
                    break
            producer.flush()
    finally:
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

def _consume(args: argparse.Namespace) -> int:
    if args.max_records is not None and args.max_records < 0:
        raise CliError("--max-records must be >= 0")
    if args.offset is not None and args.offset < 0:
        raise CliError("--offset must be >= 0")
    out = sys.stdout.buffer
    key_separator = args.key_separator.encode()
    printed = 0
    with Consumer(
        bootstrap=args.bootstrap, isolation_level=args.isolation_level,
        request_timeout_ms=args.timeout_ms, default_api_timeout_ms=args.timeout_ms,
        # An --offset outside the log is an error to report, not a silent jump.
        auto_offset_reset="none" if args.offset is not None else "earliest",
    ) as consumer:
        partitions = consumer.partitions_for_topic(args.topic)
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
        ends = None if args.follow else consumer.end_offsets(tps)
        with _stop_on_signals() as stop:
            while (args.max_records is None or printed < args.max_records) and not stop.is_set():
                if ends is not None and all(consumer.position(tp) >= ends[tp] for tp in tps):
                    break
                for record in consumer.poll(timeout=0.5):
                    if ends is not None and record.offset >= ends[
                        TopicPartition(record.topic, record.partition)
                    ]:
                        continue
                    value = b"null" if record.value is None else record.value
                    if args.print_key:
                        key = b"null" if record.key is None else record.key
                        out.write(key + key_separator + value + b"\n")
                    else:
                        out.write(value + b"\n")
                    printed += 1
                    if args.max_records is not None and printed >= args.max_records:
                        break
                out.flush()
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
