"""Jepsen-style transactional workload on a replicated cluster, with hundreds
of process faults (not in the default test run: `bash scripts/chaos.sh`).

Goal: with partitions replicated (3 stores, RF 3, min.insync.replicas 2, a
3-member etcd), transactions stay all-or-nothing and exactly once while any
store, the transaction coordinator, the group coordinator or an etcd member is
kill -9'd or SIGSTOPped at random: no lost write (a committed transaction's
record missing), no duplicate, no aborted read (a record of an aborted
transaction visible to read_committed), no torn transaction (some records of
a transaction visible and not others), and each writer's records in the order
it sent them on each partition.

Method: writer threads, each a transactional producer, append unique values
to all partitions in transactions that they commit or (one in five) abort,
noting each outcome (committed, aborted, or unknown when the commit could not
be confirmed). A fault thread injects ONCELOG_CHAOS_FAULTS faults (default
200), one at a time: a kill -9 and restart, or a pause of 0.5-4 s, of a random
process. At the end everything is read back with read_committed and checked.
Prints the figures for the notes. With ONCELOG_CHAOS_COORDINATORS_IN_STORES=1
every store also runs a transaction and a group coordinator
(docs/coordinator.md, "The coordinator in a store"), so a store's fault is
its coordinators' too.

    ONCELOG_CHAOS_FAULTS=200 ONCELOG_CHAOS_SEED=N bash scripts/chaos.sh -k replicated
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from oncelog import Admin, Producer, errors
from oncelog.testing import LocalCluster
from tests.support.reading import read_all

TOPIC = "jepsen"
PARTITIONS = 3
WRITERS = 3
RECORDS_PER_TXN = 6
ABORT_ONE_IN = 5
STORES = 3


@dataclass
class Outcomes:
    committed: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    # transaction id -> its values
    values: dict[str, list[bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _writer(bootstrap: str, index: int, stop: threading.Event, out: Outcomes,
            rng: random.Random) -> None:
    """Transactions of RECORDS_PER_TXN values spread over the partitions."""
    txn_number = 0
    producer: Producer | None = None
    while not stop.is_set():
        try:
            if producer is None:
                producer = Producer(bootstrap=bootstrap, transactional_id=f"writer-{index}",
                                    linger_ms=1, max_block_ms=20_000)
                producer.init_transactions()
            txn = f"w{index}-t{txn_number}"
            txn_number += 1
            values = [f"{txn}-r{i}".encode() for i in range(RECORDS_PER_TXN)]
            with out.lock:
                out.values[txn] = values
            producer.begin_transaction()
            for i, value in enumerate(values):
                producer.send(TOPIC, value=value, partition=i % PARTITIONS)
            if rng.randrange(ABORT_ONE_IN) == 0:
                producer.abort_transaction()
                with out.lock:
                    out.aborted.add(txn)
                continue
            try:
                producer.commit_transaction()
            except errors.TransactionAbortableError:
                producer.abort_transaction()
                with out.lock:
                    out.aborted.add(txn)
                continue
            with out.lock:
                out.committed.add(txn)
        except errors.OncelogError:
            # The outcome of the transaction in flight is not known to us:
            # the coordinator decides it (a new producer with the same id
            # aborts it if it was not committed). Start over.
            with out.lock:
                if txn_number and f"w{index}-t{txn_number - 1}" not in (
                        out.committed | out.aborted):
                    out.unknown.add(f"w{index}-t{txn_number - 1}")
            if producer is not None:
                producer.close(timeout=5)
            producer = None
            time.sleep(0.2)
    if producer is not None:
        producer.close(timeout=30)


IN_STORES = os.environ.get("ONCELOG_CHAOS_COORDINATORS_IN_STORES", "") == "1"
KINDS = [("partition_store", i) for i in range(STORES)] + (
    [] if IN_STORES else [("coordinator", 0), ("group_coordinator", 0)]) + [
    ("etcd", i) for i in range(3)]


def _faults(cluster: LocalCluster, count: int, rng: random.Random, stop: threading.Event,
            done: Counter[str]) -> None:
    for _ in range(count):
        if stop.is_set():
            return
        kind, index = rng.choice(KINDS)
        if rng.random() < 0.5:
            cluster.kill(kind, index)
            time.sleep(rng.uniform(0.1, 1.5))
            cluster.restart(kind, index)
            done[f"kill {kind}"] += 1
        else:
            cluster.pause(kind, index)
            time.sleep(rng.uniform(0.5, 4.0))
            cluster.resume(kind, index)
            done[f"pause {kind}"] += 1
        time.sleep(rng.uniform(0.2, 1.0))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_replicated_transactions_under_process_faults(tmp_path: Path) -> None:
    faults = int(os.environ.get("ONCELOG_CHAOS_FAULTS", "200"))
    seed = int(os.environ.get("ONCELOG_CHAOS_SEED", "5"))
    rng = random.Random(seed)
    started = time.monotonic()
    with LocalCluster(tmp_path / "cluster", partition_stores=STORES, etcd_members=3,
                      transaction_state_partitions=2, consumer_offsets_partitions=2,
                      coordinators_in_stores=IN_STORES) as cluster:
        bootstrap = cluster.bootstrap_servers
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=STORES)
        out = Outcomes()
        stop = threading.Event()
        writers = [threading.Thread(target=_writer, args=(bootstrap, i, stop, out,
                                                          random.Random(seed * 100 + i)))
                   for i in range(WRITERS)]
        for w in writers:
            w.start()
        done: Counter[str] = Counter()
        _faults(cluster, faults, rng, threading.Event(), done)
        stop.set()
        for w in writers:
            w.join(timeout=300)
        got = read_all(bootstrap, TOPIC, PARTITIONS, isolation_level="read_committed",
                       deadline_s=300)
    elapsed_s = time.monotonic() - started

    seen = Counter(r.value for r in got)
    visible = {value for value in seen if value is not None}
    by_txn: dict[str, list[bytes]] = defaultdict(list)
    for value in visible:
        by_txn[value.decode().rsplit("-r", 1)[0]].append(value)
    duplicates = [v for v, n in seen.items() if n > 1]
    lost = [t for t in out.committed if set(out.values[t]) - visible]
    aborted_read = [t for t in out.aborted if t in by_txn]
    torn = [t for t, vs in by_txn.items() if len(vs) != RECORDS_PER_TXN]
    unknown_committed = sum(1 for t in out.unknown if t in by_txn)
    order_broken = []
    for p in range(PARTITIONS):
        last: dict[str, int] = {}
        for r in got:
            if r.partition != p or r.value is None:
                continue
            writer, txn = r.value.decode().split("-")[:2]
            number = int(txn[1:])
            if number < last.get(writer, -1):
                order_broken.append((p, r.value))
            last[writer] = number
    print(f"\n{sum(done.values())} faults in {elapsed_s:.0f} s: {dict(done)}")
    print(f"transactions: {len(out.committed)} committed, {len(out.aborted)} aborted, "
          f"{len(out.unknown)} unknown ({unknown_committed} of them committed by the "
          f"coordinator); {len(visible)} records visible")
    assert sum(done.values()) >= faults
    assert not duplicates, f"duplicates: {duplicates[:5]}"
    assert not lost, f"committed transactions with records lost: {lost[:5]}"
    assert not aborted_read, f"aborted transactions visible: {aborted_read[:5]}"
    assert not torn, f"torn transactions: {torn[:5]}"
    assert not order_broken, f"order broken: {order_broken[:5]}"
    assert len(out.committed) > 50, "the workload made too little progress to mean much"
