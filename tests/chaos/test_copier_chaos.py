"""The long chaos run of the exactly-once copier (not in the default test run).

Same goal and checks as tests/integration/test_copier.py, at a larger size:
100,000 input records in 4 partitions, three copier processes, and a longer
random sequence of kill -9s of copiers and of every service. Prints the
figures (records, faults injected, elapsed, throughput) for the notes.

    bash scripts/chaos.sh            # ONCELOG_CHAOS_SEED, ONCELOG_CHAOS_RECORDS to vary
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from oncelog import Admin
from oncelog.testing import LocalCluster
from tests.support.copier import (
    Chaos,
    CopierFleet,
    produce_in_background,
    verify_exactly_once,
    wait_until_copied,
)

PARTITIONS = 4


@pytest.mark.slow
def test_long_chaos_copier(tmp_path: Path) -> None:
    records = int(os.environ.get("ONCELOG_CHAOS_RECORDS", "100000"))
    seed = int(os.environ.get("ONCELOG_CHAOS_SEED", "11"))
    rng = random.Random(seed)
    kinds = ["copier", "copier", "partition_store", "coordinator", "group_coordinator"]
    plan = [rng.choice(kinds) for _ in range(24)]
    with LocalCluster(tmp_path / "cluster", consumer_offsets_partitions=2,
                      extra_args={"group_coordinator": ["--min-session-timeout-ms", "500"]}
                      ) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("in", partitions=PARTITIONS)
            admin.create_topic("out", partitions=PARTITIONS)
        fleet = CopierFleet(bootstrap=cluster.bootstrap, input_topic="in", output_topic="out",
                            group="copier", log_dir=tmp_path / "copiers",
                            extra_args=["--session-timeout-ms", "3000"])
        started = time.monotonic()
        for i in range(3):
            fleet.start(i)
        chaos = Chaos(cluster, fleet, seed=seed, interval_s=2.0, plan=plan)
        # Input arrives while the faults do (about as long as the plan).
        producer = produce_in_background(cluster.bootstrap, "in", records,
                                         duration_s=2.0 * len(plan))
        chaos.start()
        try:
            producer.join(timeout=600)
            chaos.join(timeout_s=600)
            wait_until_copied(cluster, fleet, PARTITIONS, timeout_s=1800)
        finally:
            chaos.stop()
            fleet.stop_all()
        elapsed_s = time.monotonic() - started
        assert chaos.error is None, repr(chaos.error)
        assert chaos.done == plan
        checked = verify_exactly_once(cluster.bootstrap, "in", "out", PARTITIONS)
    assert checked == records
    print(f"\nchaos copier: {records} records exactly once in {elapsed_s:.1f} s "
          f"({records / elapsed_s:.0f} records/s) with {len(chaos.done)} faults injected "
          f"({', '.join(chaos.done)}); {fleet.starts} copier starts; seed {seed}")
