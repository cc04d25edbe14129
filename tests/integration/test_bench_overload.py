"""bench/overload.py: the overload benchmark cannot rot, and its quotas
mode measures push-back.

Goal: both modes run end to end through the script's own path (argument
parsing, the cluster per mode, the flood and reader child processes, the
well-behaved producer, the JSON summary); the store is alive at the end of
each; with quotas on, the flood (which ignores throttle times on purpose)
is answered with throttle times, and without them it is not; the summary
carries the figures docs/performance.md quotes (peak RSS, p99) and the load
average.

Method: `main()` with tiny sizes (20 connections, 3 s, a 2 MiB backlog)
and a producer quota of 10,000 B/s, so the flood's first round of requests
(20 x 16 KiB) is already over the quota's first window (100 KB): which
requests are throttled does not depend on timing. No assertion is on a
figure's size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import overload


@pytest.mark.slow  # two real clusters, ~30-60 s: `pytest -m slow`, not the default run
def test_both_modes_run_and_quotas_push_the_flood_back(tmp_path: Path) -> None:
    out_json = tmp_path / "overload.json"
    summary = overload.main(["--seconds", "3", "--connections", "20", "--backlog-mb", "2",
                             "--producer-byte-rate", "10000", "--work-dir",
                             str(tmp_path / "work"), "--json", str(out_json)])
    assert summary is not None
    assert json.loads(out_json.read_text()) == summary
    assert len(summary["load_before"]) == 3
    by_mode = {r["mode"]: r for r in summary["results"]}
    assert set(by_mode) == {"none", "quotas"}
    for result in by_mode.values():
        assert result["store_alive_at_end"], result
        assert result["store_peak_rss_mib"] > 0, result
        assert result["good_sends"] > 0 and result["good_p99_ms"] is not None, result
        assert result["flood_answers"] > 0, result
    assert by_mode["none"]["flood_throttled"] == 0
    assert by_mode["quotas"]["flood_throttled"] > 0
    # (The well-behaved producer is under the same small default quota here,
    # so it may be throttled too; without quotas nobody is.)
    assert by_mode["none"]["good_throttled"] == 0
