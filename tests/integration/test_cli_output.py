"""Golden tests of the CLI's `--output json`: every listing command, parsed back.

Goal: every `oncelog` command that lists something prints, with `--output
json`, one JSON document (`consume`: one JSON object per line) whose keys
are the documented ones (docs/cli.md) and whose values are what the cluster
holds; and a listing command added without JSON support, or without a case
here, fails.

Method: the commands are enumerated from the CLI's own parser
(`oncelog.cli.build_parser`, `leaf_commands`). Each is either in ACTIONS
(commands that change something and print one line) or a listing command,
which must take `--output json` and have a case in CASES; a command in
neither fails `test_json_output` for it. Each case runs the command as a
subprocess (`python -m oncelog.cli`) against a LocalCluster holding known
data made with the SDK (records with keys, headers and bytes that are not
UTF-8, an open transaction, a group with a member, a group without), parses
stdout with json.loads and compares fields and values with that data. The
move listed by `partitions list-reassignments` needs a replicated cluster
(etcd): one is started for that case alone, with the move's new replica
killed so that the move stays in progress; the ACLs listed by `acls list`
need a secured cluster (LocalCluster(security=True)), also started for that
case alone, the CLI connecting to it with the ONCELOG_SSL_* variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from oncelog import AclBinding, Admin, Consumer, Producer, TopicPartition
from oncelog.cli import build_parser, leaf_commands
from oncelog.testing import LocalCluster

CLI = [sys.executable, "-m", "oncelog.cli"]
# The commands that change something and print one line: no JSON. Any
# other command lists something and must have a case in CASES.
ACTIONS = frozenset({
    ("cluster", "up"), ("topics", "create"), ("topics", "delete"), ("topics", "add-partitions"),
    ("partitions", "reassign"), ("produce",), ("transactions", "abort"),
    ("transactions", "abort-hanging"), ("groups", "delete"),
    ("acls", "add"), ("acls", "remove"),
})
COMMANDS = leaf_commands(build_parser())
LISTING = sorted(path for path in COMMANDS if path not in ACTIONS)

TOPIC = "orders"
TRANSACTIONAL_ID = "golden-tx"
TRANSACTION_TIMEOUT_MS = 600_000
LIVE_GROUP = "golden-live"
IDLE_GROUP = "golden-idle"
T0, T1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


@dataclass(frozen=True)
class World:
    """What the cluster holds, as the cases expect to see it."""

    bootstrap: str
    base_timestamp_ms: int
    txn_producer_id: int
    txn_producer_epoch: int
    member_id: str


def _records(base_ms: int) -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes | None]],
                                        int]]:
    """(partition, key, value, headers, timestamp_ms) of the committed records."""
    return [
        (0, b"k0", b"v0", [("h1", b"x"), ("h2", None)], base_ms),
        (0, None, b"\xff\xfe", [], base_ms + 1),
        (0, b"\xc3", "ünïcode".encode(), [("bin", b"\x80")], base_ms + 2),
        (1, b"k3", b"v3", [], base_ms + 3),
    ]


# What consume --output json prints for those records, per (partition, offset).
def _expected_lines(base_ms: int) -> dict[tuple[int, int], dict[str, Any]]:
    common = {"topic": TOPIC}
    return {
        (0, 0): {**common, "partition": 0, "offset": 0, "timestamp_ms": base_ms,
                 "key": "k0", "value": "v0",
                 "headers": [{"key": "h1", "value": "x"}, {"key": "h2", "value": None}]},
        (0, 1): {**common, "partition": 0, "offset": 1, "timestamp_ms": base_ms + 1,
                 "key": None, "value": "//4=", "value_encoding": "base64", "headers": []},
        (0, 2): {**common, "partition": 0, "offset": 2, "timestamp_ms": base_ms + 2,
                 "key": "ww==", "key_encoding": "base64", "value": "ünïcode",
                 "headers": [{"key": "bin", "value": "gA==", "value_encoding": "base64"}]},
        (1, 0): {**common, "partition": 1, "offset": 0, "timestamp_ms": base_ms + 3,
                 "key": "k3", "value": "v3", "headers": []},
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with LocalCluster(tmp_path_factory.mktemp("golden") / "cluster") as cluster:
        bootstrap = cluster.bootstrap
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=2, config={"retention.ms": "86400000"})
        # Recent timestamps: older ones could fall out of retention.
        base_ms = int(time.time() * 1000) - 60_000
        with Producer(bootstrap=bootstrap) as producer:
            for partition, key, value, headers, timestamp_ms in _records(base_ms):
                producer.send(TOPIC, value=value, key=key, partition=partition,
                              headers=headers, timestamp_ms=timestamp_ms).result(timeout=60)
        with Producer(bootstrap=bootstrap, transactional_id=TRANSACTIONAL_ID,
                      transaction_timeout_ms=TRANSACTION_TIMEOUT_MS) as txn_producer, \
                Consumer(bootstrap=bootstrap, group_id=LIVE_GROUP) as member, \
                Admin(bootstrap=bootstrap) as admin:
            # Left open for the module: orders-1 then holds offset 1 open,
            # so its last stable offset (1) is below its high watermark (2).
            txn_producer.init_transactions()
            txn_producer.begin_transaction()
            txn_producer.send(TOPIC, value=b"open", partition=1).result(timeout=60)
            member.subscribe([TOPIC])
            deadline = time.monotonic() + 60
            while member.assignment() != {T0, T1}:
                assert time.monotonic() < deadline, "the group never assigned both partitions"
                member.poll(timeout=0.1)
            member.commit({T0: 1, T1: 1})
            admin.alter_group_offsets(IDLE_GROUP, {T0: 1, T1: 0})
            yield World(
                bootstrap=bootstrap, base_timestamp_ms=base_ms,
                txn_producer_id=txn_producer.producer_id,
                txn_producer_epoch=txn_producer.producer_epoch,
                member_id=member.group_metadata().member_id,
            )
            txn_producer.abort_transaction()


def cli(bootstrap: str, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run([*CLI, *args], capture_output=True, timeout=120,
                            env={**os.environ, "ONCELOG_BOOTSTRAP": bootstrap, **(env or {})})
    assert result.returncode == 0, result.stderr.decode()
    # Piped output carries no progress line or other noise.
    assert result.stderr == b""
    return result


def run_json(bootstrap: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """The command's stdout, parsed: exactly one JSON document."""
    return json.loads(cli(bootstrap, *args, "--output", "json", env=env).stdout)


def run_json_lines(bootstrap: str, *args: str) -> list[dict[str, Any]]:
    stdout = cli(bootstrap, *args, "--output", "json").stdout.decode()
    return [json.loads(line) for line in stdout.splitlines()]


# ------------------------------------------------------------------ the cases

def topics_list(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "topics", "list")
    assert doc == [{"name": TOPIC, "partitions": 2}]


def topics_describe(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "topics", "describe", TOPIC)
    assert set(doc) == {"name", "topic_id", "internal", "config", "partitions"}
    assert doc["name"] == TOPIC and doc["internal"] is False
    assert isinstance(doc["topic_id"], int)
    assert doc["config"]["retention.ms"] == "86400000"
    common = {"leader_node_id": 0, "leader_address": world.bootstrap, "leader_epoch": 0,
              "replicas": [0], "isr": [0], "target_replicas": [], "earliest_offset": 0}
    assert doc["partitions"] == [
        {"partition": 0, **common, "high_watermark": 3, "last_stable_offset": 3},
        {"partition": 1, **common, "high_watermark": 2, "last_stable_offset": 1},
    ]


def partitions_list_reassignments(_world: World, request: pytest.FixtureRequest) -> None:
    bootstrap, expected = request.getfixturevalue("moving")
    assert run_json(bootstrap, "partitions", "list-reassignments") == expected


def consume(world: World, _request: pytest.FixtureRequest) -> None:
    expected = _expected_lines(world.base_timestamp_ms)
    lines = run_json_lines(world.bootstrap, "consume", TOPIC)
    # read_committed: orders-1 ends at its open transaction.
    assert {(d["partition"], d["offset"]): d for d in lines} == expected
    assert len(lines) == len(expected)
    # --print picks the fields, in its order.
    chosen = run_json_lines(world.bootstrap, "consume", TOPIC, "--partition", "0",
                            "--print", "offset,key,headers")
    assert [list(d) for d in chosen] == [["offset", "key", "headers"]] * 2 + [
        ["offset", "key", "key_encoding", "headers"]]
    assert chosen == [
        {name: value for name, value in expected[(0, offset)].items()
         if name in ("offset", "key", "key_encoding", "headers")}
        for offset in range(3)
    ]
    # read_uncommitted also shows the open transaction's record.
    uncommitted = run_json_lines(world.bootstrap, "consume", TOPIC, "--partition", "1",
                                 "--isolation-level", "read_uncommitted",
                                 "--print", "offset,value")
    assert uncommitted == [{"offset": 0, "value": "v3"}, {"offset": 1, "value": "open"}]


def transactions_list(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "transactions", "list")
    assert {"transactional_id": TRANSACTIONAL_ID, "producer_id": world.txn_producer_id,
            "state": "Ongoing"} in doc
    assert all(set(t) == {"transactional_id", "producer_id", "state"} for t in doc)


def transactions_describe(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "transactions", "describe", TRANSACTIONAL_ID)
    start_ms = doc.pop("transaction_start_time_ms")
    assert world.base_timestamp_ms < start_ms <= int(time.time() * 1000)
    assert isinstance(doc.pop("coordinator_epoch"), int)
    assert doc == {
        "transactional_id": TRANSACTIONAL_ID, "state": "Ongoing",
        "producer_id": world.txn_producer_id, "producer_epoch": world.txn_producer_epoch,
        "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
        "partitions": [{"topic": TOPIC, "partition": 1}],
        "two_phase_commit": False, "prepared_transaction": None,
    }


def transactions_describe_producers(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "transactions", "describe-producers", TOPIC, "1")
    keys = {"producer_id", "producer_epoch", "last_sequence", "last_timestamp_ms",
            "coordinator_epoch", "current_txn_start_offset"}
    assert all(set(p) == keys for p in doc)
    by_id = {p["producer_id"]: p for p in doc}
    txn = by_id.pop(world.txn_producer_id)
    assert (txn["producer_epoch"], txn["last_sequence"], txn["current_txn_start_offset"]) == (
        world.txn_producer_epoch, 0, 1)
    # The idempotent producer of the committed record: no open transaction.
    assert [(p["last_sequence"], p["current_txn_start_offset"], p["last_timestamp_ms"])
            for p in by_id.values()] == [(0, None, world.base_timestamp_ms + 3)]


def transactions_find_hanging(world: World, _request: pytest.FixtureRequest) -> None:
    # Under the coordinators' maximum the open transaction is not hanging...
    assert run_json(world.bootstrap, "transactions", "find-hanging", "--topic", TOPIC) == []
    # ...with a 1 ms maximum it is (its last write is older than that).
    doc = run_json(world.bootstrap, "transactions", "find-hanging", "--topic", TOPIC,
                   "--max-timeout-ms", "1")
    assert len(doc) == 1
    found = doc[0]
    assert "max_transaction_timeout_ms=1" in found.pop("reason")
    assert isinstance(found.pop("coordinator_epoch"), int)
    assert isinstance(found.pop("last_timestamp_ms"), int)
    assert found == {"topic": TOPIC, "partition": 1, "producer_id": world.txn_producer_id,
                     "producer_epoch": world.txn_producer_epoch,
                     "current_txn_start_offset": 1}


def groups_list(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "groups", "list")
    assert sorted(doc, key=lambda g: g["group_id"]) == [
        {"group_id": IDLE_GROUP, "state": "Empty"},
        {"group_id": LIVE_GROUP, "state": "Stable"},
    ]
    assert run_json(world.bootstrap, "groups", "list", "--state", "Empty") == [
        {"group_id": IDLE_GROUP, "state": "Empty"}]


def groups_describe(world: World, _request: pytest.FixtureRequest) -> None:
    doc = run_json(world.bootstrap, "groups", "describe", LIVE_GROUP)
    assert isinstance(doc.pop("group_epoch"), int)
    assert isinstance(doc.pop("coordinator_epoch"), int)
    [member] = doc.pop("members")
    assert isinstance(member.pop("member_epoch"), int)
    assert doc == {"group_id": LIVE_GROUP, "state": "Stable"}
    assert member == {
        "member_id": world.member_id, "group_instance_id": None,
        "subscribed_topics": [TOPIC],
        "assignment": [{"topic": TOPIC, "partition": 0}, {"topic": TOPIC, "partition": 1}],
    }


def groups_offsets(world: World, _request: pytest.FixtureRequest) -> None:
    assert run_json(world.bootstrap, "groups", "offsets", LIVE_GROUP) == [
        {"topic": TOPIC, "partition": 0, "committed_offset": 1, "end_offset": 3, "lag": 2,
         "member_id": world.member_id},
        {"topic": TOPIC, "partition": 1, "committed_offset": 1, "end_offset": 1, "lag": 0,
         "member_id": world.member_id},
    ]
    assert run_json(world.bootstrap, "groups", "offsets", IDLE_GROUP) == [
        {"topic": TOPIC, "partition": 0, "committed_offset": 1, "end_offset": 3, "lag": 2,
         "member_id": None},
        {"topic": TOPIC, "partition": 1, "committed_offset": 0, "end_offset": 1, "lag": 1,
         "member_id": None},
    ]


def groups_reset_offsets(world: World, _request: pytest.FixtureRequest) -> None:
    # Without --execute: the plan, and the offsets stay.
    plan = run_json(world.bootstrap, "groups", "reset-offsets", IDLE_GROUP, "--to-latest",
                    "--all-topics")
    assert plan == {"group_id": IDLE_GROUP, "executed": False, "offsets": [
        {"topic": TOPIC, "partition": 0, "current_offset": 1, "new_offset": 3},
        {"topic": TOPIC, "partition": 1, "current_offset": 0, "new_offset": 1},
    ]}
    with Admin(bootstrap=world.bootstrap) as admin:
        assert {tp: o.offset for tp, o in admin.list_group_offsets(IDLE_GROUP).items()} == {
            T0: 1, T1: 0}


def acls_list(_world: World, request: pytest.FixtureRequest) -> None:
    bootstrap, env = request.getfixturevalue("secured")
    doc = run_json(bootstrap, "acls", "list", env=env)
    row = {"host": "*", "resource_type": "topic", "pattern_type": "literal"}
    assert doc == [
        {"principal": "User:golden-ops", "permission": "allow", "operation": "alter",
         "host": "*", "resource_type": "cluster", "resource_name": "oncelog-cluster",
         "pattern_type": "literal"},
        {**row, "principal": "User:golden-alice", "permission": "allow", "operation": "read",
         "resource_name": "orders"},
        {"principal": "User:golden-bob", "permission": "deny", "operation": "write",
         "host": "10.0.0.9", "resource_type": "topic", "resource_name": "orders",
         "pattern_type": "literal"},
        {**row, "principal": "User:golden-alice", "permission": "allow", "operation": "write",
         "resource_name": "pay", "pattern_type": "prefixed"},
    ]
    assert run_json(bootstrap, "acls", "list", "--principal", "User:golden-bob",
                    env=env) == [doc[2]]


CASES: dict[tuple[str, ...], Callable[[World, pytest.FixtureRequest], None]] = {
    ("topics", "list"): topics_list,
    ("topics", "describe"): topics_describe,
    ("partitions", "list-reassignments"): partitions_list_reassignments,
    ("consume",): consume,
    ("transactions", "list"): transactions_list,
    ("transactions", "describe"): transactions_describe,
    ("transactions", "describe-producers"): transactions_describe_producers,
    ("transactions", "find-hanging"): transactions_find_hanging,
    ("groups", "list"): groups_list,
    ("groups", "describe"): groups_describe,
    ("groups", "offsets"): groups_offsets,
    ("groups", "reset-offsets"): groups_reset_offsets,
    ("acls", "list"): acls_list,
}


@pytest.fixture(scope="module")
def moving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Any]]]:
    """A replicated cluster with one move in progress: its bootstrap and
    what list-reassignments must print. The new replica is killed first, so
    it cannot catch up and the move cannot finish."""
    with LocalCluster(tmp_path_factory.mktemp("moving") / "cluster", partition_stores=3,
                      group_coordinators=0, etcd_members=1,
                      env={"ONCELOG_LEASE_TTL_S": "2"}) as cluster:
        with Admin(bootstrap=cluster.bootstrap_servers) as admin:
            admin.create_topic("moving", partitions=1, replication_factor=1)
            [holder] = admin.describe_topic("moving").partitions[0].replicas
        newcomer = next(n for n in (2, 1, 0) if n != holder)
        cluster.kill("partition_store", newcomer)
        alive = ",".join(cluster.address("partition_store", n) for n in range(3)
                         if n != newcomer)
        target = [holder, newcomer]
        with Admin(bootstrap=alive) as admin:
            tp = TopicPartition("moving", 0)
            assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
        yield alive, [{"topic": "moving", "partition": 0, "target_replicas": target}]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A secured cluster holding known ACLs: its bootstrap and the
    environment that makes the CLI connect to it as the super user."""
    with LocalCluster(tmp_path_factory.mktemp("secured") / "cluster", security=True,
                      group_coordinators=0) as cluster:
        admin_config = cluster.client_config("admin")
        with Admin(bootstrap=cluster.bootstrap, **admin_config) as admin:
            admin.create_acls([
                AclBinding(principal="User:golden-alice", resource_type="topic",
                           resource_name="orders", operation="read"),
                AclBinding(principal="User:golden-alice", resource_type="topic",
                           resource_name="pay", pattern_type="prefixed", operation="write"),
                AclBinding(principal="User:golden-bob", resource_type="topic",
                           resource_name="orders", operation="write", permission="deny",
                           host="10.0.0.9"),
                AclBinding(principal="User:golden-ops", resource_type="cluster",
                           resource_name="oncelog-cluster", operation="alter"),
            ])
        yield cluster.bootstrap, {
            "ONCELOG_SECURITY_PROTOCOL": "SSL", "ONCELOG_SSL_CAFILE": admin_config["ssl_cafile"],
            "ONCELOG_SSL_CERTFILE": admin_config["ssl_certfile"],
            "ONCELOG_SSL_KEYFILE": admin_config["ssl_keyfile"],
        }


def test_listing_commands_take_output_json() -> None:
    """Every command outside ACTIONS takes --output json (and ACTIONS names
    only commands that exist)."""
    assert set(COMMANDS) >= ACTIONS, sorted(ACTIONS - set(COMMANDS))
    for path in LISTING:
        output = COMMANDS[path]._option_string_actions.get("--output")
        assert output is not None and output.choices is not None, (
            f"`oncelog {' '.join(path)}` lists something but has no --output option")
        assert "json" in output.choices, path


@pytest.mark.parametrize("path", LISTING, ids=" ".join)
def test_json_output(path: tuple[str, ...], world: World,
                     request: pytest.FixtureRequest) -> None:
    case = CASES.get(path)
    assert case is not None, (
        f"`oncelog {' '.join(path)}` lists something, so it needs a golden case in CASES "
        "(or, if it only acts, a place in ACTIONS)")
    case(world, request)
