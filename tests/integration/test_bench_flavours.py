"""bench/flavours.py: the compiled-against-pure benchmark cannot rot.

Goal: the script runs end to end (a round of bench/peers.py under
`.venv-compiled`'s interpreter, its JSON read back into the table), its
table takes medians, ranges and ratios over the rounds of each flavour, and
unknown cases or flavours are refused before anything starts.

Method: `main()` with tiny sizes (a third of a second of producing, one
round, the compiled flavour only) against real service processes; the
table arithmetic on hand-made rounds. No assertion depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import flavours


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("| ")][1:]


def test_the_compiled_flavour_runs_through_the_scripts_own_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "flavours.json"
    flavours.main(["--rounds", "1", "--seconds", "0.3", "--cases", "produce-1p",
                   "--flavours", "compiled", "--quiet", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert "# round 1 compiled: load average" in out
    (row,) = _rows(out)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "idempotent produce, 100 B, 1 partition (higher is better)"
    assert cells[1].endswith("records/s")
    # Pure and peer did not run: no figure and no ratio.
    assert cells[2:] == ["—", "—", "—", "—"]
    data = json.loads(out_json.read_text())
    assert list(data["rounds"]) == ["compiled"]
    (only,) = data["rounds"]["compiled"]
    assert only["produce-1p"]["records_per_s"] > 0


def test_the_table_takes_medians_ranges_and_ratios_of_medians() -> None:
    def produce(rate: float) -> dict[str, dict[str, float]]:
        return {"produce-1p": {"records_per_s": rate}}

    results = {
        "compiled": [produce(600), produce(900), produce(700)],
        "pure": [produce(300), produce(400), produce(350)],
        "peer": [produce(500), produce(350), produce(800)],
    }
    (row,) = _rows(flavours.render(results, ["produce-1p"], copier_records=1000))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:] == ["700 records/s (600–900)", "350 records/s (300–400)",
                         "500 records/s (350–800)", f"{700 / 350:.2f}", f"{700 / 500:.2f}"]


def test_the_copier_row_names_how_many_records_it_copied() -> None:
    results = {"compiled": [{"copier": {"records_per_s": 200.0}}]}
    (row,) = _rows(flavours.render(results, ["copier"], copier_records=25_000))
    assert row.startswith("| exactly-once copier, 25,000 x 100 B, commit every 100 ms ")


def test_unknown_cases_and_flavours_are_refused() -> None:
    with pytest.raises(SystemExit):
        flavours.main(["--cases", "produce-9p"])
    with pytest.raises(SystemExit):
        flavours.main(["--flavours", "compiled,interpreted"])
