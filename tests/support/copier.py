"""Running examples/copier.py as real processes, and checking its output.

Shared by the copier tests in the default run and the long chaos run
(tests/chaos), so both check the same thing the same way.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from oncelog import Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster
from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import group_coordinator_pb2_grpc as gpb_grpc
from tests.support.reading import read_all

REPO = Path(__file__).resolve().parents[2]
COPIER = REPO / "examples" / "copier.py"
KEYS = 40


def produce_input(bootstrap: str, topic: str, records: int, *, duration_s: float = 0.0) -> None:
    """`records` records over KEYS keys; each value is "<key>:<n>" with n
    counting up per key, so order per key can be checked downstream. With
    duration_s, spread evenly over that long (so faults land mid-stream)."""
    per_key: Counter[str] = Counter()
    started = time.monotonic()
    chunk = 100
    with Producer(bootstrap=bootstrap, linger_ms=5) as producer:
        for i in range(records):
            key = f"k{i % KEYS}"
            producer.send(topic, key=key.encode(), value=f"{key}:{per_key[key]}".encode())
            per_key[key] += 1
            if duration_s and i % chunk == chunk - 1:
                ahead_s = started + duration_s * (i + 1) / records - time.monotonic()
                if ahead_s > 0:
                    time.sleep(ahead_s)
        producer.flush()


def produce_in_background(bootstrap: str, topic: str, records: int,
                          duration_s: float) -> threading.Thread:
    thread = threading.Thread(
        target=produce_input, args=(bootstrap, topic, records),
        kwargs={"duration_s": duration_s}, name="input-producer", daemon=True,
    )
    thread.start()
    return thread


@dataclass
class CopierFleet:
    """Copier processes; each restart of an instance reuses its index (and so
    its transactional id, fencing the process it replaces)."""

    bootstrap: str
    input_topic: str
    output_topic: str
    group: str
    log_dir: Path
    extra_args: list[str] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: int = 0

    def start(self, instance: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.log_dir / f"copier-{instance}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[instance] = subprocess.Popen(
            [sys.executable, str(COPIER), "--bootstrap", self.bootstrap,
             "--input", self.input_topic, "--output", self.output_topic,
             "--group", self.group, "--instance", str(instance),
             "--transactional-id-prefix", f"{self.group}-tx", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()

    def kill(self, instance: int) -> None:
        proc = self.procs[instance]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart_exited(self) -> None:
        """A copier that stopped (fenced, or a fatal error after a service
        outage) is started again, as a supervisor would."""
        for instance, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.start(instance)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for path in sorted(self.log_dir.glob("copier-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def committed_offsets(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets (stable ones only), via any group coordinator."""
    for index in range(len(cluster.processes["group_coordinator"])):
        try:
            with grpc.insecure_channel(cluster.address("group_coordinator", index)) as channel:
                resp = gpb_grpc.GroupCoordinatorStub(channel).OffsetFetch(
                    gpb.OffsetFetchRequest(group_id=group, require_stable=True), timeout=5
                )
            return {(p.topic, p.partition): p.offset for p in resp.partitions
                    if not p.error.code}
        except grpc.RpcError:
            continue
    return {}


def wait_until_copied(cluster: LocalCluster, fleet: CopierFleet, partitions: int,
                      timeout_s: float, *, restart_exited: bool = True) -> None:
    with Consumer(bootstrap=cluster.bootstrap, isolation_level="read_committed") as consumer:
        ends = consumer.end_offsets(
            [TopicPartition(fleet.input_topic, p) for p in range(partitions)])
    want = {(tp.topic, tp.partition): off for tp, off in ends.items()}
    deadline = time.monotonic() + timeout_s
    while True:
        if restart_exited:
            fleet.restart_exited()
        got = committed_offsets(cluster, fleet.group)
        if all(got.get(tp, -1) == off for tp, off in want.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"copiers did not finish: committed {got}, want {want}\n{fleet.log_tail()}"
            )
        time.sleep(0.5)


def verify_exactly_once(bootstrap: str, input_topic: str, output_topic: str,
                        partitions: int) -> int:
    """Every input record is in the output exactly once (read_committed), in
    input order per key. Returns the number of records checked."""
    inputs = read_all(bootstrap, input_topic, partitions, isolation_level="read_committed")
    outputs = read_all(bootstrap, output_topic, partitions, isolation_level="read_committed")
    sources = Counter(dict(r.headers or ()).get("src") for r in outputs)
    duplicates = {s: n for s, n in sources.items() if n > 1}
    want = {f"{r.topic}:{r.partition}:{r.offset}".encode(): r for r in inputs}
    missing = [s for s in want if s not in sources]
    unexpected = [s for s in sources if s not in want]
    assert not duplicates, f"{len(duplicates)} input records copied more than once: " \
                           f"{list(duplicates.items())[:5]}"
    assert not missing, f"{len(missing)} input records never copied: {missing[:5]}"
    assert not unexpected, f"output records with no input: {unexpected[:5]}"
    for r in outputs:
        source = want[dict(r.headers or ()).get("src") or b""]
        assert r.value == (source.value or b"").upper() and r.key == source.key
    # Order per key: output offsets of a key's records follow its input order.
    seen: dict[bytes, list[tuple[int, int, int]]] = defaultdict(list)
    for r in outputs:
        n = int((r.value or b"").decode().rsplit(":", 1)[1])
        seen[r.key or b""].append((r.partition, r.offset, n))
    for key, items in seen.items():
        ordered = [n for _p, _o, n in sorted(items)]
        assert ordered == sorted(ordered), f"key {key!r} out of order: {ordered[:20]}"
    return len(outputs)


@dataclass
class Chaos:
    """Kills copier processes and services at random moments, from a thread."""

    cluster: LocalCluster
    fleet: CopierFleet
    seed: int
    interval_s: float
    plan: list[str]
    done: list[str] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self, timeout_s: float = 120) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        rng = random.Random(self.seed)
        try:
            for action in self.plan:
                if self._stop.wait(self.interval_s * rng.uniform(0.5, 1.5)):
                    return
                if action.startswith("copier"):
                    instance = rng.choice(sorted(self.fleet.procs))
                    self.fleet.kill(instance)
                    time.sleep(rng.uniform(0.0, 0.5))
                    self.fleet.start(instance)
                else:
                    self.cluster.kill(action, 0)
                    time.sleep(rng.uniform(0.1, 0.8))
                    self.cluster.restart(action, 0)
                self.done.append(action)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc
