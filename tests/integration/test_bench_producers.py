"""bench/transactions.py's several-producer mode against a real cluster.

Goal: what `--producers N` reports is what was written. Two transactional
producer processes (each its own transactional id) commit every 100 ms for
a second; the records they report add up to exactly what read_committed and
read_uncommitted consumers read back, every producer's commits are counted,
and each used its own transactional id.

Method: real service processes (the `cluster` fixture) and the benchmark's
own functions; no assertion depends on timing (each producer commits at
least once, however slow the machine).
"""

from __future__ import annotations

from bench import transactions as bench
from oncelog import Admin
from oncelog.testing import LocalCluster

PRODUCERS = 2


def test_producers_together_report_what_they_wrote(cluster: LocalCluster) -> None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("bench", partitions=bench.PARTITIONS)
    produced = bench.produce_together(
        PRODUCERS, cluster.bootstrap, "bench", value_bytes=100, duration_s=1.0,
        case=bench.Case("transactional", 100), batch_size=16384,
    )
    assert produced.records > 0
    assert len(produced.blocked_s) >= PRODUCERS
    for level in ("read_committed", "read_uncommitted"):
        read, _seconds = bench.consume(cluster.bootstrap, "bench", level)
        assert read == produced.records, level
    with Admin(bootstrap=cluster.bootstrap) as admin:
        ids = {t.transactional_id for t in admin.list_transactions()}
    assert ids == {f"bench-bench-{index}" for index in range(PRODUCERS)}
