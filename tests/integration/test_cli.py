"""The `oncelog` command line, as a user runs it.

Goal: `oncelog cluster up` starts a cluster in the foreground and prints its
bootstrap address; topics can be created, listed, described and deleted;
lines go in with `produce` (optionally KEY<SEP>VALUE) and come back out with
`consume`; transactions and consumer groups can be listed, described and
acted on; a failure prints one line naming the problem and exits non-zero;
SIGTERM stops the cluster.

Method: the CLI runs as subprocesses (`python -m oncelog.cli`), against a
cluster started by `oncelog cluster up` in another subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "oncelog.cli"]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("cli") / "cluster"
    proc = subprocess.Popen(
        [*CLI, "cluster", "up", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        address = None
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        lines = []
        while address is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("export ONCELOG_BOOTSTRAP="):
                address = line.strip().split("=", 1)[1]
        assert address, f"cluster up printed no bootstrap address: {''.join(lines)}"
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
    dry = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-latest", "--topic", "grp",
              "--dry-run").stdout.decode().splitlines()
    assert [r.split() for r in dry[:3]] == [["topic", "partition", "new_offset"],
                                            ["grp", "0", "3"], ["grp", "1", "1"]]
    assert dry[-1] == "dry run: nothing committed for group cli-group"
    reset = run(bootstrap, "groups", "reset-offsets", "cli-group", "--to-offset", "2",
                "--topic", "grp:0").stdout.decode().splitlines()
    assert reset[1].split() == ["grp", "0", "2"]
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
