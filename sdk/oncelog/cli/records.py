"""`oncelog produce` and `oncelog consume`: lines in, records out."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, BinaryIO

from oncelog import errors
from oncelog.cli._common import (
    CONSUME_FIELDS,
    DEFAULT_HEADERS_DELIMITER,
    DEFAULT_HEADERS_KEY_SEPARATOR,
    DEFAULT_HEADERS_SEPARATOR,
    DEFAULT_KEY_SEPARATOR,
    JSON,
    TEXT,
    CliError,
    Progress,
    UsageError,
    bytes_json,
    client_security,
)
from oncelog.consumer import Consumer
from oncelog.producer import Producer
from oncelog.signals import stop_on_signals
from oncelog.types import (
    ConsumerRecord,
    Header,
    RecordMetadata,
    TopicPartition,
)


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Adds this module's commands to the `oncelog` parser."""
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


def run_produce(args: argparse.Namespace) -> int:
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
    progress = Progress("sent", enabled=sys.stderr.isatty()
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
                bytes_json(header, "value", value)
                headers.append(header)
            doc["headers"] = headers
        else:
            bytes_json(doc, name, getattr(record, name))
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


def run_consume(args: argparse.Namespace) -> int:
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
    progress = Progress("read", enabled=sys.stderr.isatty() and not sys.stdout.isatty())
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

