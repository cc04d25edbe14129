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

from collections.abc import Sequence

from oncelog import __version__, errors
from oncelog.cli import acls, cluster, groups, records, topics, transactions
from oncelog.cli._common import (
    CliError,
    CliParser,
    UsageError,
    add_connection_options,
    client_security,
    fail,
    leaf_commands,
    leaf_parser,
    parse_args,
    read_command_config,
    silence_stdout,
)
from oncelog.cli.acls import run_acls
from oncelog.cli.cluster import run_cluster_up
from oncelog.cli.groups import run_groups
from oncelog.cli.records import run_consume, run_produce
from oncelog.cli.topics import run_partitions, run_topics
from oncelog.cli.transactions import run_transactions
from oncelog.wire.errors import ErrorCode

# What scripts and tests import from here; the rest lives in the command
# modules (one per command group) and _common.py.
__all__ = ["CliError", "UsageError", "build_parser", "client_security", "leaf_commands", "main",
           "parse_args", "read_command_config"]


def build_parser() -> CliParser:
    """The whole command line (main uses it; tests enumerate its commands)."""
    common = CliParser(add_help=False)
    add_connection_options(common, defaults=False)

    parser = CliParser(
        prog="oncelog", description="oncelog: a transactional, partitioned log.",
    )
    parser.add_argument("--version", action="version", version=f"oncelog {__version__}")
    add_connection_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command_group in (cluster, topics, records, transactions, groups, acls):
        command_group.add_parser(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.timeout_ms <= 0:
        parser.error(f"--timeout-ms must be positive, got {args.timeout_ms}")
    verbose: bool = args.verbose
    bootstrap: str = args.bootstrap
    try:
        if args.command == "cluster":
            return run_cluster_up(args)
        if args.command == "topics":
            return run_topics(args)
        if args.command == "produce":
            return run_produce(args)
        if args.command == "transactions":
            return run_transactions(args)
        if args.command == "groups":
            return run_groups(args)
        if args.command == "partitions":
            return run_partitions(args)
        if args.command == "acls":
            return run_acls(args)
        return run_consume(args)
    except UsageError as exc:
        leaf_parser(parser, args).error(str(exc))
    except errors.OncelogError as exc:
        message = f"{type(exc).__name__}: {exc.message or exc.code.name}"
        if exc.code is ErrorCode.SASL_AUTHENTICATION_FAILED:
            message += (" (the CLI connects with --security-protocol, --ssl-cafile, "
                        "--ssl-certfile, --ssl-keyfile, --sasl-oauth-token-file or "
                        "--command-config FILE)")
        fail(message, exc, verbose=verbose, bootstrap=bootstrap)
    except CliError as exc:
        fail(str(exc), exc, verbose=verbose, bootstrap=bootstrap)
    except ValueError as exc:  # bad option values the SDK refuses (bootstrap, sizes)
        fail(str(exc), exc, verbose=verbose, bootstrap=bootstrap)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        silence_stdout()
        return 0
    return 1  # pragma: no cover - fail exits

