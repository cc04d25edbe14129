"""bench/replication.py: the replication benchmark cannot rot.

Goal: every case (produce and latency on RF 3, RF 1 and the single store;
failover; catch-up of a wiped store) runs end to end through the script's
own path (argument parsing, the rounds, the tables, the JSON file), and each
table has a figure wherever it promises one: records/s and latencies for the
three set-ups with the RF 3 / RF 1 ratio, a failover row for the lease TTL
asked for, the catch-up's log size, times and rate. Every record sent is
acknowledged (the produce runs and the failover stream), and the wiped store
copies the whole log before the script accepts its return (the script checks
that itself). The table arithmetic (medians, per-round ratios, percentiles
over kills, kills spread over rounds) comes out right.

Method: `main()` with tiny sizes (half a second of producing, 5 latency
samples, 2 kills at lease TTL 2 s, 2 MB to catch up) against real service
processes and a real etcd on 127.0.0.1; the arithmetic on hand-made
measurements. No assertion depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import replication as bench


def _table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


@pytest.mark.slow  # 75-100 s of real clusters: `pytest -m slow`, not the default run
def test_every_case_runs_and_every_figure_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "replication.json"
    report = bench.main(["--rounds", "1", "--seconds", "0.5", "--latency-samples", "5",
                         "--kills", "2", "--lease-ttls", "2", "--catch-up-mb", "2",
                         "--json", str(out_json)])
    assert [r.label for r in report.rows] == [m.label for m in bench.METRICS]
    for row in report.rows:
        assert set(row.figures) == {s.key for s in bench.SETUPS}, row.label
        assert all(median > 0 for median, _low, _high in row.figures.values()), row.label
        assert row.ratio is not None and row.ratio[0] > 0, row.label

    (failover,) = report.failover
    assert (failover.lease_ttl_s, failover.kills, failover.target_s) == (2, 2, 4.0)
    assert 0 < failover.p50_s <= failover.p99_s <= failover.max_s
    assert all(k["elected_s"] is None or 0 < k["elected_s"] <= k["failover_s"]
               for k in json.loads(out_json.read_text())["kills"])
    assert report.undelivered_records == 0

    assert set(report.catch_up) == {"log_mb", "serving_s", "in_sync_s", "mb_per_s"}
    log_mb = report.catch_up["log_mb"][0]
    assert log_mb >= 2.0  # the values alone are 2 MB; batches add their headers
    assert report.catch_up["mb_per_s"][0] > 0

    lines = _table_lines(capsys.readouterr().out)
    setups = " | ".join(s.title for s in bench.SETUPS)
    assert lines[0] == f"| measure | {setups} | RF 3 / RF 1 |"
    assert sum(1 for line in lines if line.startswith("| idempotent produce")) == 2
    assert any(line.startswith("| 2 s | 2 | ") for line in lines)
    assert any(line.startswith("| catch-up rate | ") and "MB/s" in line for line in lines)
    assert all("—" not in line for line in lines[2:2 + len(bench.METRICS)])

    saved = json.loads(out_json.read_text())
    assert sorted({(m["case"], m["setup"]) for m in saved["measurements"]}) == sorted(
        (case, s.key) for case in bench.COMPARED_CASES for s in bench.SETUPS)
    assert len(saved["kills"]) == 2 and len(saved["catch_ups"]) == 1
    assert {k["partition"] for k in saved["kills"]} <= set(range(bench.STORES))


def test_tables_take_medians_per_round_ratios_and_percentiles() -> None:
    def m(setup: bench.Setup, round_no: int, rate: float) -> bench.Measurement:
        return bench.Measurement("produce-1p", setup.key, round_no, {"records_per_s": rate})

    measurements = [m(bench.RF3, 1, 50.0), m(bench.RF1, 1, 100.0), m(bench.SINGLE, 1, 120.0),
                    m(bench.RF1, 2, 200.0), m(bench.RF3, 2, 150.0), m(bench.SINGLE, 2, 90.0),
                    m(bench.SINGLE, 3, 100.0), m(bench.RF3, 3, 60.0), m(bench.RF1, 3, 100.0)]
    (row,) = bench.setup_table(measurements, ["produce-1p"])
    assert row.figures == {"rf3": (60.0, 50.0, 150.0), "rf1": (100.0, 100.0, 200.0),
                           "single": (100.0, 90.0, 120.0)}
    # Per round: 0.5, 0.75, 0.6; not the ratio of the medians (0.6 by chance).
    assert row.ratio == (0.6, 0.5, 0.75)

    kills = [bench.Kill(3, 1, p % 3, p % 3, p == 0, float(t), elected, 2.0)
             for p, (t, elected) in enumerate([(4, 3.0), (3, None), (8, 6.0), (5, 3.5)])]
    (f,) = bench.failover_table(kills, [3, 2])
    assert (f.kills, f.p50_s, f.p99_s, f.max_s, f.within_target) == (4, 4.5, 8.0, 8.0, 3)
    assert (f.controller_kills, f.controller_p50_s, f.others_p50_s) == (1, 4.0, 5.0)
    assert f.elected_p50_s == 3.5  # over the kills where a poll saw the new leader


def test_kills_spread_over_the_rounds() -> None:
    assert [bench.kills_in_round(20, 3, r) for r in (1, 2, 3)] == [7, 7, 6]
    assert [bench.kills_in_round(2, 3, r) for r in (1, 2, 3)] == [1, 1, 0]


def test_unknown_cases_and_bad_ttls_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--cases", "produce-1p,nonsense"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--lease-ttls", "1.5"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--kills", "0"])
