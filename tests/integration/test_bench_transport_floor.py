"""bench/transport_floor.py: the transport-floor benchmark cannot rot.

Goal: the script's own path (the child process per client transport, every
arm on a real one-store cluster, the peer on a real Tansu broker, the
rounds, the table, the JSON file) runs end to end, every arm's sends are
acknowledged (a refused send fails the run), and the table's medians,
ranges and ratios come out right.

Method: `main()` with a few samples against real service processes on
127.0.0.1; the table arithmetic on hand-made rounds. No assertion depends
on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import transport_floor as tf


def test_every_arm_runs_through_the_scripts_own_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "floor.json"
    table = tf.main(["--rounds", "1", "--samples", "10", "--engines", "classic",
                     "--json", str(out_json)])
    arms = [e["arm"] for e in table]
    assert arms == [f"{arm}, client on classic" for arm in tf.ARMS] + [tf.PEER_ARM]
    for entry in table:
        p50, low, high = entry["p50_ms"]
        assert 0 < p50 == low == high, entry
        assert entry["p99_ms"][0] >= p50, entry
    assert json.loads(out_json.read_text())["table"][0]["arm"] == arms[0]
    out = capsys.readouterr().out
    assert "| sdk, client on classic |" in out and "| peer |" in out


def test_the_table_takes_medians_ranges_and_the_ratio_to_the_peer() -> None:
    rows = [{"round": n, "arm": arm, "p50_ms": p50, "p99_ms": p50 * 2}
            for n, (arm, p50) in enumerate([("sdk, client on default", 0.5),
                                            ("sdk, client on default", 0.3),
                                            ("sdk, client on default", 0.4),
                                            ("peer", 0.2), ("peer", 0.1), ("peer", 0.3)])]
    sdk, peer = tf.summary(rows)
    assert sdk["p50_ms"] == (0.4, 0.3, 0.5)
    assert sdk["p99_ms"] == (0.8, 0.6, 1.0)
    assert sdk["p50_over_peer"] == 2.0
    assert peer["p50_over_peer"] == 1.0
    assert tf.summary(rows[:3])[0]["p50_over_peer"] is None
    rendered = tf.render([sdk, peer])
    assert "| sdk, client on default | 0.400 ms (0.300–0.500) | 0.800 ms (0.600–1.000) | 2.00 |" \
        in rendered


def test_an_unknown_transport_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        tf.main(["--engines", "epoll"])
    assert "--engines: epoll; known: default, classic" in capsys.readouterr().err
