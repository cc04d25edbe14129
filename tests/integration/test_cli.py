"""The `oncelog` command line, as a user runs it.

Goal: `oncelog cluster up` starts a cluster in the foreground and prints its
bootstrap address, keeps its ports across restarts of a data dir, takes
--port, and refuses a data dir in use or a kept port that is taken, in one
line; with --kafka it also prints a Kafka bootstrap at which a Kafka client
(librdkafka) produces a record into the topic `topics describe` shows, and
the next start of the data dir keeps serving Kafka until --no-kafka; topics can be
created, listed, described, grown and deleted; lines go in with `produce`
(optionally HEADERS<TAB>KEY<TAB>VALUE) and come back out with
`consume` (the fields --print names; as a group member with --group; until
--max-records or --idle-timeout-ms); transactions and consumer groups can be
listed, described and acted on, `groups reset-offsets` changing nothing
without --execute; a failure prints one line naming the problem and exits
non-zero; a mistyped option or command gets the subcommand's usage and the
closest valid name, exit 2; progress shows on a terminal only; SIGTERM stops
the cluster. (`--output json` is covered by test_cli_output.py.)

Method: the CLI runs as subprocesses (`python -m oncelog.cli`), against a
cluster started by `oncelog cluster up` in another subprocess; the progress
test gives the CLI a pseudo-terminal (pty) as its stderr; the Kafka client
is confluent-kafka, given the address `cluster up` printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest

CLI = [sys.executable, "-m", "oncelog.cli"]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cluster_up(tmp_path_factory.mktemp("cli") / "cluster") as address:
        yield address


@contextlib.contextmanager
def cluster_up(data_dir: Path, *options: str,
               printed: list[str] | None = None) -> Iterator[str]:
    """`oncelog cluster up` in a subprocess: its bootstrap address while it
    runs (and what it printed up to it, into `printed`); SIGTERM at the end
    must stop it with exit status 0."""
    proc = subprocess.Popen(
        [*CLI, "cluster", "up", "--data-dir", str(data_dir), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        address = None
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        lines = []
        # Up to its last line before it waits: the exports come before it.
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("export ONCELOG_BOOTSTRAP="):
                address = line.strip().split("=", 1)[1]
            if line.startswith("Ctrl-C stops it."):
                break
        assert address, f"cluster up printed no bootstrap address: {''.join(lines)}"
        if printed is not None:
            printed.extend(lines)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0


def run(bootstrap: str, *args: str, stdin: bytes | None = None,
        check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "ONCELOG_BOOTSTRAP": bootstrap}
    result = subprocess.run([*CLI, *args], input=stdin, capture_output=True, env=env,
                            timeout=120)
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def test_topics_produce_consume_round_trip(bootstrap: str, tmp_path: Path) -> None:
    out = run(bootstrap, "topics", "create", "pay", "--partitions", "2",
              "--config", "retention.ms=86400000")
    assert b"created topic pay" in out.stdout
    assert b"pay\t2" in run(bootstrap, "topics", "list").stdout
    # --bootstrap also goes before the subcommand (and beats the environment).
    assert b"pay\t2" in run("127.0.0.1:1", "--bootstrap", bootstrap, "topics", "list").stdout

    produced = run(bootstrap, "produce", "pay", "--partition", "0",
                   stdin=b"first\nsecond\n\nlast-without-newline")
    assert produced.stdout.strip() == b"4 records produced to pay"
    lines = tmp_path / "keyed.txt"
    lines.write_bytes(b"k1:one\nk2:two:with:colons\n")
    keyed = run(bootstrap, "produce", "pay", "--file", str(lines), "--key-separator", ":")
    assert keyed.stdout.strip() == b"2 records produced to pay"

    p0 = run(bootstrap, "consume", "pay", "--partition", "0", "--from-beginning")
    assert p0.stdout.split(b"\n")[:4] == [b"first", b"second", b"", b"last-without-newline"]
    everything = run(bootstrap, "consume", "pay", "--print-key").stdout.splitlines()
    assert sorted(everything) == sorted([
        b"null\tfirst", b"null\tsecond", b"null\t", b"null\tlast-without-newline",
        b"k1\tone", b"k2\ttwo:with:colons",
    ])
    limited = run(bootstrap, "consume", "pay", "--partition", "0", "--offset", "1",
                  "--max-records", "2")
    assert limited.stdout.splitlines() == [b"second", b""]

    described = run(bootstrap, "topics", "describe", "pay").stdout.decode()
    assert "retention.ms=86400000" in described
    assert "high_watermark" in described
    run(bootstrap, "topics", "delete", "pay")
    assert b"pay\t" not in run(bootstrap, "topics", "list").stdout


def test_topics_add_partitions(bootstrap: str) -> None:
    run(bootstrap, "topics", "create", "grower", "--partitions", "2")
    checked = run(bootstrap, "topics", "add-partitions", "grower", "--partitions", "4",
                  "--validate-only")
    assert checked.stdout.strip() == (
        b"topic grower can grow to 4 partitions (validate only: nothing changed)")
    assert b"grower\t2" in run(bootstrap, "topics", "list").stdout
    grown = run(bootstrap, "topics", "add-partitions", "grower", "--partitions", "4")
    assert grown.stdout.strip() == b"topic grower now has 4 partitions"
    assert b"grower\t4" in run(bootstrap, "topics", "list").stdout
    # The new partitions take records at once.
    produced = run(bootstrap, "produce", "grower", "--partition", "3", stdin=b"on-3\n")
    assert produced.stdout.strip() == b"1 records produced to grower"
    assert run(bootstrap, "consume", "grower", "--partition", "3").stdout == b"on-3\n"
    # Shrinking, an unknown topic: one line each, exit 1, nothing changed.
    shrink = run(bootstrap, "topics", "add-partitions", "grower", "--partitions", "3",
                 check=False)
    assert shrink.returncode == 1
    assert shrink.stderr.decode().strip() == (
        "oncelog: error: InvalidPartitionsError: topic 'grower' has 4 partitions; 3 would "
        "not be an increase (partitions are never removed)")
    unknown = run(bootstrap, "topics", "add-partitions", "nowhere", "--partitions", "3",
                  check=False)
    assert unknown.returncode == 1
    assert unknown.stderr.decode().strip() == (
        "oncelog: error: UnknownTopicOrPartitionError: topic 'nowhere' does not exist")
    assert b"grower\t4" in run(bootstrap, "topics", "list").stdout
    missing_count = run(bootstrap, "topics", "add-partitions", "grower", check=False)
    assert missing_count.returncode == 2
    assert b"--partitions" in missing_count.stderr


def test_follow_prints_new_records_until_interrupted(bootstrap: str) -> None:
    run(bootstrap, "topics", "create", "live")
    env = {**os.environ, "ONCELOG_BOOTSTRAP": bootstrap}
    follower = subprocess.Popen([*CLI, "consume", "live", "--follow"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
    try:
        assert follower.stdout is not None
        # Keep producing until the follower has printed a line: it starts at the
        # end, so records sent before it is ready are not expected.
        deadline = time.monotonic() + 60
        os.set_blocking(follower.stdout.fileno(), False)
        seen = b""
        while b"ping" not in seen and time.monotonic() < deadline:
            run(bootstrap, "produce", "live", stdin=b"ping\n")
            time.sleep(0.3)
            seen += follower.stdout.read() or b""
        assert b"ping" in seen
    finally:
        follower.send_signal(signal.SIGINT)
        code = follower.wait(timeout=60)
    assert code == 0


def test_errors_are_one_line_and_nonzero(bootstrap: str) -> None:
    missing = run(bootstrap, "consume", "no-such-topic", check=False)
    assert missing.returncode == 1
    assert missing.stderr.decode().strip() == (
        "oncelog: error: UnknownTopicOrPartitionError: topic 'no-such-topic' does not exist"
    )
    run(bootstrap, "topics", "create", "dup")
    again = run(bootstrap, "topics", "create", "dup", check=False)
    assert again.returncode == 1
    assert again.stderr.decode().startswith("oncelog: error: TopicAlreadyExistsError")
    assert len(again.stderr.decode().strip().splitlines()) == 1
    bad_line = run(bootstrap, "produce", "dup", "--key-separator", "=", stdin=b"a=1\nnokey\n",
                   check=False)
    assert bad_line.returncode == 1
    assert b"line 2 has no key separator" in bad_line.stderr
    bad_config = run(bootstrap, "topics", "create", "x", "--config", "novalue", check=False)
    assert bad_config.returncode == 1 and b"KEY=VALUE" in bad_config.stderr
    past_end = run(bootstrap, "consume", "dup", "--offset", "5", check=False)
    assert past_end.returncode == 1
    assert b"offset 5 is outside partition 0 of dup, which holds offsets 0..0" in past_end.stderr
    unreachable = run("127.0.0.1:1", "topics", "list", "--timeout-ms", "1000", check=False)
    assert unreachable.returncode == 1
    assert b"127.0.0.1:1" in unreachable.stderr
    usage = run(bootstrap, "topics", check=False)
    assert usage.returncode == 2


def test_transactions_commands(bootstrap: str) -> None:
    from oncelog import Producer  # the transaction itself comes from the SDK

    run(bootstrap, "topics", "create", "txns", "--partitions", "2")
    with Producer(bootstrap=bootstrap, transactional_id="cli-tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txns", value=b"open", partition=1).result(timeout=60)
        listed = run(bootstrap, "transactions", "list").stdout.decode().splitlines()
        assert listed[0].split() == ["transactional_id", "producer_id", "state"]
        assert ["cli-tx", str(producer.producer_id), "Ongoing"] in [r.split() for r in listed]
        described = run(bootstrap, "transactions", "describe", "cli-tx").stdout.decode()
        assert "state Ongoing" in described and "partitions txns-1" in described
        producers = run(bootstrap, "transactions", "describe-producers", "txns", "1")
        rows = [r.split() for r in producers.stdout.decode().splitlines()]
        assert rows[1][0] == str(producer.producer_id) and rows[1][-1] == "0"
        hanging = run(bootstrap, "transactions", "find-hanging", "--topic", "txns")
        assert hanging.stdout.decode().splitlines()[1:] == []  # header only
        aborted = run(bootstrap, "transactions", "abort", "cli-tx").stdout.decode()
        assert aborted.startswith("aborted the open transaction of cli-tx")
    nothing_open = run(bootstrap, "transactions", "abort", "cli-tx", check=False)
    assert nothing_open.returncode == 1
    assert nothing_open.stderr.decode().startswith("oncelog: error: InvalidTxnStateError")
    unknown = run(bootstrap, "transactions", "describe", "no-such-id", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr.decode().startswith("oncelog: error: TransactionalIdNotFoundError")
    assert len(unknown.stderr.decode().strip().splitlines()) == 1
    no_producer = run(bootstrap, "transactions", "abort-hanging", "txns", "0", "12345",
                      check=False)
    assert no_producer.returncode == 1
    assert b"producer 12345 has no open transaction on txns-0" in no_producer.stderr
    usage = run(bootstrap, "transactions", "describe-producers", "txns", check=False)
    assert usage.returncode == 2


def test_groups_commands(bootstrap: str) -> None:
    from oncelog import Consumer, TopicPartition  # the group itself comes from the SDK

    run(bootstrap, "topics", "create", "grp", "--partitions", "2")
    run(bootstrap, "produce", "grp", "--partition", "0", stdin=b"a\nb\nc\n")
    run(bootstrap, "produce", "grp", "--partition", "1", stdin=b"d\n")
    t0, t1 = TopicPartition("grp", 0), TopicPartition("grp", 1)
    with Consumer(bootstrap=bootstrap, group_id="cli-group", session_timeout_ms=3000) as consumer:
        consumer.subscribe(["grp"])
        deadline = time.monotonic() + 60
        while consumer.assignment() != {t0, t1}:
            assert time.monotonic() < deadline
            consumer.poll(timeout=0.1)
        consumer.commit({t0: 1, t1: 1})
        member_id = consumer.group_metadata().member_id
        listed = [r.split() for r in run(bootstrap, "groups", "list").stdout.decode().splitlines()]
        assert listed[0] == ["group_id", "state"] and ["cli-group", "Stable"] in listed
        described = run(bootstrap, "groups", "describe", "cli-group").stdout.decode().splitlines()
        assert described[0].startswith("group cli-group  state Stable")
        assert described[1].split() == ["member_id", "instance_id", "member_epoch", "topics",
                                        "assignment"]
        row = described[2].split()
        assert (row[0], row[1], row[3], row[4:]) == (member_id, "-", "grp", ["grp-0", "grp-1"])
        offsets = [r.split() for r in
                   run(bootstrap, "groups", "offsets", "cli-group").stdout.decode().splitlines()]
        assert offsets == [["topic", "partition", "committed", "end", "lag", "member_id"],
                           ["grp", "0", "1", "3", "2", member_id],
                           ["grp", "1", "1", "1", "0", member_id]]
        in_use = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-earliest",
                     "--all-topics", check=False)
        assert in_use.returncode == 1
        assert in_use.stderr.decode().startswith("oncelog: error: UnknownMemberIdError")
        assert b"has members" in in_use.stderr
        busy = run(bootstrap, "groups", "delete", "cli-group", check=False)
        assert busy.returncode == 1 and b"NonEmptyGroupError" in busy.stderr
        in_use = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-earliest",
                     "--all-topics", "--execute", check=False)
        assert in_use.returncode == 1
        assert in_use.stderr.decode().startswith("oncelog: error: UnknownMemberIdError")
    # Without --execute (or with --dry-run) only the plan: nothing changes.
    for plan_only in ([], ["--dry-run"]):
        dry = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-latest", "--topic",
                  "grp", *plan_only).stdout.decode().splitlines()
        assert [r.split() for r in dry[:3]] == [
            ["topic", "partition", "current_offset", "new_offset"],
            ["grp", "0", "1", "3"], ["grp", "1", "1", "1"]]
        assert dry[-1] == "plan only: nothing committed for group cli-group (--execute commits it)"
        unchanged = [r.split() for r in
                     run(bootstrap, "groups", "offsets", "cli-group").stdout.decode().splitlines()]
        assert unchanged[1:] == [["grp", "0", "1", "3", "2", "-"], ["grp", "1", "1", "1", "0", "-"]]
    both = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-latest", "--all-topics",
               "--dry-run", "--execute", check=False)
    assert both.returncode == 2
    reset = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-offset", "2",
                "--topic", "grp:0", "--execute").stdout.decode().splitlines()
    assert reset[1].split() == ["grp", "0", "1", "2"]
    assert reset[-1] == "reset 1 offsets of group cli-group"
    offsets = [r.split() for r in
               run(bootstrap, "groups", "offsets", "cli-group").stdout.decode().splitlines()]
    assert offsets[1:] == [["grp", "0", "2", "3", "1", "-"], ["grp", "1", "1", "1", "0", "-"]]
    no_where = run(bootstrap, "groups", "reset-offsets", "cli-group", "--all-topics",
                   check=False)
    assert no_where.returncode == 2
    assert run(bootstrap, "groups", "delete", "cli-group").stdout.decode().strip() == (
        "deleted group cli-group")
    unknown = run(bootstrap, "groups", "describe", "cli-group", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr.decode().startswith("oncelog: error: GroupIdNotFoundError")
    assert len(unknown.stderr.decode().strip().splitlines()) == 1


def test_produce_headers_and_keys_consume_fields(bootstrap: str) -> None:
    run(bootstrap, "topics", "create", "fields")
    # Kafka's console producer format: HEADERS<TAB>KEY<TAB>VALUE, headers
    # k:v pairs separated by ',' (no ':' = a null value; empty = none).
    run(bootstrap, "produce", "fields", "--headers", "--parse-key",
        stdin=b"h1:v1,h2\tk1\tone\n\tk2\ttwo\n")
    run(bootstrap, "produce", "fields", "--headers", "--headers-delimiter", "|",
        "--headers-separator", ";", "--headers-key-separator", "=", "--key-separator", "=",
        stdin=b"a=1;b=2|k3=three\n")
    printed = run(bootstrap, "consume", "fields", "--print", "partition,offset,key,headers,value")
    assert printed.stdout.splitlines() == [
        b"0\t0\tk1\th1:v1,h2\tone", b"0\t1\tk2\t\ttwo", b"0\t2\tk3\ta:1,b:2\tthree"]
    stamped = run(bootstrap, "consume", "fields", "--print", "value,timestamp",
                  "--key-separator", " ").stdout.splitlines()
    assert [line.split(b" ")[0] for line in stamped] == [b"one", b"two", b"three"]
    assert all(line.split(b" ")[1].isdigit() for line in stamped)

    bad_field = run(bootstrap, "consume", "fields", "--print", "key,size", check=False)
    assert bad_field.returncode == 2 and b"--print takes fields of" in bad_field.stderr
    no_delimiter = run(bootstrap, "produce", "fields", "--headers", stdin=b"no-tab-here\n",
                       check=False)
    assert no_delimiter.returncode == 1
    assert no_delimiter.stderr.decode().strip() == (
        "oncelog: error: line 1 has no headers delimiter '\\t'; 0 records were produced "
        "before it")
    lone = run(bootstrap, "produce", "fields", "--headers-separator", ";", check=False)
    assert lone.returncode == 2 and b"--headers-separator needs --headers" in lone.stderr


def test_consume_as_a_group_member_until_idle(bootstrap: str) -> None:
    run(bootstrap, "topics", "create", "members", "--partitions", "2")
    run(bootstrap, "produce", "members", "--partition", "0", stdin=b"a\nb\n")
    run(bootstrap, "produce", "members", "--partition", "1", stdin=b"c\n")
    first = run(bootstrap, "consume", "members", "--group", "cli-reader", "--max-records", "2",
                "--print", "partition,offset,value").stdout.splitlines()
    assert len(first) == 2
    # The group committed what was printed: the next member goes on from there
    # and, without --follow, stops at the end.
    rest = run(bootstrap, "consume", "members", "--group", "cli-reader",
               "--print", "partition,offset,value").stdout.splitlines()
    assert sorted(first + rest) == [b"0\t0\ta", b"0\t1\tb", b"1\t0\tc"]
    committed = [r.split()[:3] for r in
                 run(bootstrap, "groups", "offsets", "cli-reader").stdout.decode().splitlines()]
    assert committed[1:] == [["members", "0", "2"], ["members", "1", "1"]]
    assert run(bootstrap, "consume", "members", "--group", "cli-reader").stdout == b""
    refused = run(bootstrap, "consume", "members", "--group", "cli-reader", "--partition", "0",
                  check=False)
    assert refused.returncode == 2 and b"takes neither --offset nor --partition" in refused.stderr

    # --follow ends after --idle-timeout-ms without records (Kafka's --timeout-ms).
    idle = run(bootstrap, "consume", "members", "--follow", "--from-beginning",
               "--idle-timeout-ms", "3000")
    assert sorted(idle.stdout.splitlines()) == [b"a", b"b", b"c"]
    grouped = run(bootstrap, "consume", "members", "--group", "cli-follower", "--follow",
                  "--from-beginning", "--idle-timeout-ms", "3000")
    assert sorted(grouped.stdout.splitlines()) == [b"a", b"b", b"c"]


def test_mistyped_options_get_usage_and_a_suggestion(bootstrap: str) -> None:
    flag = run(bootstrap, "consume", "members", "--max-recrods", "5", check=False)
    assert flag.returncode == 2
    lines = flag.stderr.decode().splitlines()
    assert lines[0].startswith("usage: oncelog consume ")
    assert "oncelog consume: error: unrecognized arguments: --max-recrods 5" in lines
    assert lines[-1] == "oncelog consume: did you mean --max-records (not --max-recrods)?"
    action = run(bootstrap, "topics", "lst", check=False)
    assert action.returncode == 2
    assert action.stderr.decode().startswith("usage: oncelog topics ")
    assert action.stderr.decode().splitlines()[-1] == (
        "oncelog topics: did you mean list (not lst)?")
    command = run(bootstrap, "grups", "list", check=False)
    assert command.returncode == 2
    assert command.stderr.decode().splitlines()[-1] == "oncelog: did you mean groups (not grups)?"
    nothing_close = run(bootstrap, "topics", "list", "--zzz", check=False)
    assert nothing_close.returncode == 2
    assert nothing_close.stderr.decode().splitlines()[-1] == (
        "oncelog topics list: `oncelog topics list -h` lists its options")


def _read_all(fd: int) -> bytes:
    """What a pty's other end received, until its last writer closed it."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            return data
        if not chunk:
            return data
        data += chunk


def test_progress_shows_on_a_terminal_only(bootstrap: str, tmp_path: Path) -> None:
    run(bootstrap, "topics", "create", "bulk")
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"record-%d\n" % i for i in range(2000)))
    env = {**os.environ, "ONCELOG_BOOTSTRAP": bootstrap}

    piped = run(bootstrap, "produce", "bulk", "--file", str(lines))
    assert piped.stderr == b"" and piped.stdout == b"2000 records produced to bulk\n"
    consumed = run(bootstrap, "consume", "bulk")
    assert consumed.stderr == b"" and len(consumed.stdout.splitlines()) == 2000

    master, slave = pty.openpty()
    try:
        produced = subprocess.run([*CLI, "produce", "bulk", "--file", str(lines)],
                                  stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120)
        os.close(slave)
        slave = -1
        terminal = _read_all(master)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert produced.returncode == 0
    assert produced.stdout == b"2000 records produced to bulk\n"  # stdout stays clean
    assert b"\rsent 2000 records, " in terminal and b"records/s" in terminal

    master, slave = pty.openpty()
    out_file = tmp_path / "out.txt"
    try:
        with open(out_file, "wb") as out:
            read = subprocess.run([*CLI, "consume", "bulk"], stdout=out, stderr=slave, env=env,
                                  timeout=120)
        os.close(slave)
        slave = -1
        terminal = _read_all(master)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert read.returncode == 0
    assert len(out_file.read_bytes().splitlines()) == 4000
    assert b"\rread 4000 records, " in terminal


def test_cluster_up_keeps_its_ports_and_its_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "kept"
    with cluster_up(data_dir) as first:
        again = subprocess.run([*CLI, "cluster", "up", "--data-dir", str(data_dir)],
                               capture_output=True, timeout=120)
        assert again.returncode == 1
        assert again.stderr.decode().splitlines() == [
            f"oncelog: error: data dir {data_dir} is in use by another `oncelog cluster up` "
            f"(pid {_lock_holder(data_dir)}); stop it first, or give another --data-dir"]
        run(first, "topics", "create", "kept")
    with cluster_up(data_dir) as second:
        assert second == first
        assert b"kept\t1" in run(second, "topics", "list").stdout

    port = int(first.rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        taken = subprocess.run([*CLI, "cluster", "up", "--data-dir", str(data_dir)],
                               capture_output=True, timeout=120)
    assert taken.returncode == 1
    assert taken.stderr.decode().splitlines() == [
        f"oncelog: error: port {port} is taken by another process: partition_store 0 of the "
        f"cluster in {data_dir} listens there for gRPC (kept from its last start in "
        "cluster-ports.json); free the port, or give another --port or --data-dir"]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        chosen = probe.getsockname()[1]
    with cluster_up(data_dir, "--port", str(chosen)) as moved:
        assert moved == f"127.0.0.1:{chosen}"
        assert b"kept\t1" in run(moved, "topics", "list").stdout
    with cluster_up(data_dir) as kept:
        assert kept == moved


def _lock_holder(data_dir: Path) -> str:
    return (data_dir / "cluster.lock").read_text().strip()


def _kafka_bootstrap(printed: list[str]) -> str | None:
    """The Kafka bootstrap that `cluster up` printed beside the gRPC one."""
    match = re.fullmatch(r"oncelog cluster up; bootstrap (\S+)(?:; kafka bootstrap (\S+))?",
                         printed[0].strip())
    assert match, printed
    return match.group(2)


def _produce_with_librdkafka(kafka_bootstrap: str, topic: str, value: bytes) -> int:
    """Produces one record with librdkafka; the offset the cluster gave it."""
    producer = ck.Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                            "message.timeout.ms": 30_000})
    reports: list[tuple[ck.KafkaError | None, int | None]] = []

    def on_delivery(error: ck.KafkaError | None, message: ck.Message) -> None:
        reports.append((error, message.offset()))

    producer.produce(topic, value=value, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    ((error, offset),) = reports
    assert error is None and offset is not None, error
    return offset


def _high_watermark(bootstrap: str, topic: str) -> int:
    """The topic's (one partition's) high watermark, as the CLI reads it over gRPC."""
    described = json.loads(run(bootstrap, "topics", "describe", topic, "--output", "json").stdout)
    ((partition),) = described["partitions"]
    return int(partition["high_watermark"])


def test_cluster_up_kafka_prints_a_kafka_bootstrap_and_keeps_serving_it(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "kafka"
    printed: list[str] = []
    with cluster_up(data_dir, "--kafka", printed=printed) as first:
        kafka_bootstrap = _kafka_bootstrap(printed)
        assert kafka_bootstrap and kafka_bootstrap != first
        run(first, "topics", "create", "from-kafka")
        # A Kafka client at the printed address writes into the cluster the
        # gRPC address names.
        assert _produce_with_librdkafka(kafka_bootstrap, "from-kafka", b"one") == 0
        assert _high_watermark(first, "from-kafka") == 1

    # The next start of the data dir, without the flag, serves Kafka again.
    printed.clear()
    with cluster_up(data_dir, printed=printed) as second:
        assert second == first
        # At the same Kafka address too: a Kafka client's config stays right.
        assert _kafka_bootstrap(printed) == kafka_bootstrap
        assert _produce_with_librdkafka(kafka_bootstrap, "from-kafka", b"two") == 1
        assert _high_watermark(second, "from-kafka") == 2

    # --no-kafka turns it off, for the starts after it too.
    printed.clear()
    with cluster_up(data_dir, "--no-kafka", printed=printed):
        assert _kafka_bootstrap(printed) is None
    assert json.loads((data_dir / "cluster-ports.json").read_text())["kafka"] is False


def test_cluster_up_runs_the_replicated_secured_cluster_and_keeps_it(tmp_path: Path) -> None:
    """The README's headline cluster from the CLI: 3 stores, etcd, RF 3,
    TLS and ACLs, Kafka's protocol; the next start of the data dir without
    flags is the same cluster, and it cannot be turned into an unreplicated one."""
    data_dir = tmp_path / "headline"
    printed: list[str] = []
    with cluster_up(data_dir, "--stores", "3", "--replicated", "--secure", "--kafka",
                    printed=printed) as bootstrap:
        exports = dict(line.strip().removeprefix("export ").split("=", 1)
                       for line in printed if line.startswith("export "))
        config = exports["ONCELOG_COMMAND_CONFIG"]
        assert Path(config) == data_dir / "admin.properties"
        assert _kafka_bootstrap(printed) is not None
        # Plain text is refused, naming the way in.
        refused = run(bootstrap, "topics", "list", check=False)
        assert refused.returncode != 0 and b"serves TLS" in refused.stderr
        secured = ("--command-config", config)
        run(bootstrap, *secured, "topics", "create", "headline", "--partitions", "3")
        described = json.loads(run(bootstrap, *secured, "topics", "describe", "headline",
                                   "--output", "json").stdout)
        assert [sorted(p["replicas"]) for p in described["partitions"]] == [[0, 1, 2]] * 3
    printed.clear()
    with cluster_up(data_dir, printed=printed) as again:
        assert again == bootstrap
        assert any(line.startswith("export ONCELOG_COMMAND_CONFIG=") for line in printed)
        assert _kafka_bootstrap(printed) is not None
        described = json.loads(run(again, *secured, "topics", "describe", "headline",
                                   "--output", "json").stdout)
        assert len(described["partitions"]) == 3
    refused_start = subprocess.run(
        [*CLI, "cluster", "up", "--data-dir", str(data_dir), "--no-replicated"],
        capture_output=True, text=True, timeout=120)
    assert refused_start.returncode != 0
    assert "was started replicated (with etcd), and stays so" in refused_start.stderr
