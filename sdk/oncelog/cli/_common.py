"""What every `oncelog` command shares: errors, the parser class, connection
and security options, output helpers (tables, JSON, progress)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import difflib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from oncelog import config_def
from oncelog._client import unreachable_addresses
from oncelog.admin import Admin
from oncelog.types import (
    TopicPartition,
)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = config_def.BOOTSTRAP_ENV
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
# its name in a --command-config file (Kafka's property names), from the
# clients' options table.
SECURITY_SETTINGS: tuple[tuple[str, str, str], ...] = tuple(
    (k.name, k.env or "", k.kafka_name or "") for k in config_def.cli_settings())
# The table's sasl.mechanism: a file may name it (OAUTHBEARER only), the
# token file decides.
_SASL_MECHANISM = config_def.key("sasl_mechanism").kafka_name
COMMAND_CONFIG_ENV = config_def.COMMAND_CONFIG_ENV
# Kafka client properties a --command-config file may hold that oncelog
# takes otherwise: refused with what to write instead (the table's list).
_COMMAND_CONFIG_REFUSED = {
    prop: refused.reason.format(give=" and ".join(
        config_def.key(name).kafka_name or name for name in refused.instead))
    for prop, refused in config_def.REFUSED_KAFKA_PROPERTIES.items()
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


def add_connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
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
    for dest, env, _prop in SECURITY_SETTINGS:
        flag = "--" + dest.replace("_", "-")
        extra: dict[str, Any] = ({"type": str.upper, "choices": config_def.SECURITY_PROTOCOLS}
                                 if dest == "security_protocol" else {"metavar": "FILE"})
        default = (os.environ.get(env) or None) if defaults else argparse.SUPPRESS
        security.add_argument(flag, dest=dest, default=default,
                              help=f"{_flag_help(dest)} (env {env})", **extra)
    security.add_argument(
        "--command-config", metavar="FILE",
        default=(os.environ.get(COMMAND_CONFIG_ENV) or None) if defaults else argparse.SUPPRESS,
        help=f"a client properties file (Kafka's): "
             f"{', '.join(prop for _dest, _env, prop in SECURITY_SETTINGS)} "
             f"(env {COMMAND_CONFIG_ENV})",
    )


def _flag_help(dest: str) -> str:
    """A security flag's help: the option's meaning in the table, and the
    protocol's default here (from the files given)."""
    return config_def.tool_doc(config_def.key(dest)).replace("`", "")


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", choices=(TABLE, JSON), default=TABLE,
        help="table (default) or json: one JSON document, keys as in docs/cli.md",
    )


def fail(message: str, exc: BaseException | None = None, *, verbose: bool,
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


def silence_stdout() -> None:
    # Python flushes stdout at exit; to a closed pipe that fails again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


# ---------------------------------------------------------------- output

def emit_json(doc: object) -> None:
    """One JSON document on stdout (what `--output json` prints)."""
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def tp_json(tp: TopicPartition) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition}


def bytes_json(doc: dict[str, Any], name: str, data: bytes | None) -> None:
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


class Progress:
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
def working(label: str) -> Iterator[None]:
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


def admin_client(args: argparse.Namespace) -> Admin:
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
        protocol = config_def.default_security_protocol(
            tls_files=any(values.values()), token_file=bool(token_file))
    if token_file and not Path(token_file).is_file():
        raise CliError(f"--sasl-oauth-token-file: no such file {token_file!r}")
    return config_def.security_client_options(
        protocol=protocol.upper(), cafile=values.get("ssl_cafile"),
        certfile=values.get("ssl_certfile"), keyfile=values.get("ssl_keyfile"),
        token_file=token_file)


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
        if key == _SASL_MECHANISM:
            if value.upper() != config_def.OAUTHBEARER:
                raise CliError(f"--command-config {path}:{number}: sasl.mechanism must be "
                               f"OAUTHBEARER (the only mechanism), got {value!r}")
            continue
        if key in _COMMAND_CONFIG_REFUSED:
            raise CliError(f"--command-config {path}:{number}: {key} is not supported: "
                           f"{_COMMAND_CONFIG_REFUSED[key]}")
        if key not in by_property:
            raise CliError(
                f"--command-config {path}:{number}: unknown property {key!r}; known: "
                f"{', '.join(by_property)}, {_SASL_MECHANISM}")
        found[by_property[key]] = value
    return found


def check_partition(partition: int) -> None:
    if partition < 0:
        raise CliError(f"partition must be >= 0, got {partition}")

