"""bench/scale.py: the cost curves' benchmark cannot rot.

Goal: every case (partitions, transactional producers, group members, log
length) runs end to end through the script's own path (argument parsing,
the runs, the tables, the JSON file, the SVG plots) and gives every figure
its table promises: produce rate, idle CPU, RSS per replica, failover and
restart times; transactions/s, commit percentiles, the coordinator's RSS
and reload time; a join's settle time per group size; disk bytes per record
and restart times after kill -9 and SIGTERM.

Method: `run()` at tiny sizes (3 partitions, one transactional id, a group
of 1 then 2 members, 1,000 records, a second of producing) against real
service processes and a real etcd on 127.0.0.1. No assertion depends on
timing: only that each figure is there and positive.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import scale


# A whole benchmark run at tiny sizes (about a minute): with the slow tests
# (`pytest -m slow tests/integration/test_bench_*.py`), not in the default run.
@pytest.mark.slow
def test_every_case_runs_and_every_figure_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "scale.json"
    results = scale.run([
        "--runs", "1", "--partitions", "3", "--txn-producers", "1", "--txn-rate", "5",
        "--txn-known-ids", "10", "--group-members", "1,2", "--log-records", "1000",
        "--seconds", "1", "--idle-seconds", "0.5", "--json", str(out_json),
        "--svg-dir", str(tmp_path / "svg"),
    ])
    assert set(results) == set(scale.CASES)
    for case, points in results.items():
        sizes = {"partitions": [3], "txn": [1], "group": [1, 2], "log": [1000]}[case]
        assert [p.size for p in points] == sizes, case
        for point in points:
            for metric, title, _digits in scale.COLUMNS[case]:
                figure = point.figure(metric)
                assert figure is not None, (case, title)
                # Idle CPU may round to nothing on a quiet store.
                assert figure[0] >= 0 and not math.isnan(figure[0]), (case, title, figure)
        if case == "partitions":
            (run,) = points[0].runs
            assert run["rate_records_per_s"] > 0
            assert run["failover_led_s"] > 0 and run["failover_acked_s"] > 0
            assert 0 < run["restart_serving_s"] <= run["restart_in_sync_s"]
    saved = json.loads(out_json.read_text())
    assert set(saved) == set(scale.CASES)
    assert all(run["load"] >= 0 for runs in saved.values() for p in runs for run in p["runs"])
    plots = sorted(p.name for p in (tmp_path / "svg").iterdir())
    assert "scale-partitions-rate_records_per_s.svg" in plots
    assert all((tmp_path / "svg" / p).read_text().startswith("<svg") for p in plots)
    out = capsys.readouterr().out
    assert sum(1 for line in out.splitlines() if line.startswith("| ")) == 2 + 2 + 3 + 2
