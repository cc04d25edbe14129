"""Rebalancing a consumer group with real processes: join, leave, crash.

Goal: while three group consumers join, one leaves (close()) and one is
killed (SIGKILL, so only its session timeout removes it), no partition ever
has two owners and no record is processed by two members at the same time;
after every change the group settles with each partition owned by exactly
one member; and no record is skipped: once the last member has caught up,
every record in the topic was processed by someone.

Method: LocalCluster (one store, one transaction coordinator, one group
coordinator); each member is a process (tests/support/group_member.py)
that logs, with CLOCK_MONOTONIC times shared by all processes, when each
ownership starts (on_assign begins) and ends (on_revoke/on_lost end, or the
SIGKILL), and every record it processed. A producer in the test keeps
writing throughout. The checker rebuilds each member's ownership intervals
per partition from the log and requires, per partition, that intervals do
not overlap and that every processed record falls inside an interval of the
member that processed it. Waits are bounded loops on the log (failure
guards, not timings); the session timeout is 3 s to keep the test short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster

PARTITIONS = 6
SESSION_MS = 3_000
GROUP = "rebalancing"
TOPIC = "rebalance-in"
WAIT_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", consumer_offsets_partitions=2) as c:
        with Admin(bootstrap=c.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)
        yield c


@dataclass
class Interval:
    member: str
    partition: int
    start_ns: int
    end_ns: int | None = None
    generation: int = -1


@dataclass
class History:
    """The shared log, read back: ownership intervals and processed records."""

    intervals: list[Interval] = field(default_factory=list)
    records: list[tuple[str, int, int, int]] = field(default_factory=list)  # member, p, offset, t
    events: list[dict[str, object]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path, killed: dict[str, int]) -> History:
        history = cls()
        open_: dict[tuple[str, int], Interval] = {}
        text = path.read_text() if path.exists() else ""
        # A line without its newline is still being written by a member (a
        # read can see part of a concurrent append) or was cut by a kill -9:
        # it is not an event yet.
        lines = text.splitlines()[:-1] if text and not text.endswith("\n") else text.splitlines()
        events = sorted((json.loads(line) for line in lines), key=lambda e: e["t"])
        history.events = events
        for e in events:
            member, t = str(e["m"]), int(e["t"])
            if e["e"] == "assign":
                for p in e["p"]:
                    assert (member, p) not in open_, f"{member} assigned {p} twice: {e}"
                    interval = Interval(member, p, t, generation=int(e["gen"]))
                    open_[(member, p)] = interval
                    history.intervals.append(interval)
            elif e["e"] in ("revoke", "lost"):
                for p in e["p"]:
                    open_.pop((member, p)).end_ns = t
            elif e["e"] == "records":
                history.records += [(member, p, o, t) for p, o in e["r"]]
        for (member, _p), interval in open_.items():
            if member in killed:
                interval.end_ns = killed[member]  # it did nothing after the kill
        return history

    def owners(self) -> dict[int, set[str]]:
        """Who owns each partition now (intervals not ended)."""
        out: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}
        for i in self.intervals:
            if i.end_ns is None:
                out[i.partition].add(i.member)
        return out


class Members:
    def __init__(self, cluster: LocalCluster, log: Path) -> None:
        self.cluster = cluster
        self.log = log
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: dict[str, int] = {}

    def start(self, name: str) -> None:
        err = open(self.log.with_name(f"{name}.stderr"), "wb")  # noqa: SIM115 - child's
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "oncelog_local.child", str(os.getpid()), sys.executable, "-m",
             "tests.support.group_member", "--bootstrap", self.cluster.bootstrap,
             "--group", GROUP, "--topic", TOPIC, "--name", name, "--log", str(self.log),
             "--session-timeout-ms", str(SESSION_MS)],
            stdout=subprocess.DEVNULL, stderr=err,
        )

    def leave(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0, self.stderr(name)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.kill()
        proc.wait(timeout=WAIT_S)
        self.killed[name] = time.monotonic_ns()

    def stderr(self, name: str) -> str:
        return self.log.with_name(f"{name}.stderr").read_text(errors="replace")[-3000:]

    def history(self) -> History:
        return History.read(self.log, self.killed)

    def wait_until_owned_by(self, names: set[str]) -> History:
        """Waits until every partition has exactly one owner, the owners are
        exactly `names`, and each owns one or more partitions."""
        deadline = time.monotonic() + WAIT_S
        while True:
            history = self.history()
            owners = history.owners()
            if (all(len(o) == 1 for o in owners.values())
                    and set().union(*owners.values()) == names):
                return history
            for name, proc in self.procs.items():
                if name not in self.killed and proc.poll() not in (None, 0):
                    raise AssertionError(f"member {name} died:\n{self.stderr(name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the group did not settle on {sorted(names)}: {owners}")
            time.sleep(0.05)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class Writer:
    """Keeps producing records, round-robin over the partitions, until stopped."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(bootstrap=bootstrap, linger_ms=1)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stopped.wait(0.005):
            self.producer.send(TOPIC, value=str(n).encode(), partition=n % PARTITIONS)
            n += 1

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.producer.flush()
        self.producer.close()


def check(history: History) -> None:
    by_partition: dict[int, list[Interval]] = {}
    for interval in history.intervals:
        by_partition.setdefault(interval.partition, []).append(interval)
    for p, intervals in by_partition.items():
        intervals.sort(key=lambda i: i.start_ns)
        for before, after in zip(intervals, intervals[1:], strict=False):
            assert before.end_ns is not None and before.end_ns < after.start_ns, (
                f"partition {p} had two owners at once: {before} and {after}")
    for member, p, offset, t in history.records:
        assert any(i.member == member and i.partition == p and i.start_ns < t
                   and (i.end_ns is None or t < i.end_ns) for i in by_partition[p]), (
            f"{member} processed {p}@{offset} at {t} outside its ownership of {p}: "
            f"{by_partition[p]}")
    assert not [e for e in history.events if e["e"] == "lost"], "a live member lost partitions"


def test_join_leave_and_crash_keep_one_owner_per_partition(
        cluster: LocalCluster, tmp_path: Path) -> None:
    members = Members(cluster, tmp_path / "events.jsonl")
    writer = Writer(cluster.bootstrap)
    try:
        for name in ("a", "b", "c"):
            members.start(name)
        members.wait_until_owned_by({"a", "b", "c"})
        members.leave("a")
        members.wait_until_owned_by({"b", "c"})
        members.kill("b")
        members.wait_until_owned_by({"c"})
        writer.stop()
        # c catches up: then every record was processed by someone.
        with Admin(bootstrap=cluster.bootstrap) as admin:
            deadline = time.monotonic() + WAIT_S
            while True:
                offsets = admin.list_group_offsets(GROUP)
                if len(offsets) == PARTITIONS and all(o.lag == 0 for o in offsets.values()):
                    break
                assert time.monotonic() < deadline, offsets
                time.sleep(0.1)
        members.leave("c")
    finally:
        members.stop_all()
        if not writer.stopped.is_set():
            writer.stop()
    history = members.history()
    check(history)
    processed = {(p, o) for _m, p, o, _t in history.records}
    for tp, offset in offsets.items():
        missing = [o for o in range(offset.offset) if (tp.partition, o) not in processed]
        assert not missing, f"partition {tp.partition}: offsets never processed: {missing[:10]}"
    # Every member took part; the group went through several generations.
    assert {i.member for i in history.intervals} == {"a", "b", "c"}
    assert len({i.generation for i in history.intervals}) >= 3
    assert [e["m"] for e in history.events if e["e"] == "closed"] == ["a", "c"]


def test_the_checker_sees_two_owners_and_processing_outside_ownership() -> None:
    """The checker has teeth: overlapping ownership and a record processed
    after its member's on_revoke both fail it."""
    overlapping = History(intervals=[Interval("a", 0, 10, 30), Interval("b", 0, 20, None)])
    with pytest.raises(AssertionError, match="two owners"):
        check(overlapping)
    late = History(intervals=[Interval("a", 0, 10, 30), Interval("b", 0, 40, None)],
                   records=[("a", 0, 5, 35)])
    with pytest.raises(AssertionError, match="outside its ownership"):
        check(late)
    fine = History(intervals=[Interval("a", 0, 10, 30), Interval("b", 0, 40, None)],
                   records=[("a", 0, 5, 25), ("b", 0, 5, 45)])
    check(fine)
