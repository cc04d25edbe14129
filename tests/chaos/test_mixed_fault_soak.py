"""The long soak that mixes every kind of fault (slow: `bash scripts/chaos.sh
--soak MINUTES`; skipped unless ONCELOG_SOAK_MINUTES is set, so that
`bash scripts/chaos.sh` alone runs what it ran before).

Goal: on a replicated cluster (3 stores, RF 3, min.insync.replicas 2, a
3-member etcd, a transaction coordinator and a group coordinator), under
random faults of every kind for ONCELOG_SOAK_MINUTES minutes — kill -9,
pause, every kind of network partition, a full disk, etcd member loss,
rolling restarts with controlled shutdown (tests/support/nemesis.py) — an
idempotent producer, a transactional producer and a transactional
read-process-write copier keep exactly-once: nothing acknowledged or
committed lost or moved, nothing duplicated, no aborted or torn transaction
visible, no record of an unended transaction visible, order per partition
kept; and the cluster keeps making progress between faults.

Method: LocalCluster(network="namespaces") with each store's data directory
on a size-limited tmpfs; the client streams of
tests/support/partitioned_clients.py run in the client namespace
throughout (idempotent records and transactions to `soak`, the copier from
`soak` to `soak-copy` with its group's offsets). The nemesis runs one fault
after another, seeded by ONCELOG_CHAOS_SEED (a random seed otherwise, printed
first; ONCELOG_SOAK_KINDS, comma-separated, limits the kinds); every
PROGRESS_EVERY faults the test waits for the streams to make
progress. At the end everything is healed, the streams stop, and the
independent checker (find_anomalies, find_copy_anomalies) holds what a
read_committed reader finds against what the clients were told. The
figures table (faults by kind, transactions, records, anomalies by kind) is
printed; the test fails on any anomaly, on a run that made no progress, and
on a stall that outlasts the heal after the last fault.

With ONCELOG_SOAK_COORDINATORS_IN_STORES=1 the coordinators of both kinds
run in the stores (docs/coordinator.md, "The coordinator in a store"):
every fault of a store is then its coordinators' too.

    ONCELOG_CHAOS_SEED=7 bash scripts/chaos.sh --soak 30
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from oncelog.testing import LocalCluster
from tests.support.nemesis import ETCD_MEMBERS, STORES, WEIGHTS, Nemesis, store_disks
from tests.support.partitioned_clients import (
    ABORTED,
    ANOMALY_KINDS,
    COMMITTED,
    COPIER_GROUP,
    UNKNOWN,
    ClientLog,
    ClientStreams,
    committed_offsets,
    create_topic,
    find_anomalies,
    find_copy_anomalies,
    read_committed,
)

TOPIC = "soak"
COPY_TOPIC = "soak-copy"
PARTITIONS = 3
LEASE_TTL_S = 2
LAG_MAX_MS = 3_000
# Every PROGRESS_EVERY faults, the streams must make progress
# (PROGRESS_DEADLINE_S bounds the wait; a stall is counted and reported).
PROGRESS_EVERY = 10
PROGRESS_DEADLINE_S = 180.0
# How a stall after the last heal is reported (it fails the run).
AFTER_THE_SOAK = "after the soak"


def _outcomes(log: ClientLog) -> dict[str, int]:
    return {outcome: sum(1 for o, _p in log.txns.values() if o == outcome)
            for outcome in (COMMITTED, ABORTED, UNKNOWN)}


def _out_of_sync(cluster: LocalCluster) -> list[str]:
    """Each partition not fully in sync: name, leader and ISR."""
    return [f"{t}-{p} leader {s.leader} ISR {list(s.isr)}"
            for (t, p), s in sorted(cluster.partition_states().items()) if not s.in_sync]


def _figures(nemesis: Nemesis, elapsed_s: float, log: ClientLog, copier: ClientLog,
             records: int, copies: int, anomalies: Mapping[str, list[str]],
             stalls: list[str]) -> str:
    txns, copied = _outcomes(log), _outcomes(copier)
    lines = [
        f"seed {nemesis.seed}: {sum(nemesis.done.values())} faults in {elapsed_s / 60:.1f} "
        f"minutes; load average {os.getloadavg()[0]:.2f}",
        "faults by kind:", nemesis.table(),
        f"transactions (producer): {txns[COMMITTED]} committed, {txns[ABORTED]} aborted, "
        f"{txns[UNKNOWN]} unknown to their client",
        f"transactions (read-process-write copier): {copied[COMMITTED]} committed, "
        f"{copied[ABORTED]} aborted, {copied[UNKNOWN]} unknown to their client",
        f"records: {len(log.acked)} idempotent acknowledged ({len(log.failed)} failed), "
        f"{sum(len(p) for o, p in log.txns.values() if o == COMMITTED)} in committed "
        f"transactions; {records} read back from {TOPIC}, {copies} from {COPY_TOPIC}",
        "anomalies by kind:",
        *(f"  {kind:<16}  {len(anomalies[kind]):>6}" for kind in ANOMALY_KINDS),
        f"progress stalls (no progress within {PROGRESS_DEADLINE_S:.0f} s): {len(stalls)}",
        *(f"  {s}" for s in stalls[:10]),
        f"harness errors: {len(nemesis.errors)}",
        *(f"  {e}" for e in nemesis.errors[:10]),
    ]
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)
def test_every_kind_of_fault_mixed_for_minutes(tmp_path: Path) -> None:
    minutes_text = os.environ.get("ONCELOG_SOAK_MINUTES")
    if not minutes_text:
        pytest.skip("the mixed-fault soak runs with ONCELOG_SOAK_MINUTES set "
                    "(bash scripts/chaos.sh --soak MINUTES)")
    minutes = float(minutes_text)
    seed_text = os.environ.get("ONCELOG_CHAOS_SEED")
    seed = int(seed_text) if seed_text else random.SystemRandom().randrange(1 << 31)
    print(f"\nmixed-fault soak: ONCELOG_CHAOS_SEED={seed}, {minutes:g} minutes", flush=True)
    data_dir = tmp_path / "cluster"
    started = time.monotonic()
    stalls: list[str] = []
    with store_disks(data_dir) as disks, LocalCluster(
        data_dir, partition_stores=STORES, etcd_members=ETCD_MEMBERS, network="namespaces",
        transaction_state_partitions=2, consumer_offsets_partitions=2,
        env={"ONCELOG_LEASE_TTL_S": str(LEASE_TTL_S),
             "ONCELOG_REPLICA_LAG_TIME_MAX_MS": str(LAG_MAX_MS)},
        coordinators_in_stores=os.environ.get("ONCELOG_SOAK_COORDINATORS_IN_STORES") == "1",
    ) as cluster:
        bootstrap = cluster.bootstrap_servers
        cluster.client_call(create_topic, bootstrap, TOPIC, PARTITIONS)
        cluster.client_call(create_topic, bootstrap, COPY_TOPIC, PARTITIONS)
        cluster.wait_in_sync()
        streams = ClientStreams(cluster, TOPIC, PARTITIONS, tmp_path / "clients",
                                copy_to=COPY_TOPIC)
        kinds_text = os.environ.get("ONCELOG_SOAK_KINDS")
        kinds = [k.strip() for k in kinds_text.split(",")] if kinds_text else list(WEIGHTS)
        nemesis = Nemesis(cluster, TOPIC, PARTITIONS, seed, disks, kinds,
                          log_path=tmp_path / "nemesis.log")
        print(f"fault log: {nemesis.log_path}", flush=True)
        try:
            streams.wait_progress("before the first fault", copies=1, deadline_s=120)
            soak_started = time.monotonic()
            while time.monotonic() - soak_started < minutes * 60:
                nemesis.step()
                count = sum(nemesis.done.values())
                if count % PROGRESS_EVERY == 0:
                    try:
                        streams.wait_progress(f"after {count} faults", acks=20, commits=2,
                                              copies=1, deadline_s=PROGRESS_DEADLINE_S)
                    except AssertionError as exc:
                        stalls.append(f"{exc} (last faults: {nemesis.log[-3:]}; out of "
                                      f"sync: {_out_of_sync(cluster)})")
                        print(f"STALL: {stalls[-1]}", flush=True)
                    print(f"{count} faults, {(time.monotonic() - soak_started) / 60:.1f} min: "
                          f"{dict(nemesis.done)}", flush=True)
            cluster.heal()
            print(f"faults done:\n{nemesis.table()}", flush=True)
            try:
                cluster.wait_in_sync(timeout_s=300)
                streams.wait_progress("after the last fault", copies=1,
                                      deadline_s=PROGRESS_DEADLINE_S)
            except (TimeoutError, AssertionError) as exc:
                stalls.append(f"{AFTER_THE_SOAK}: {exc}")
                print(f"STALL: {stalls[-1]}", flush=True)
        finally:
            log = streams.stop()
        copier_log = streams.final_copier_log()
        # Said before the reads, which a stuck transaction would make fail.
        print(f"clients: {_outcomes(log)} transactions, {len(log.acked)} idempotent records "
              f"acknowledged; copier: {_outcomes(copier_log)} transactions", flush=True)
        records = cluster.client_call(read_committed, bootstrap, TOPIC, PARTITIONS)
        copies = cluster.client_call(read_committed, bootstrap, COPY_TOPIC, PARTITIONS)
        committed = cluster.client_call(committed_offsets, bootstrap, COPIER_GROUP, TOPIC,
                                        PARTITIONS)
    anomalies = find_anomalies(log, records)
    for kind, lines in find_anomalies(copier_log, copies).items():
        anomalies[kind] += [f"copier: {line}" for line in lines]
    for kind, lines in find_copy_anomalies(records, copies, committed).items():
        anomalies[kind] += [f"copier: {line}" for line in lines]
    print(_figures(nemesis, time.monotonic() - started, log, copier_log, len(records),
                   len(copies), anomalies, stalls))
    found = {kind: lines[:5] for kind, lines in anomalies.items() if lines}
    assert not found, f"seed {seed}: anomalies {found}"
    assert log.committed() > 0 and log.acked and copier_log.committed() > 0, \
        f"seed {seed}: the run made no progress"
    # A stall during the faults may be a fault held open; one that outlasts
    # the heal is a cluster (or client) that does not recover.
    final = [stall for stall in stalls if stall.startswith(AFTER_THE_SOAK)]
    assert not final, f"seed {seed}: no progress after every fault was healed: {final}"
