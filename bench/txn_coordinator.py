"""The transaction coordinator alone: how many transactions/s its
`__transaction_state` partitions sustain, and at what commit latency, when
each append takes a replicated round trip.

One process, no stores and no clients: a TxnCoordinatorRuntime over the
in-memory transaction log with every append delayed by --append-latency-ms
(the RF 3 acknowledgement; about 20 ms on the benchmark cluster) and every
marker write by --marker-latency-ms. Each of --ids transactional ids runs
transactions at --rate per second (AddPartitions, then EndTxn(commit), as a
version-2 producer's store and client send them), spread over the first
interval. What the end-to-end benchmark (bench/scale.py, case txn) cannot
separate from the machine's load and its 1,000-thread client, this measures:
the coordinator's own capacity.

    .venv/bin/python bench/txn_coordinator.py --ids 10,100,1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services.common.metadata.cluster import ClusterLayout  # noqa: E402
from services.coordinator.markers import FakeMarkerSender, MarkerSpec  # noqa: E402
from services.coordinator.producer_id_manager import ProducerIdManager  # noqa: E402
from services.coordinator.storage.producer_id_log import MemoryProducerIdLog  # noqa: E402
from services.coordinator.storage.txn_log import Entry, MemoryTxnLog  # noqa: E402
from services.coordinator.txn_runtime import TxnConfig, TxnCoordinatorRuntime  # noqa: E402


class SlowTxnLog(MemoryTxnLog):
    """Appends land after a replicated round trip."""

    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s
        self.appends = 0
        self.records = 0

    async def append(self, partition: int, entries: Sequence[Entry], *,
                     expected_log_end_offset: int) -> int:
        self.appends += 1
        self.records += len(entries)
        await asyncio.sleep(self.latency_s)
        return await super().append(partition, entries,
                                    expected_log_end_offset=expected_log_end_offset)


class SlowMarkers(FakeMarkerSender):
    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s

    async def write(self, spec: MarkerSpec, partitions):  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.latency_s)
        return await super().write(spec, partitions)


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def point(ids: int, args: argparse.Namespace) -> dict[str, float]:
    layout = ClusterLayout(stores=("s0",), coordinators=("c0",),
                           transaction_state_partitions=args.partitions)
    log = SlowTxnLog(args.append_latency_ms / 1000)
    rt = TxnCoordinatorRuntime(
        layout=layout, node_id=0, txn_log=log, markers=SlowMarkers(args.marker_latency_ms / 1000),
        producer_ids=ProducerIdManager(MemoryProducerIdLog(), node_id=0, block_size=1000),
        now_ms=lambda: int(time.time() * 1000),
        config=TxnConfig(max_transaction_timeout_ms=900_000),
    )
    await rt.start()
    while not all(o.loaded for o in rt.partitions.values()):
        await asyncio.sleep(0.01)
    tids = [f"bench-{i}" for i in range(ids)]
    producers = await asyncio.gather(*(rt.init_producer_id(t, 60_000) for t in tids))
    commits_ms: list[float] = []
    pace_s = 1 / args.rate
    started = time.perf_counter()
    deadline = started + args.seconds

    async def run(i: int) -> int:
        pid, epoch, _ = producers[i]
        next_s = started + pace_s * i / ids
        done = 0
        while True:
            now = time.perf_counter()
            if now >= deadline:
                return done
            if now < next_s:
                await asyncio.sleep(min(next_s - now, deadline - now))
                continue
            next_s += pace_s
            began = time.perf_counter()
            await rt.add_partitions(tids[i], pid, epoch, frozenset({("out", i % 12)}))
            pid, epoch = await rt.end_txn(tids[i], pid, epoch, commit=True)
            commits_ms.append((time.perf_counter() - began) * 1000)
            done += 1

    appends_before, records_before = log.appends, log.records
    total = sum(await asyncio.gather(*(run(i) for i in range(ids))))
    elapsed = time.perf_counter() - started
    await rt.stop()
    commits_ms.sort()
    appends = log.appends - appends_before
    return {
        "txn_per_s": total / elapsed,
        "commit_p50_ms": percentile(commits_ms, 0.5),
        "commit_p99_ms": percentile(commits_ms, 0.99),
        "records_per_append": (log.records - records_before) / appends if appends else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ids", default="10,100,1000")
    parser.add_argument("--rate", type=float, default=1.0, help="transactions/s per id")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--partitions", type=int, default=4,
                        help="__transaction_state partitions (the test cluster's default)")
    parser.add_argument("--append-latency-ms", type=float, default=20.0)
    parser.add_argument("--marker-latency-ms", type=float, default=5.0)
    args = parser.parse_args()
    print(f"# load average {os.getloadavg()[0]:.2f}; {args.partitions} partitions; "
          f"append {args.append_latency_ms} ms; markers {args.marker_latency_ms} ms")
    print("| ids | transactions/s | commit p50, ms | commit p99, ms | records per append |")
    print("|---|---|---|---|---|")
    for ids in (int(x) for x in args.ids.split(",")):
        r = asyncio.run(point(ids, args))
        print(f"| {ids:,} | {r['txn_per_s']:.1f} | {r['commit_p50_ms']:.1f} | "
              f"{r['commit_p99_ms']:.1f} | {r['records_per_append']:.1f} |", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
