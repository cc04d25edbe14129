"""bench/spark.py: the Spark benchmark cannot rot.

Goal: the script's own path (argument parsing, the rotated case order, the
three queries with AvailableNow, the output checks, the tables, the JSON
file) runs end to end, every case reports the input's row count and its
micro-batches, the foreachBatch sink reports where its time went, and the
output check refuses a duplicate, a stranger and a missing record.

Method: `main()` at a tiny size (a few hundred records, one micro-batch a
case) on the shared Spark session against the benchmark's own
LocalCluster (real service processes); the check against hand-written
output topics. No assertion depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench import spark as bench
from bench.pipeline import value_of
from oncelog import Admin, Producer
from oncelog.testing import LocalCluster

RECORDS = 400


def test_every_case_runs_through_the_scripts_own_path(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "spark.json"
    runs, summary = bench.main(
        ["--rounds", "1", "--records", str(RECORDS), "--max-records-per-trigger", "0",
         "--no-warm-up", "--json", str(out_json)], spark=spark)
    assert [r.case for r in runs] == list(bench.CASES)
    for run in runs:
        assert run.records == RECORDS
        # No per-trigger limit: one micro-batch reads the whole input.
        assert run.batches == 1, run
        assert run.phase_ms["addBatch"] > 0
    (foreach,) = [r for r in runs if r.case == bench.FOREACH]
    assert 0 < foreach.sink_check_ms + foreach.sink_write_ms <= foreach.sink_call_ms
    assert set(summary.ratio_to_source) == {bench.TWO_PC, bench.FOREACH}
    assert summary.fill_records_per_s > 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    # Two tables, a header and a row per case each.
    assert len(table) == 2 * (1 + len(bench.CASES))
    saved = json.loads(out_json.read_text())
    assert [r["case"] for r in saved["runs"]] == list(bench.CASES)


def test_case_order_rotates_across_rounds() -> None:
    orders = [bench.rotated(bench.CASES, r) for r in (1, 2, 3, 4)]
    assert [o[0] for o in orders] == [bench.SOURCE, bench.TWO_PC, bench.FOREACH, bench.SOURCE]
    assert all(sorted(o) == sorted(bench.CASES) for o in orders)


@pytest.mark.parametrize(("ids", "complaint"), [
    ([0, 1, 2, 3, 1], "input record 1 is in it twice"),
    ([0, 1, 2, 3, 4], "record 4 is not an input record"),
    ([0, 1, 3], "1 of 4 input records are not in it"),
], ids=["duplicate", "stranger", "missing"])
def test_check_refuses_a_wrong_output(
    shared_cluster: LocalCluster, topic_name: str, ids: list[int], complaint: str,
) -> None:
    bootstrap = shared_cluster.bootstrap
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    with Producer(bootstrap=bootstrap) as producer:
        for n, record_id in enumerate(ids):
            producer.send(topic_name, value=value_of(record_id, 100), partition=n % 2)
        producer.flush()
    with pytest.raises(SystemExit, match=complaint):
        bench.check_output(bootstrap, topic_name, 2, 4)
