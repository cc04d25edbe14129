"""Timeouts mean what they say, also when nothing answers.

Goal: ClusterClient.metadata(timeout_ms=) and topic(timeout_ms=) (which the
producer builds on; also while another thread's Metadata request holds the
client's refresh lock), Consumer.poll(timeout), position(), committed(),
beginning_offsets(), end_offsets() and partitions_for_topic(), every Admin
call, the CLI's --timeout-ms, and the producer's send (max_block_ms),
flush(timeout), init_transactions(timeout) and commit_transaction(timeout)
return or raise within their budget plus a small margin (the larger of 10 %
and 200 ms) when nothing listens at the address (a dead port) and when the
service is paused with SIGSTOP (it accepts TCP connections but never
answers), whether the client connects afresh or had a working connection
before the pause. The error says in words that nothing answered, names the
address, and for the CLI adds what to do, with no gRPC status text unless
--verbose is given. poll() raises nothing (Kafka's poll returns an empty
batch) but logs the address once.

Method: one LocalCluster per module (a store, a transaction coordinator, a
group coordinator); each case pauses the service it needs and resumes it in a
finally, so the next case finds the cluster whole again. A dead address is a
port bound and closed again. Every call is timed alone (the SDK object is
made outside the timer). The CLI runs as a subprocess that calls the
`oncelog` entry point (oncelog.cli:main); it is timed from the moment the
entry point is about to run (the child prints time.monotonic(), which is
CLOCK_MONOTONIC, shared by every process) to its exit, because starting
Python and importing the SDK (0.5 s or more, varying by 0.2 s on a busy
machine) is not what --timeout-ms governs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from oncelog import (
    AclBinding,
    AclFilter,
    Admin,
    Consumer,
    NewTopic,
    Producer,
    TopicPartition,
    errors,
)
from oncelog._client import ClusterClient
from oncelog.testing import LocalCluster

TIMEOUT_MS = 1_000
# The Admin sweeps make 18 and 17 calls: half the budget keeps the module
# short, and the margin (200 ms) is the same.
SWEEP_TIMEOUT_MS = 500
TOPIC = "timeouts"
GROUP = "timeouts-group"
TP = TopicPartition(TOPIC, 0)
# The `oncelog` command (its entry point), saying when it starts to run.
CLI = [sys.executable, "-c", (
    "import sys, time\n"
    "from oncelog.cli import main\n"
    "print(f'entry-point-at {time.monotonic()}', file=sys.stderr, flush=True)\n"
    "sys.argv[0] = 'oncelog'\n"
    "sys.exit(main())\n"
)]
# gRPC's status text, which the CLI shows only with --verbose.
GRPC_TEXT = re.compile(r"StatusCode|_InactiveRpcError|failed to connect to all addresses|"
                       r"DEADLINE_EXCEEDED|UNAVAILABLE")


# A producer's default max_block_ms is 60 s; refused connections are said
# long before (about a second): this guard is far above that, far below 60 s.
FAIL_FAST_GUARD_S = 15.0


def bound_s(timeout_ms: int) -> float:
    """The promise: the timeout plus the larger of 10 % and 200 ms."""
    return (timeout_ms + max(timeout_ms / 10, 200)) / 1000


def timed(call: Callable[[], object]) -> tuple[float, object]:
    """(elapsed seconds, what the call returned or raised)."""
    started = time.monotonic()
    try:
        outcome = call()
    except Exception as exc:  # the outcome under test
        outcome = exc
    return time.monotonic() - started, outcome


def assert_unreachable(outcome: object, elapsed_s: float, *, address: str, paused: bool,
                       timeout_ms: int = TIMEOUT_MS, names_budget: bool = True) -> None:
    """A KafkaTimeoutError, in time, that says nothing answered at `address`
    (within the whole budget: names_budget; the producer names what was left
    of it when its last request began)."""
    print(f"{elapsed_s:.3f} s of {bound_s(timeout_ms)} s: {outcome!r}")
    assert elapsed_s <= bound_s(timeout_ms), (
        f"took {elapsed_s:.2f} s, more than {bound_s(timeout_ms)} s: {outcome!r}"
    )
    assert isinstance(outcome, errors.KafkaTimeoutError), repr(outcome)
    message = str(outcome)
    assert address in message, message
    within = f"within {timeout_ms} ms" if names_budget else "within "
    if paused:
        assert f"did not answer {within}" in message, message
    else:
        # Refused outright: said as soon as every address refused a few
        # times, naming the time that took, not the whole budget.
        assert f"answered at {address} within " in message, message
        assert "(connection refused)" in message, message
        assert "is the cluster running?" in message, message
    assert not GRPC_TEXT.search(message), message


def test_refused_connections_fail_fast_with_the_addresses_named() -> None:
    """A client whose every bootstrap address refuses the connection (nothing
    listens there) says so in about a second, naming each address, instead
    of waiting out its whole budget (60 s by default for a producer)."""
    addresses = [dead_address(), dead_address()]
    started_s = time.monotonic()
    with (Producer(bootstrap=",".join(addresses)) as producer,
          pytest.raises(errors.KafkaTimeoutError) as refused):
        producer.send(TOPIC, value=b"x").result()
    elapsed_s = time.monotonic() - started_s
    # A failure guard far below the 60 s budget, not a latency expectation.
    assert elapsed_s < FAIL_FAST_GUARD_S, f"took {elapsed_s:.1f} s"
    message = str(refused.value)
    assert all(address in message for address in addresses), message
    assert "(connection refused)" in message and "is the cluster running?" in message


def dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


@contextlib.contextmanager
def paused(cluster: LocalCluster, kind: str, index: int = 0) -> Iterator[str]:
    """The service stopped with SIGSTOP; yields its address."""
    cluster.pause(kind, index)
    try:
        yield cluster.address(kind, index)
    finally:
        cluster.resume(kind, index)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("timeouts") / "cluster") as c:
        with Admin(bootstrap=c.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1)
        with Producer(bootstrap=c.bootstrap) as producer:
            for i in range(3):
                producer.send(TOPIC, value=b"%d" % i, partition=0)
            producer.flush()
        yield c


# ------------------------------------------------------------------ the client


@pytest.mark.parametrize("call", ["metadata", "topic"])
@pytest.mark.parametrize("target", ["dead", "paused"])
def test_cluster_client_calls(cluster: LocalCluster, target: str, call: str) -> None:
    with contextlib.ExitStack() as stack:
        if target == "dead":
            address = dead_address()
        else:
            address = stack.enter_context(paused(cluster, "partition_store"))
        client = ClusterClient(address, request_timeout_ms=30_000)
        stack.callback(client.close)
        if call == "metadata":
            elapsed_s, outcome = timed(lambda: client.metadata(timeout_ms=TIMEOUT_MS))
        else:
            elapsed_s, outcome = timed(lambda: client.topic(TOPIC, timeout_ms=TIMEOUT_MS))
    assert_unreachable(outcome, elapsed_s, address=address, paused=target != "dead")


def test_topic_while_another_thread_waits_for_metadata(cluster: LocalCluster) -> None:
    """The producer's sender refreshes metadata with no budget of its own
    (up to request_timeout_ms per address) while holding the client's
    refresh lock; a caller with a budget waits for that lock no longer than
    its budget, and still names the silent address."""
    client = ClusterClient(cluster.bootstrap, request_timeout_ms=10_000)

    def refresh_without_budget() -> None:
        with contextlib.suppress(errors.OncelogError):
            client.refresh_metadata()

    try:
        client.metadata()  # a connected channel: the next request waits for its answer
        with paused(cluster, "partition_store") as address:
            holder = threading.Thread(target=refresh_without_budget, daemon=True)
            holder.start()
            time.sleep(0.2)  # it holds the lock, waiting for the paused store
            elapsed_s, outcome = timed(lambda: client.topic(TOPIC + "-new",
                                                            timeout_ms=TIMEOUT_MS))
        holder.join(30)
        assert not holder.is_alive()
    finally:
        client.close()
    assert_unreachable(outcome, elapsed_s, address=address, paused=True)


# ------------------------------------------------------------------ the consumer


def consumer_at(bootstrap: str, **options: Any) -> Consumer:
    options.setdefault("default_api_timeout_ms", TIMEOUT_MS)
    return Consumer(bootstrap=bootstrap, **options)


# The consumer's blocking calls, each on a consumer made for it: (name, call).
CONSUMER_CALLS: list[tuple[str, Callable[[Consumer], object]]] = [
    ("position", lambda c: c.position(TP)),
    ("committed", lambda c: c.committed([TP])),
    ("beginning_offsets", lambda c: c.beginning_offsets([TP])),
    ("end_offsets", lambda c: c.end_offsets([TP])),
    ("partitions_for_topic", lambda c: c.partitions_for_topic(TOPIC)),
    # The budget given per call (default_api_timeout_ms is a minute then).
    ("end_offsets(timeout=)", lambda c: c.end_offsets([TP], timeout=TIMEOUT_MS / 1000)),
    ("position(timeout=)", lambda c: c.position(TP, timeout=TIMEOUT_MS / 1000)),
]


def run_consumer_call(bootstrap: str, name: str, call: Callable[[Consumer], object]
                      ) -> tuple[float, object]:
    # request_timeout_ms is not the budget: a call that used it would show.
    api_timeout_ms = 60_000 if name.endswith("(timeout=)") else TIMEOUT_MS
    consumer = consumer_at(bootstrap, group_id=GROUP, request_timeout_ms=30_000,
                           default_api_timeout_ms=api_timeout_ms)
    try:
        consumer.assign([TP])
        return timed(lambda: call(consumer))
    finally:
        consumer.close(timeout=0)


@pytest.mark.parametrize("name, call", CONSUMER_CALLS, ids=[n for n, _c in CONSUMER_CALLS])
def test_consumer_calls_at_a_dead_address(name: str, call: Callable[[Consumer], object]) -> None:
    address = dead_address()
    elapsed_s, outcome = run_consumer_call(address, name, call)
    assert_unreachable(outcome, elapsed_s, address=address, paused=False)


@pytest.mark.parametrize("name, call", CONSUMER_CALLS, ids=[n for n, _c in CONSUMER_CALLS])
def test_consumer_calls_at_a_paused_store(cluster: LocalCluster, name: str,
                                          call: Callable[[Consumer], object]) -> None:
    with paused(cluster, "partition_store") as address:
        elapsed_s, outcome = run_consumer_call(cluster.bootstrap, name, call)
    assert_unreachable(outcome, elapsed_s, address=address, paused=True)


def test_committed_with_a_paused_group_coordinator(cluster: LocalCluster) -> None:
    consumer = consumer_at(cluster.bootstrap, group_id=GROUP)
    try:
        assert consumer.committed([TP]) == {TP: None}  # warm: coordinator found
        with paused(cluster, "group_coordinator") as address:
            elapsed_s, outcome = timed(lambda: consumer.committed([TP]))
    finally:
        consumer.close(timeout=0)
    assert_unreachable(outcome, elapsed_s, address=address, paused=True)


@pytest.mark.parametrize("target", ["dead", "paused", "paused-warm"])
def test_poll_returns_nothing_in_time_and_logs_the_address(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture, target: str
) -> None:
    with contextlib.ExitStack() as stack:
        bootstrap = dead_address() if target == "dead" else cluster.bootstrap
        consumer = stack.enter_context(consumer_at(bootstrap))
        consumer.assign([TP])
        if target == "paused-warm":
            assert consumer.partitions_for_topic(TOPIC) == {0}  # metadata and a channel
            consumer.seek_to_beginning([TP])
        else:
            consumer.seek(TP, 0)
        if target != "dead":
            stack.enter_context(paused(cluster, "partition_store"))
        caplog.set_level(logging.WARNING, logger="oncelog.consumer")
        elapsed_s, outcome = timed(lambda: consumer.poll(timeout=TIMEOUT_MS / 1000))
        # A second poll: nothing is logged again, and it too keeps its time.
        again_s, again = timed(lambda: consumer.poll(timeout=0.3))
    print(f"poll(1.0) {target}: {elapsed_s:.3f} s; poll(0.3): {again_s:.3f} s")
    assert outcome == [] and again == []
    assert elapsed_s <= bound_s(TIMEOUT_MS), f"poll(1.0) took {elapsed_s:.2f} s"
    assert again_s <= bound_s(300), f"poll(0.3) took {again_s:.2f} s"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert bootstrap in warnings[0]
    assert ("did not answer" if target != "dead" else "connection refused") in warnings[0]


# ------------------------------------------------------------------ the admin


# Every public Admin call: (name, call).
ADMIN_CALLS: list[tuple[str, Callable[[Admin], object]]] = [
    ("create_topic", lambda a: a.create_topic("t-new")),
    ("create_topics", lambda a: a.create_topics([NewTopic("t-new", 1)])),
    ("delete_topic", lambda a: a.delete_topic(TOPIC + "-gone")),
    ("delete_topics", lambda a: a.delete_topics([TOPIC + "-gone"])),
    ("create_partitions", lambda a: a.create_partitions({TOPIC: 3})),
    ("list_topics", lambda a: a.list_topics()),
    ("describe_topic", lambda a: a.describe_topic(TOPIC)),
    ("alter_partition_reassignments",
     lambda a: a.alter_partition_reassignments({TopicPartition(TOPIC, 0): [0]})),
    ("list_partition_reassignments", lambda a: a.list_partition_reassignments()),
    ("list_transactions", lambda a: a.list_transactions()),
    ("describe_transaction", lambda a: a.describe_transaction("txn-id")),
    ("abort_transaction", lambda a: a.abort_transaction("txn-id")),
    ("describe_producers", lambda a: a.describe_producers(TP)),
    ("find_hanging_transactions", lambda a: a.find_hanging_transactions()),
    ("abort_hanging_transaction", lambda a: a.abort_hanging_transaction(TP, 1)),
    ("list_groups", lambda a: a.list_groups()),
    ("describe_group", lambda a: a.describe_group(GROUP)),
    ("list_group_offsets", lambda a: a.list_group_offsets(GROUP)),
    ("alter_group_offsets", lambda a: a.alter_group_offsets(GROUP, {TP: 0})),
    ("reset_group_offsets", lambda a: a.reset_group_offsets(GROUP, [TP], to="earliest")),
    ("delete_group", lambda a: a.delete_group(GROUP)),
    ("create_acls", lambda a: a.create_acls([AclBinding(principal="User:a", resource_type="topic",
                                                        resource_name=TOPIC, operation="read")])),
    ("describe_acls", lambda a: a.describe_acls()),
    ("delete_acls", lambda a: a.delete_acls([AclFilter(principal="User:a")])),
]


def test_every_admin_call_at_a_dead_address() -> None:
    address = dead_address()
    # Admin is made of one class per job (TopicsAdmin, ...): its public calls
    # are those of every class in its MRO but object.
    public = {name for cls in Admin.__mro__[:-1] for name in vars(cls)
              if not name.startswith("_") and name != "close" and callable(getattr(Admin, name))}
    assert public == {name for name, _call in ADMIN_CALLS}, "a new Admin call is not tested"
    for name, call in ADMIN_CALLS:
        # request_timeout_ms is not the budget: a call that used it would show.
        with Admin(bootstrap=address, default_api_timeout_ms=SWEEP_TIMEOUT_MS) as admin:
            elapsed_s, outcome = timed(functools.partial(call, admin))
        print(f"{name}: ", end="")
        assert_unreachable(outcome, elapsed_s, address=address, paused=False,
                           timeout_ms=SWEEP_TIMEOUT_MS)


# Paused services, and calls that reach each one: (kind, calls).
PAUSED_CASES: list[tuple[str, list[str]]] = [
    ("partition_store", ["list_topics", "describe_topic", "create_topic"]),
    ("coordinator", ["list_transactions", "describe_transaction", "abort_transaction"]),
    ("group_coordinator", ["list_groups", "describe_group", "list_group_offsets",
                           "alter_group_offsets", "delete_group"]),
]


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "warm"])
@pytest.mark.parametrize("kind, names", PAUSED_CASES, ids=[k for k, _n in PAUSED_CASES])
def test_admin_calls_at_a_paused_service(cluster: LocalCluster, kind: str, names: list[str],
                                         warm: bool) -> None:
    """Fresh: the Admin connects after the pause (gRPC gives up waiting for
    the connection's first frame). Warm: metadata cached and channels
    connected before it (the request's deadline passes)."""
    calls = dict(ADMIN_CALLS)
    for name in names:
        with Admin(bootstrap=cluster.bootstrap,
                   default_api_timeout_ms=SWEEP_TIMEOUT_MS) as admin:
            if warm:
                # Metadata cached, channels connected.
                admin.list_topics()
                admin.list_groups()
                admin.list_transactions()
            with paused(cluster, kind) as address:
                elapsed_s, outcome = timed(functools.partial(calls[name], admin))
        print(f"{kind} {name}{' (warm)' if warm else ''}: ", end="")
        assert_unreachable(outcome, elapsed_s, address=address, paused=True,
                           timeout_ms=SWEEP_TIMEOUT_MS)


# ------------------------------------------------------------------ the CLI


def run_cli(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Runs the CLI; returns the seconds from its entry point to its exit,
    and what it did (stderr without the timing line)."""
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    ended_s = time.monotonic()
    first, _newline, rest = result.stderr.partition("\n")
    started_s = float(first.removeprefix("entry-point-at "))
    result.stderr = rest
    print(f"oncelog {' '.join(args)}: {ended_s - started_s:.3f} s, exit {result.returncode}")
    return ended_s - started_s, result


@pytest.mark.parametrize("command", [["topics", "list"], ["consume", TOPIC],
                                     ["groups", "describe", GROUP]],
                         ids=["topics-list", "consume", "groups-describe"])
def test_cli_at_a_dead_address(command: list[str]) -> None:
    address = dead_address()
    elapsed_s, result = run_cli("--bootstrap", address, "--timeout-ms", str(TIMEOUT_MS),
                                *command)
    assert result.returncode == 1, result
    assert elapsed_s <= bound_s(TIMEOUT_MS), f"the CLI took {elapsed_s:.2f} s"
    assert f"no oncelog service answered at {address} within " in result.stderr
    assert "oncelog cluster up" in result.stderr and "ONCELOG_BOOTSTRAP" in result.stderr
    assert "--bootstrap" in result.stderr
    assert not GRPC_TEXT.search(result.stderr), result.stderr


@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
def test_cli_at_a_paused_store(cluster: LocalCluster, verbose: bool) -> None:
    with paused(cluster, "partition_store") as address:
        elapsed_s, result = run_cli("--bootstrap", address, "--timeout-ms", str(TIMEOUT_MS),
                                    *(["--verbose"] if verbose else []), "topics", "list")
    assert result.returncode == 1, result
    assert elapsed_s <= bound_s(TIMEOUT_MS), f"the CLI took {elapsed_s:.2f} s"
    assert f"{address} did not answer within {TIMEOUT_MS} ms" in result.stderr
    assert "oncelog cluster up" in result.stderr and "ONCELOG_BOOTSTRAP" in result.stderr
    # gRPC's own words only when asked for.
    assert bool(GRPC_TEXT.search(result.stderr)) == verbose, result.stderr


def test_cli_with_a_paused_group_coordinator(cluster: LocalCluster) -> None:
    with paused(cluster, "group_coordinator") as address:
        elapsed_s, result = run_cli("--bootstrap", cluster.bootstrap,
                                    "--timeout-ms", str(TIMEOUT_MS), "groups", "list")
    assert result.returncode == 1, result
    assert elapsed_s <= bound_s(TIMEOUT_MS), f"the CLI took {elapsed_s:.2f} s"
    assert f"group coordinator at {address} did not answer" in result.stderr
    assert f"the cluster at {cluster.bootstrap} answered, but its service at {address}" \
        in result.stderr
    assert not GRPC_TEXT.search(result.stderr), result.stderr


# ------------------------------------------------------------------ the producer


def producer_at(bootstrap: str, **options: Any) -> Producer:
    return Producer(bootstrap=bootstrap, max_block_ms=TIMEOUT_MS, request_timeout_ms=30_000,
                    **options)


def sent(producer: Producer) -> object:
    """send()'s failure, whether raised or in the future it returns."""
    future = producer.send(TOPIC, value=b"x")
    return future.exception(timeout=0) if future.done() else future


def test_producer_calls_at_a_dead_address() -> None:
    address = dead_address()
    with producer_at(address) as producer:
        elapsed_s, outcome = timed(lambda: sent(producer))
        assert_unreachable(outcome, elapsed_s, address=address, paused=False,
                           names_budget=False)
    with producer_at(address, transactional_id="timeouts-dead") as producer:
        elapsed_s, outcome = timed(lambda: producer.init_transactions(TIMEOUT_MS / 1000))
        assert_unreachable(outcome, elapsed_s, address=address, paused=False,
                           names_budget=False)


def test_producer_calls_at_paused_services(cluster: LocalCluster) -> None:
    with producer_at(cluster.bootstrap) as producer:
        producer.send(TOPIC, value=b"warm").result(timeout=30)
        with paused(cluster, "partition_store"):
            producer.send(TOPIC, value=b"stuck")
            elapsed_s, outcome = timed(lambda: producer.flush(TIMEOUT_MS / 1000))
        print(f"flush(1.0) with the store paused: {elapsed_s:.3f} s: {outcome!r}")
        assert isinstance(outcome, errors.KafkaTimeoutError), repr(outcome)
        assert elapsed_s <= bound_s(TIMEOUT_MS)
    with producer_at(cluster.bootstrap, transactional_id="timeouts-paused") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, value=b"in a transaction")
        producer.flush()
        with paused(cluster, "coordinator") as address:
            elapsed_s, outcome = timed(lambda: producer.commit_transaction(TIMEOUT_MS / 1000))
        assert_unreachable(outcome, elapsed_s, address=address, paused=True,
                           names_budget=False)
        # The commit's outcome is not known: it is asked again (and the
        # coordinator answers again).
        producer.commit_transaction()
