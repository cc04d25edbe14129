"""A nemesis that mixes every kind of fault on a LocalCluster(network=
"namespaces") with three stores and three etcd members (the mixed-fault
soak, tests/chaos/test_mixed_fault_soak.py).

Each fault is picked at random (a seeded random.Random, so a seed replays
the same sequence of choices; the timing of the cluster's reactions is not
replayed), applied, held for a random time, healed, and counted by kind:

* kill -9 of any process (a store, the transaction coordinator, the group
  coordinator, an etcd member) and its restart;
* pause (SIGSTOP, then SIGCONT) of any process;
* network partitions (netns.py's cuts): one process isolated; a
  majority/minority split (a partition's leader and one etcd member against
  the rest); one-way loss (the leader's packets to its followers dropped);
  the leader cut from etcd but not from its followers and clients; the
  leader cut from its followers but not from etcd; the clients cut from the
  leader only;
* a full disk: every free byte of a store's size-limited filesystem (its
  data directory is a tmpfs: `store_disks`) taken by one fallocated file,
  then freed;
* etcd member loss: a member killed, its data deleted, and a new empty
  member in its place (removed from and added to etcd's cluster);
* a rolling restart with controlled shutdown: SIGTERM and restart of every
  store in turn (the next once every partition is in sync again), then of
  the coordinators.

Faults do not overlap: each is healed before the next one is picked. Two
at once mostly yield unavailability (two stores of three down leaves no
in-sync majority for min.insync.replicas 2; two etcd members down leaves no
quorum) rather than new interleavings — and the healed effects overlap
anyway: a restarted store is still catching up, a deposed leader still
learning of its successor, when the next fault comes.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.testing import LocalCluster

Member = tuple[str, int]

STORES = 3
ETCD_MEMBERS = 3
# Kinds, with their weights: how often each is picked. Process faults and
# cuts are cheap (a few seconds); the rolling restart takes a minute, so it
# is rare; etcd member loss (a new member syncs etcd's data) in between.
WEIGHTS: dict[str, float] = {
    "kill -9": 14,
    "pause": 14,
    "isolate one process": 10,
    "majority/minority split": 8,
    "one-way loss (leader to followers)": 8,
    "leader cut from etcd only": 8,
    "leader cut from its followers only": 8,
    "clients cut from the leader only": 8,
    "disk full": 8,
    "etcd member loss": 3,
    "rolling restart (controlled shutdown)": 1,
}
# How long a fault is held, seconds (uniform): long enough for leases
# (ONCELOG_LEASE_TTL_S=2) to end and leaderships to move in some of them,
# short enough for 1,000 faults in about half an hour.
HOLD_S = (0.3, 3.0)
# How long a killed process stays down before its restart.
DOWN_S = (0.1, 2.0)
# The quiet time after a heal, before the next fault.
GAP_S = (0.1, 0.6)
# Rolling restarts and etcd member loss wait for the cluster to be whole.
IN_SYNC_TIMEOUT_S = 180.0
# A full disk: a tmpfs per store's data directory. tmpfs takes memory only
# for what is written; the filler is freed after each fault.
TMPFS_SIZE = "1g"


@contextlib.contextmanager
def store_disks(data_dir: Path, stores: int = STORES, size: str = TMPFS_SIZE
                ) -> Iterator[list[Path]]:
    """Mounts a size-limited tmpfs on each store's data directory under a
    LocalCluster's `data_dir` (before the cluster starts), so that a disk can
    be filled for real (the kernel's ENOSPC), and unmounts them after."""
    mounted: list[Path] = []
    try:
        for i in range(stores):
            path = data_dir / f"partition_store-{i}"
            path.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           check=True, capture_output=True)
            mounted.append(path)
        yield mounted
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def full_disk(directory: Path) -> Iterator[int]:
    """Takes every free byte of `directory`'s filesystem with one
    fallocated file (at once, with no data written), and frees it after;
    yields how many bytes it took."""
    filler = directory / "nemesis-filler"
    stats = os.statvfs(directory)
    free_bytes = stats.f_bavail * stats.f_frsize
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        # Free space can shrink between statvfs and the call: take what is
        # left, halving the request until it fits.
        taken = 0
        want = free_bytes
        while want >= stats.f_frsize:
            try:
                os.posix_fallocate(fd, taken, want)
                taken += want
            except OSError:
                want //= 2
        yield taken
    finally:
        os.close(fd)
        filler.unlink(missing_ok=True)


@dataclass
class Nemesis:
    """Picks, applies, holds and heals faults (module docstring); `done`
    counts them by kind, `log` says what each was, `errors` what the
    harness itself could not do (a process that would not restart)."""

    cluster: LocalCluster
    topic: str
    partitions: int
    seed: int
    disks: Sequence[Path] = ()
    # The kinds to pick from (default: every kind of WEIGHTS).
    kinds: Sequence[str] = tuple(WEIGHTS)
    # Each fault's line is appended here as it ends, so that a run that
    # fails or hangs still says what it did.
    log_path: Path | None = None
    rng: random.Random = field(init=False)
    done: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(WEIGHTS))
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds {unknown or 'none'}; expected some of {list(WEIGHTS)}")
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------ choices

    def _coordinators(self) -> list[Member]:
        """The coordinators that are processes of their own (a coordinator
        that runs in the stores shares their faults)."""
        return [(kind, 0) for kind in ("coordinator", "group_coordinator")
                if self.cluster.processes.get(kind)]

    def _processes(self) -> list[Member]:
        return ([("partition_store", i) for i in range(STORES)]
                + self._coordinators()
                + [("etcd", i) for i in range(ETCD_MEMBERS)])

    def _leader(self) -> tuple[int, int]:
        """(partition, its leader) of a random partition of the topic; a
        random store when no store answers Metadata (it is led by someone:
        the cut still means something)."""
        partition = self.rng.randrange(self.partitions)
        states = self.cluster.partition_states([self.topic])
        state = states.get((self.topic, partition))
        if state is None or state.leader < 0:
            return partition, self.rng.randrange(STORES)
        return partition, state.leader

    @staticmethod
    def _followers(leader: int) -> list[Member]:
        return [("partition_store", i) for i in range(STORES) if i != leader]

    def _hold(self) -> float:
        held_s = self.rng.uniform(*HOLD_S)
        time.sleep(held_s)
        return held_s

    # ------------------------------------------------------------ one fault

    def step(self) -> str:
        """Picks one fault, runs it to its heal, counts it; returns its kind."""
        kinds = [k for k in WEIGHTS if k in self.kinds]
        kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        started = time.monotonic()
        try:
            what = self._run(kind)
        except Exception as exc:  # noqa: BLE001 - counted, reported, and the soak goes on
            what = f"failed: {type(exc).__name__}: {exc}"
            self.errors.append(f"{kind}: {what}")
            self._recover()
        self.done[kind] += 1
        line = (f"{len(self.log)} {time.strftime('%H:%M:%S')} {kind}: {what} "
                f"({time.monotonic() - started:.1f} s)")
        self.log.append(line)
        if self.log_path is not None:
            with open(self.log_path, "a") as out:
                out.write(line + "\n")
        time.sleep(self.rng.uniform(*GAP_S))
        return kind

    def _run(self, kind: str) -> str:
        c = self.cluster
        if kind == "kill -9":
            member = self.rng.choice(self._processes())
            c.kill(*member)
            time.sleep(self.rng.uniform(*DOWN_S))
            c.restart(*member)
            return f"{member}"
        if kind == "pause":
            member = self.rng.choice(self._processes())
            c.pause(*member)
            try:
                held_s = self._hold()
            finally:
                c.resume(*member)
            return f"{member} for {held_s:.1f} s"
        if kind == "disk full":
            node = self.rng.randrange(len(self.disks))
            with full_disk(self.disks[node]) as taken:
                held_s = self._hold()
            return f"store {node}, {taken >> 20} MiB taken for {held_s:.1f} s"
        if kind == "etcd member loss":
            index = self.rng.randrange(ETCD_MEMBERS)
            c.kill("etcd", index)
            c.wipe("etcd", index)
            c.restart("etcd", index)
            return f"etcd {index} replaced by an empty member"
        if kind == "rolling restart (controlled shutdown)":
            return self._rolling_restart()
        return self._cut(kind)

    def _cut(self, kind: str) -> str:
        c = self.cluster
        apply: Callable[[], None]
        if kind == "isolate one process":
            member = self.rng.choice(self._processes())
            what = f"{member}"

            def apply() -> None:
                c.isolate(*member)
        else:
            partition, leader = self._leader()
            store = ("partition_store", leader)
            etcd = [("etcd", i) for i in range(ETCD_MEMBERS)]
            what = f"partition {partition}'s leader, store {leader}"
            cuts: dict[str, Callable[[], None]] = {
                "majority/minority split": lambda: c.cut(
                    [store, ("etcd", 0)],
                    [*self._followers(leader), ("etcd", 1), ("etcd", 2),
                     *self._coordinators(), ("client", 0)]),
                "one-way loss (leader to followers)": lambda: c.cut(
                    [store], self._followers(leader), one_way=True),
                "leader cut from etcd only": lambda: c.cut([store], etcd),
                "leader cut from its followers only": lambda: c.cut(
                    [store], self._followers(leader)),
                "clients cut from the leader only": lambda: c.cut([("client", 0)], [store]),
            }
            apply = cuts[kind]
        try:
            apply()
            held_s = self._hold()
        finally:
            c.heal()
        return f"{what} for {held_s:.1f} s"

    def _rolling_restart(self) -> str:
        c = self.cluster
        c.wait_in_sync(timeout_s=IN_SYNC_TIMEOUT_S)
        started = time.monotonic()
        for node in range(STORES):
            code = c.terminate("partition_store", node)
            if code != 0:
                self.errors.append(f"store {node} exited with {code} on SIGTERM")
            c.restart("partition_store", node)
            c.wait_in_sync(timeout_s=IN_SYNC_TIMEOUT_S)
        for kind, index in self._coordinators():
            code = c.terminate(kind, index)
            if code != 0:
                self.errors.append(f"{kind} exited with {code} on SIGTERM")
            c.restart(kind, index)
        return f"every store and coordinator in {time.monotonic() - started:.1f} s"

    def _recover(self) -> None:
        """After a fault that failed half-way: no cut, nothing paused,
        every process running."""
        c = self.cluster
        with contextlib.suppress(Exception):
            c.heal()
        for member in self._processes():
            with contextlib.suppress(Exception):
                c.resume(*member)
            try:
                if not c.alive(*member):
                    c.restart(*member)
            except Exception as exc:  # noqa: BLE001 - reported; the next fault may fix it
                self.errors.append(f"recovering {member}: {type(exc).__name__}: {exc}")

    def table(self) -> str:
        """Faults by kind, one line each, in WEIGHTS's order."""
        width = max(len(k) for k in WEIGHTS)
        lines = [f"  {kind:<{width}}  {self.done[kind]:>6}" for kind in WEIGHTS]
        lines.append(f"  {'total':<{width}}  {sum(self.done.values()):>6}")
        return "\n".join(lines)
