"""What one acknowledged send costs below the SDK: the floor that Python's
gRPC puts under any client of ours, beside the SDK and the peer, in the
same run.

The SDK's acknowledged send (bench/peers.py, `latency`) takes about three
times the peer's. This benchmark asks how much of that any Python client on
gRPC would pay, whatever its own code: it sends the same one-record
requests to the same store with nothing of the SDK around them.

Arms, each `--samples` back-to-back acknowledged sends of one 100 B record
at linger 0, over the 4 partitions of a topic in turn (bench/peers.py's
latency shape), after 20 to warm up:

* `sdk`: oncelog's Producer, `send(...).result()` (idempotent, the default);
* `bare-stream`: pre-encoded idempotent batches sent as ProduceRequests on a
  ProduceStream, the caller's thread reading each answer: gRPC's sync stack
  with none of the SDK's threads (gRPC's own thread still drains the
  request iterator: one thread hand-over per send, where the SDK's path has
  four: to its sender, to gRPC, from the stream's reader to the sender, to
  the future's waiter);
* `bare-unary`: the same requests as blocking unary Produce calls;
* `aio-stream`: the same requests on a grpc.aio ProduceStream whose event
  loop runs on a thread of its own, the caller handing each request over
  and waiting for its answer (the shape an asyncio transport in the SDK
  would have);
* `peer`: librdkafka against Tansu (bench/peers.py's acknowledged send).

The oncelog arms run on a fresh one-store cluster per round and client
transport, in a child process: gRPC chooses its TCP implementation once,
when it is imported, so the client's `default` (EventEngine) and `classic`
(GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener) each need a
process of their own. The services always run the classic one
(services/common/kernel/grpc_engine.py). Rounds alternate the order of the
peer and the oncelog children; the table gives each arm's median p50 and
p99 with the min–max over the rounds.

    .venv/bin/python bench/transport_floor.py                   # 3 rounds, 2,000 samples
    .venv/bin/python bench/transport_floor.py --rounds 1 --samples 50 --no-peer  # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# Run as a script (`python bench/transport_floor.py`), the repository root is
# not on sys.path; the sibling benchmarks are imported as the package `bench`.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from bench import peers, pipeline, produce  # noqa: E402
from oncelog import Admin, Producer  # noqa: E402
from oncelog import records as rec  # noqa: E402
from oncelog.testing import LocalCluster  # noqa: E402
from oncelog.v1 import partition_store_pb2 as ps  # noqa: E402
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc  # noqa: E402
from services.common.kernel.grpc_engine import (  # noqa: E402
    CLASSIC_TCP_EXPERIMENTS,
    GRPC_EXPERIMENTS_ENV,
)

WARM_UP = 20
ARMS = ("sdk", "bare-stream", "bare-unary", "aio-stream")
ENGINES = ("default", "classic")
PEER_ARM = "peer"
# A failure guard for each request of the bare arms, not an expectation.
REQUEST_TIMEOUT_S = 30.0


# --- the child: every oncelog arm on one cluster, with one client transport --------


def run_child(samples: int) -> dict[str, list[float]]:
    """Every oncelog arm in turn on a fresh one-store cluster; seconds per
    acknowledged send, by arm."""
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(pipeline.OUTPUT, partitions=pipeline.PARTITIONS)
        return {
            "sdk": sdk_sends(cluster.bootstrap, samples),
            "bare-stream": BareSends(cluster.bootstrap, samples).on_stream(),
            "bare-unary": BareSends(cluster.bootstrap, samples).unary(),
            "aio-stream": BareSends(cluster.bootstrap, samples).on_aio_stream(),
        }


def sdk_sends(bootstrap: str, samples: int) -> list[float]:
    value = pipeline.value_of(0, peers.SMALL_BYTES)
    times_s: list[float] = []
    with Producer(bootstrap=bootstrap, linger_ms=0) as producer:
        for i in range(WARM_UP + samples):
            t0 = time.perf_counter()
            producer.send(pipeline.OUTPUT, value=value,
                          partition=i % pipeline.PARTITIONS).result()
            if i >= WARM_UP:
                times_s.append(time.perf_counter() - t0)
    return times_s


class BareSends:
    """Idempotent one-record ProduceRequests to a one-store cluster (its
    bootstrap is the store), every batch encoded before the clock starts:
    what remains is gRPC and the store."""

    def __init__(self, bootstrap: str, samples: int) -> None:
        self._address = bootstrap
        self._channel = grpc.insecure_channel(bootstrap)
        self._stub = ps_grpc.PartitionStoreStub(self._channel)
        producer_id = produce.init_producer_id(self._stub)
        value = pipeline.value_of(0, peers.SMALL_BYTES)
        sequences = [0] * pipeline.PARTITIONS
        self.requests = []
        for i in range(WARM_UP + samples):
            partition = i % pipeline.PARTITIONS
            batch = rec.encode_batch([(None, value, None, int(time.time() * 1000))],
                                     producer_id=producer_id, producer_epoch=0,
                                     base_sequence=sequences[partition])
            sequences[partition] = rec.next_sequence(sequences[partition])
            self.requests.append(ps.ProduceRequest(
                batches=[ps.PartitionBatch(topic=pipeline.OUTPUT, partition=partition,
                                           batch=batch)],
                timeout_ms=int(REQUEST_TIMEOUT_S * 1000), request_id=i + 1))

    def _timed(self, send_one: Callable[[Any], Any]) -> list[float]:
        times_s: list[float] = []
        for i, request in enumerate(self.requests):
            t0 = time.perf_counter()
            answer = send_one(request)
            elapsed_s = time.perf_counter() - t0
            error = answer.results[0].error
            if error.code != 0:
                raise RuntimeError(f"send {i} was refused: {error.message}")
            if i >= WARM_UP:
                times_s.append(elapsed_s)
        return times_s

    def unary(self) -> list[float]:
        try:
            return self._timed(lambda request: self._stub.Produce(request,
                                                                  timeout=REQUEST_TIMEOUT_S))
        finally:
            self._channel.close()

    def on_stream(self) -> list[float]:
        outgoing: queue.Queue[Any] = queue.Queue()

        def requests() -> Iterator[Any]:
            while (request := outgoing.get()) is not None:
                yield request

        call = self._stub.ProduceStream(requests(), timeout=REQUEST_TIMEOUT_S * 10)
        answers = iter(call)

        def send_one(request: Any) -> Any:
            outgoing.put(request)
            return next(answers)

        try:
            return self._timed(send_one)
        finally:
            outgoing.put(None)
            call.cancel()
            self._channel.close()

    def on_aio_stream(self) -> list[float]:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="aio-floor", daemon=True)
        thread.start()
        waiting: dict[int, Future[Any]] = {}

        async def open_stream() -> Any:
            channel = grpc.aio.insecure_channel(self._address)
            # Typed for the sync stack, whose streams take an iterator;
            # grpc.aio's are written to instead.
            stub: Any = ps_grpc.PartitionStoreStub(channel)
            call = stub.ProduceStream()

            async def read() -> None:
                async for answer in call:
                    waiting.pop(answer.request_id).set_result(answer)

            reader = asyncio.ensure_future(read())
            return channel, call, reader

        channel, call, reader = asyncio.run_coroutine_threadsafe(open_stream(), loop).result()

        # grpc.aio takes one write at a time on a call, and an answer can
        # come back before its write has completed: the next write waits.
        write_lock = asyncio.Lock()

        async def write(request: Any) -> None:
            async with write_lock:
                await call.write(request)

        def hand_over(request: Any, answer: Future[Any]) -> None:
            waiting[request.request_id] = answer
            asyncio.ensure_future(write(request))

        def send_one(request: Any) -> Any:
            answer: Future[Any] = Future()
            loop.call_soon_threadsafe(hand_over, request, answer)
            return answer.result(timeout=REQUEST_TIMEOUT_S)

        async def close() -> None:
            async with write_lock:
                await call.done_writing()
            await reader
            await channel.close()

        try:
            return self._timed(send_one)
        finally:
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=REQUEST_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            self._channel.close()


# --- the parent: rounds, the peer and the table ---------------------------------------


def child_env(engine: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    if engine == "classic":
        env[GRPC_EXPERIMENTS_ENV] = CLASSIC_TCP_EXPERIMENTS
    return env


def oncelog_round(engine: str, samples: int) -> dict[str, list[float]]:
    out = subprocess.run([sys.executable, __file__, "--child", "--samples", str(samples)],
                         env=child_env(engine), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the {engine} child failed:\n{out.stderr[-3000:]}")
    times: dict[str, list[float]] = json.loads(out.stdout)
    return times


def peer_round(samples: int) -> list[float]:
    with peers.tansu_broker() as broker:
        peers.peer_create_topics(broker.bootstrap, [pipeline.OUTPUT], pipeline.PARTITIONS)
        return peers.peer_send_latencies(broker.bootstrap, samples, warm_up=WARM_UP)


def p50_p99_ms(times_s: Sequence[float]) -> tuple[float, float]:
    return (round(statistics.median(times_s) * 1000, 3),
            round(pipeline.percentile(times_s, 0.99) * 1000, 3))


def label(arm: str, engine: str) -> str:
    return arm if arm == PEER_ARM else f"{arm}, client on {engine}"


def run_rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per round and arm: {round, arm, p50_ms, p99_ms}."""
    rows: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        steps: list[str] = list(args.engines) + ([PEER_ARM] if args.peer else [])
        if round_no % 2 == 0:
            steps.reverse()
        for step in steps:
            if step == PEER_ARM:
                results = {label(PEER_ARM, ""): peer_round(args.samples)}
            else:
                results = {label(arm, step): times
                           for arm, times in oncelog_round(step, args.samples).items()}
            for name, times in results.items():
                p50, p99 = p50_p99_ms(times)
                rows.append({"round": round_no, "arm": name, "p50_ms": p50, "p99_ms": p99})
                print(f"# round {round_no} {name:32} p50 {p50:.3f} ms p99 {p99:.3f} ms",
                      flush=True)
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: the median over the rounds of its p50 and p99, with the
    min–max, and its p50 over the peer's (None without the peer)."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    table: list[dict[str, Any]] = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        entry: dict[str, Any] = {"arm": arm}
        for key in ("p50_ms", "p99_ms"):
            values = [r[key] for r in mine]
            entry[key] = (statistics.median(values), min(values), max(values))
        table.append(entry)
    peer = next((e for e in table if e["arm"] == PEER_ARM), None)
    for entry in table:
        entry["p50_over_peer"] = (round(entry["p50_ms"][0] / peer["p50_ms"][0], 2)
                                  if peer and peer["p50_ms"][0] else None)
    return table


def render(table: Sequence[dict[str, Any]]) -> str:
    def cell(figure: tuple[float, float, float]) -> str:
        median, low, high = figure
        return f"{median:.3f} ms" + ("" if low == high else f" ({low:.3f}–{high:.3f})")

    lines = ["| arm | p50 | p99 | p50 / peer's |", "|---|---|---|---|"]
    for e in table:
        ratio = "—" if e["p50_over_peer"] is None else f"{e['p50_over_peer']:.2f}"
        lines.append(f"| {e['arm']} | {cell(e['p50_ms'])} | {cell(e['p99_ms'])} | {ratio} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2000,
                        help="acknowledged sends per arm and round, after 20 to warm up")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"the client's gRPC TCP, comma-separated, of: {', '.join(ENGINES)}")
    parser.add_argument("--no-peer", dest="peer", action="store_false",
                        help="leave the peer out (it needs the `bench` extra)")
    parser.add_argument("--json", help="also write every round and the table to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or not args.engines:
        parser.error(f"--engines: {', '.join(unknown) or 'none given'}; "
                     f"known: {', '.join(ENGINES)}")
    if args.rounds < 1 or args.samples < 1:
        parser.error("--rounds and --samples must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args.samples)))
        return []
    if args.peer:
        peers.ensure_peer()
    print(f"# {os.cpu_count()} CPUs; {args.rounds} round(s); {args.samples} samples per arm; "
          f"client transports {', '.join(args.engines)}; peer "
          f"{'included' if args.peer else 'left out'}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    rows = run_rounds(args)
    table = summary(rows)
    print()
    print(f"medians over {args.rounds} round(s) (min–max over the rounds); "
          f"load average at the end {os.getloadavg()[0]:.2f}")
    print(render(table), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items()},
                       "rounds": rows, "table": table}, f, indent=2)
    return table


if __name__ == "__main__":
    main()
