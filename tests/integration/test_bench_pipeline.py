"""bench/pipeline.py against a real cluster.

Goal: the pipeline benchmark copies what it says and its check can fail.
Both copy loops (exactly once and at least once) run over a small input and
pass the benchmark's own exactly-once check; the check then refuses an output
with a duplicate, with a record on the wrong partition and with a missing
record. The latency case reports a transaction and both of its halves.

Method: real service processes (the `cluster` fixture) and the benchmark's
own functions; no assertion depends on timing.
"""

from __future__ import annotations

import argparse

import pytest

from bench import pipeline as bench
from oncelog import Admin, Producer
from oncelog.testing import LocalCluster

RECORDS = 2_000


def _topics(cluster: LocalCluster) -> None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        for topic in (bench.INPUT, bench.OUTPUT):
            admin.create_topic(topic, partitions=bench.PARTITIONS)


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_copy_copies_every_record_once(cluster: LocalCluster, exactly_once: bool) -> None:
    _topics(cluster)
    bench.fill_input(cluster.bootstrap, RECORDS, value_bytes=100)
    run = bench.copy(cluster.bootstrap, exactly_once=exactly_once, records=RECORDS,
                     commit_interval_ms=100, max_poll_records=500)
    assert run.records == RECORDS
    assert run.commits >= 1
    bench.check_output(cluster.bootstrap, RECORDS)
    with Admin(bootstrap=cluster.bootstrap) as admin:
        committed = admin.list_group_offsets("bench-pipeline")
    # The last commit covers the whole input: a restarted pipeline would copy nothing again.
    assert sum(o.offset for o in committed.values()) == RECORDS
    assert all(o.lag == 0 for o in committed.values())


def _write_output(cluster: LocalCluster, ids_and_partitions: list[tuple[int, int]]) -> None:
    with Producer(bootstrap=cluster.bootstrap) as producer:
        for record_id, partition in ids_and_partitions:
            producer.send(bench.OUTPUT, value=bench.value_of(record_id, 100), partition=partition)
        producer.flush()


@pytest.mark.parametrize(("output", "complaint"), [
    ([(0, 0), (1, 1), (2, 2), (3, 3), (1, 1)], "twice"),
    ([(0, 0), (1, 2), (2, 2), (3, 3)], "not an input record of that partition"),
    ([(0, 0), (1, 1), (3, 3)], "1 input records are not in the output"),
], ids=["duplicate", "wrong-partition", "missing"])
def test_check_refuses_a_wrong_output(
    cluster: LocalCluster, output: list[tuple[int, int]], complaint: str,
) -> None:
    _topics(cluster)
    _write_output(cluster, output)
    with pytest.raises(SystemExit, match=complaint):
        bench.check_output(cluster.bootstrap, 4)


@pytest.mark.parametrize("coordinators_in_stores", [False, True],
                         ids=["coordinator-process", "coordinator-in-store"])
def test_latency_reports_a_transaction_and_its_two_halves(coordinators_in_stores: bool) -> None:
    # run_latency starts its own cluster, as the benchmark does.
    run = bench.run_latency(argparse.Namespace(value_bytes=100, latency_samples=5,
                                               coordinators_in_stores=coordinators_in_stores))
    for name in ("transaction_p50_ms", "send_p50_ms", "first_send_p50_ms", "commit_p50_ms"):
        assert getattr(run, name) > 0, name
    # Every sample's halves add up to that sample, so neither median can pass
    # the slowest whole transaction.
    assert run.first_send_p50_ms <= run.transaction_p99_ms
    assert run.commit_p50_ms <= run.transaction_p99_ms
