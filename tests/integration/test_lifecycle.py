"""Health checking, reflection, graceful shutdown and structured logs of the
services.

Goal: each service answers gRPC health checks (SERVING, for "" and its own
service name) and reflection; on SIGTERM the health status flips to
NOT_SERVING at once and stays answerable while the process drains: the
hand-over step before the drain (a store's controlled shutdown) runs while
new requests are still served, then new requests are refused with
SHUTTING_DOWN (retriable), requests already running finish and get their
answers, then the process snapshots and exits with code 0 within a bound;
an extra health status (a store's "in sync") follows its condition; a
request that outlives the grace period is cancelled rather than holding the
process. SIGTERM of the partition store under a running idempotent producer
loses no acknowledged record: every send whose future resolved is read back
at its offset after the restart, once, and the restart replays nothing (the
shutdown snapshot covered it all). With ONCELOG_LOG_FORMAT=json
(configuration from the environment) every log line is one JSON object.

Method: ServiceServer (services/common/rpc/server_base.py) in-process, serving a
real gRPC server on 127.0.0.1 whose one method blocks on an event the test
controls, so "a request is in flight" is a fact, not a race; and real
processes under LocalCluster for the rest, watched through the health
service's Watch stream (it delivers the NOT_SERVING update before the
server stops). Every wait is bounded by a generous deadline that only turns
a hang into a failure; no assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from oncelog import Admin, Producer
from oncelog._batching import RecordFuture
from oncelog.errors import ErrorCode
from oncelog.testing import STOP_TIMEOUT_S, LocalCluster
from oncelog.v1 import coordinator_pb2 as pb
from oncelog.v1 import coordinator_pb2_grpc as pb_grpc
from oncelog.wire.status import error_from_rpc
from services.common.rpc.server_base import ServiceServer
from services.partition_store.rpc.servicer import SERVICE_NAME as STORE_SERVICE
from tests.support.reading import read_all

COORDINATOR_SERVICE = pb.DESCRIPTOR.services_by_name["TransactionCoordinator"].full_name
SERVICE_NAMES = {"partition_store": STORE_SERVICE, "coordinator": COORDINATOR_SERVICE}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Failure guard for waits that end as soon as their condition holds.
DEADLINE_S = 60.0


# ------------------------------------------------- the drain, step by step


class _BlockingCoordinator(pb_grpc.TransactionCoordinatorServicer):
    """FindCoordinator waits until the test releases it: an RPC in flight."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def FindCoordinator(  # noqa: N802 - gRPC method name
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindCoordinatorResponse:
        self.entered.set()
        await self.release.wait()
        return pb.FindCoordinatorResponse(node_id=7, address=request.key)


async def _wait_for(what: str, check: object) -> None:
    give_up_at = time.monotonic() + DEADLINE_S
    while not await check():  # type: ignore[operator]
        if time.monotonic() > give_up_at:
            raise AssertionError(f"{what}: not within {DEADLINE_S} s")
        await asyncio.sleep(0.01)


def _start(servicer: _BlockingCoordinator, events: list[str], *, grace_ms: int,
           before_draining: Callable[[], Awaitable[None]] | None = None,
           health_checks: Mapping[str, Callable[[], bool]] | None = None) -> ServiceServer:
    async def draining() -> None:
        events.append("draining")

    async def shutdown() -> None:
        events.append("on_shutdown")

    return ServiceServer(
        service_name="test-coordinator", full_service_names=[COORDINATOR_SERVICE],
        register=lambda server: pb_grpc.add_TransactionCoordinatorServicer_to_server(
            servicer, server),
        shutdown_grace_ms=grace_ms, on_draining=draining, on_shutdown=shutdown,
        before_draining=before_draining, health_checks=health_checks,
    )


def test_shutdown_answers_not_serving_refuses_new_requests_and_finishes_running_ones() -> None:
    async def scenario() -> None:
        # The generated base is abstract for mypy; the others answer UNIMPLEMENTED.
        servicer = _BlockingCoordinator()  # type: ignore[abstract]
        events: list[str] = []
        server = _start(servicer, events, grace_ms=600_000)
        port = await server.start("127.0.0.1:0")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = pb_grpc.TransactionCoordinatorStub(channel)

            async def status(service: str = "") -> int:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service),
                                           timeout=10)
                return int(reply.status)

            assert await status() == NOT_SERVING  # bound, not yet serving
            await server.set_serving()
            assert await status() == SERVING
            assert await status(COORDINATOR_SERVICE) == SERVING

            running = asyncio.ensure_future(stub.FindCoordinator(
                pb.FindCoordinatorRequest(key="in-flight"), timeout=DEADLINE_S))
            await asyncio.wait_for(servicer.entered.wait(), DEADLINE_S)
            stopping = asyncio.ensure_future(server.shutdown())

            async def not_serving() -> bool:
                return await status() == NOT_SERVING
            await _wait_for("health NOT_SERVING after shutdown began", not_serving)
            assert await status(COORDINATOR_SERVICE) == NOT_SERVING

            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.FindCoordinator(pb.FindCoordinatorRequest(key="new"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert ErrorCode.from_wire(error_from_rpc(refused.value).code) \
                is ErrorCode.SHUTTING_DOWN
            # Draining: the shutdown waits for the running request (its grace
            # is ten minutes), which waits for the test.
            assert not stopping.done()
            assert events == ["draining"]

            servicer.release.set()
            reply = await running
            assert (reply.node_id, reply.address) == (7, "in-flight")
            await asyncio.wait_for(stopping, DEADLINE_S)
            assert events == ["draining", "on_shutdown"]

    asyncio.run(scenario())


def test_the_hand_over_runs_while_requests_are_still_served_and_before_the_drain() -> None:
    """A store hands its leaderships over before it drains: meanwhile it must
    answer (as a follower) rather than refuse with SHUTTING_DOWN, and
    probes must already see it going (NOT_SERVING)."""
    async def scenario() -> None:
        servicer = _BlockingCoordinator()  # type: ignore[abstract]
        servicer.release.set()  # answers at once
        events: list[str] = []
        handing_over = asyncio.Event()
        handed_over = asyncio.Event()

        async def hand_over() -> None:
            events.append("hand-over")
            handing_over.set()
            await handed_over.wait()

        server = _start(servicer, events, grace_ms=10_000, before_draining=hand_over)
        port = await server.start("127.0.0.1:0")
        await server.set_serving()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            stub = pb_grpc.TransactionCoordinatorStub(channel)
            stopping = asyncio.ensure_future(server.shutdown())
            await asyncio.wait_for(handing_over.wait(), DEADLINE_S)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert reply.status == NOT_SERVING
            answered = await stub.FindCoordinator(pb.FindCoordinatorRequest(key="during"),
                                                  timeout=10)
            assert answered.address == "during"
            assert events == ["hand-over"] and not stopping.done()
            handed_over.set()
            await asyncio.wait_for(stopping, DEADLINE_S)
            assert events == ["hand-over", "draining", "on_shutdown"]

    asyncio.run(scenario())


def test_an_extra_health_status_follows_its_condition_until_shutdown() -> None:
    async def scenario() -> None:
        servicer = _BlockingCoordinator()  # type: ignore[abstract]
        in_sync = [False]
        # Holds the shutdown at its first step, so the status can be read.
        checked = asyncio.Event()

        async def held() -> None:
            await checked.wait()

        server = _start(servicer, [], grace_ms=1_000, before_draining=held,
                        health_checks={"test.InSync": lambda: in_sync[0]})
        port = await server.start("127.0.0.1:0")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service),
                                           timeout=10)
                return int(reply.status)

            def becomes(service: str, wanted: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return await status(service) == wanted
                return check

            assert await status("test.InSync") == NOT_SERVING  # not serving yet
            await server.set_serving()
            assert await status("") == SERVING
            await _wait_for("serving, not in sync", becomes("test.InSync", NOT_SERVING))
            in_sync[0] = True
            await _wait_for("in sync", becomes("test.InSync", SERVING))
            in_sync[0] = False
            await _wait_for("out of sync again", becomes("test.InSync", NOT_SERVING))
            in_sync[0] = True
            await _wait_for("in sync again", becomes("test.InSync", SERVING))
            stopping = asyncio.ensure_future(server.shutdown())
            await _wait_for("NOT_SERVING once stopping", becomes("test.InSync", NOT_SERVING))
            in_sync[0] = True  # the condition no longer counts
            await asyncio.sleep(0.5)
            assert await status("test.InSync") == NOT_SERVING
            checked.set()
            await asyncio.wait_for(stopping, DEADLINE_S)

    asyncio.run(scenario())


def test_a_request_that_outlives_the_grace_is_cancelled_and_shutdown_completes() -> None:
    async def scenario() -> None:
        servicer = _BlockingCoordinator()  # type: ignore[abstract]  # never released
        events: list[str] = []
        server = _start(servicer, events, grace_ms=200)
        port = await server.start("127.0.0.1:0")
        await server.set_serving()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TransactionCoordinatorStub(channel)
            running = asyncio.ensure_future(stub.FindCoordinator(
                pb.FindCoordinatorRequest(key="stuck"), timeout=DEADLINE_S))
            await asyncio.wait_for(servicer.entered.wait(), DEADLINE_S)
            await asyncio.wait_for(server.shutdown(), DEADLINE_S)
            assert events == ["draining", "on_shutdown"]
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await running
            assert ended.value.code() in (grpc.StatusCode.CANCELLED,
                                          grpc.StatusCode.UNAVAILABLE)

    asyncio.run(scenario())


# ------------------------------------------------------- real processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # JSON logs configured through the environment, as a container would.
    with LocalCluster(tmp_path_factory.mktemp("lifecycle") / "cluster", group_coordinators=0,
                      env={"ONCELOG_LOG_FORMAT": "json"}) as c:
        yield c


@pytest.mark.parametrize("kind", ["partition_store", "coordinator"])
def test_health_and_reflection(cluster: LocalCluster, kind: str) -> None:
    with grpc.insecure_channel(cluster.address(kind)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAMES[kind]):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == SERVING, service
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        [answer] = list(reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        listed = {s.name for s in answer.list_services_response.service}
        assert listed >= {SERVICE_NAMES[kind], "grpc.health.v1.Health",
                          "grpc.reflection.v1alpha.ServerReflection"}


@pytest.mark.parametrize("kind", ["coordinator", "partition_store"])
def test_sigterm_flips_health_to_not_serving_and_exits_within_the_bound(
        cluster: LocalCluster, kind: str) -> None:
    proc = cluster.processes[kind][0]
    assert proc.process is not None
    with grpc.insecure_channel(proc.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAMES[kind]), timeout=DEADLINE_S)
        statuses = [next(watch).status]
        proc.process.send_signal(signal.SIGTERM)
        try:
            for update in watch:
                statuses.append(update.status)
        except grpc.RpcError as exc:
            # The stream ends when the server stops, after the update.
            assert exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), exc
    assert statuses == [SERVING, NOT_SERVING]
    # The bound: LocalCluster's graceful-stop budget (SIGKILL after it).
    assert cluster.wait_exit(kind, timeout_s=STOP_TIMEOUT_S) == 0, cluster.log_tail(kind)
    log = cluster.log_tail(kind, lines=10)
    assert "draining" in log and "stopped" in log, log
    cluster.restart(kind)


def _metric(cluster: LocalCluster, kind: str, name: str) -> float:
    with urllib.request.urlopen(cluster.metrics_url(kind), timeout=30) as resp:
        body = resp.read().decode()
    match = re.search(rf"^{name} (\S+)$", body, re.MULTILINE)
    assert match, f"{name} not exported by {kind}"
    return float(match.group(1))


def test_sigterm_of_the_store_under_load_loses_no_acknowledged_record(
        cluster: LocalCluster, topic_name: str) -> None:
    partitions = 3
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=partitions)
    sent: list[tuple[bytes, RecordFuture]] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(bootstrap=cluster.bootstrap, linger_ms=1) as producer:
                i = 0
                while not stop.is_set():
                    value = b"v-%d" % i
                    sent.append((value, producer.send(topic_name, value=value)))
                    i += 1
                    if i % 50 == 0:
                        time.sleep(0.005)  # keep the pace a 2-core machine can share
                producer.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failure.append(exc)

    def acknowledged() -> int:
        return sum(1 for _v, f in list(sent) if f.done() and f.exception() is None)

    def wait_acknowledged(count: int) -> None:
        give_up_at = time.monotonic() + DEADLINE_S
        while acknowledged() < count:
            assert not failure, failure
            assert time.monotonic() < give_up_at, f"fewer than {count} sends acknowledged"
            time.sleep(0.01)

    thread = threading.Thread(target=produce, name="load")
    thread.start()
    try:
        wait_acknowledged(500)
        assert cluster.terminate("partition_store") == 0, cluster.log_tail("partition_store")
        acked_before_restart = acknowledged()
        cluster.restart("partition_store")
        # Recovery replays nothing: the shutdown snapshot covered every partition.
        assert _metric(cluster, "partition_store",
                       "oncelog_store_recovery_replayed_batches") == 0
        wait_acknowledged(acked_before_restart + 500)
    finally:
        stop.set()
        thread.join(DEADLINE_S)
    assert not failure, failure
    acked: dict[bytes, tuple[int, int]] = {}
    for value, future in sent:
        meta = future.result(timeout=DEADLINE_S)  # every send was delivered in the end
        acked[value] = (meta.partition, meta.offset)
    records = read_all(cluster.bootstrap, topic_name, partitions, expected=len(acked))
    stored = {(r.partition, r.offset): r.value for r in records}
    assert len(records) == len(stored) == len(acked)  # none twice
    assert {value: at for value, at in acked.items() if stored.get(at) != value} == {}


def test_json_logs_are_one_object_per_line(cluster: LocalCluster) -> None:
    # A stop and start of the coordinator, so its log has every phase.
    assert cluster.terminate("coordinator") == 0
    cluster.restart("coordinator")
    for kind in ("partition_store", "coordinator"):
        lines = Path(cluster.processes[kind][0].log_path).read_text().splitlines()
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"{kind}: not a JSON line: {line!r}") from None
        assert entries
        for entry in entries:
            assert {"ts_ms", "level", "service", "logger", "msg"} <= set(entry), entry
            assert entry["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
            assert isinstance(entry["ts_ms"], int)
        messages = [e["msg"] for e in entries]
        assert any("serving on" in m for m in messages)
        assert any("draining" in m for m in messages)
        assert any(m.endswith("stopped") for m in messages)


def test_json_logs_wrap_what_native_code_and_a_crash_write_to_stderr(tmp_path: Path) -> None:
    """gRPC's C core writes its own log lines to stderr, and a crash prints a
    traceback there; in JSON mode those arrive as JSON lines too, the last
    traceback included."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import logging, os\n"
        "from oncelog_server.common.rpc.server_base import configure_logging\n"
        "configure_logging('json', 'INFO', 'probe')\n"
        "logging.getLogger('oncelog.probe').info('from logging')\n"
        "os.write(2, b'I1122 17:13:17.281398   19726 chttp2_transport.cc:1403] Got goaway\\n')\n"
        "raise RuntimeError('the crash')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=DEADLINE_S, cwd=Path(__file__).resolve().parents[2],
                            check=False)
    assert result.returncode == 1
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert {(e["level"], e["logger"], e["service"]) for e in entries} >= {
        ("INFO", "oncelog.probe", "probe"), ("INFO", "grpc", "probe"),
        ("ERROR", "stderr", "probe")}
    messages = [e["msg"] for e in entries]
    assert "from logging" in messages
    assert any(m.endswith("] Got goaway") for m in messages)
    assert "RuntimeError: the crash" in messages

