"""bench/security.py: the security benchmark cannot rot, and its secured
set-up measures what it says.

Goal: every case (idempotent produce on one and four partitions, the
acknowledged-send and one-record-transaction latencies) runs end to end on
all three set-ups through the script's own path (argument parsing, the
interleaved rounds, the table, the JSON file), and the table has a positive
figure, a secured / plain ratio and the share kept of plain text wherever it
promises one; every record sent is in the log afterwards. The secured
set-up's client is a least-privilege principal, not a super user: its ACLs
let it write the measured topic idempotently and run transactions under the
measured transactional id, and nothing else (another topic, another
transactional id and the ACL listing are refused). The table arithmetic
(medians, ranges, the ratio of the medians, the per-round ratios, the share
kept for rates and for latencies) and the set-ups' alternating order come
out right.

Method: `main()` with tiny sizes (half a second of producing, 5 latency
samples, one round) against real service processes on 127.0.0.1; the
principal's rights checked with the SDK on a real secured cluster set up by
the script's own `prepare`; the arithmetic on hand-made measurements. No
assertion depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import pipeline
from bench import security as bench
from oncelog import Admin, Producer, errors
from oncelog.testing import LocalCluster

PATIENT_MS = 30_000


def _table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


@pytest.mark.slow  # 15-40 s of real clusters: `pytest -m slow`, not the default run
def test_every_case_runs_on_both_setups_and_every_figure_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out_json = tmp_path / "security.json"
    report = bench.main(["--rounds", "1", "--seconds", "0.5", "--latency-samples", "5",
                         "--json", str(out_json)])
    assert [r.label for r in report.rows] == [m.label for m in bench.METRICS]
    for row in report.rows:
        assert set(row.figures) == {s.key for s in bench.SETUPS}, row.label
        assert all(median > 0 for median, _low, _high in row.figures.values()), row.label
        assert row.ratio is not None and row.ratio > 0, row.label
        assert row.kept is not None and row.kept > 0, row.label
        assert row.tls_kept is not None and row.tls_kept > 0, row.label
    assert report.undelivered_records == 0

    out = capsys.readouterr().out
    lines = _table_lines(out)
    assert lines[0] == ("| measure | plain text | TLS, no authorizer (User:bench) | "
                        "TLS + ACLs (User:bench) | TLS alone keeps | secured / plain "
                        "(per round) | kept of plain text (target >= 0.85) |")
    assert len(lines) == 2 + len(bench.METRICS)
    assert all("—" not in line for line in lines[2:])
    assert sum(1 for line in lines if line.startswith("| idempotent produce")) == 2
    # Round 1 runs plain first in every case.
    progress = [line.split()[3:5] for line in out.splitlines() if line.startswith("# round")]
    assert progress == [[case, setup.key] for case in bench.CASES for setup in bench.SETUPS]

    saved = json.loads(out_json.read_text())
    assert sorted((m["case"], m["setup"]) for m in saved["measurements"]) == sorted(
        (case, s.key) for case in bench.CASES for s in bench.SETUPS)
    assert saved["principal"] == "User:bench"
    assert {a["operation"] for a in saved["acls"]["latency"]} == {"write", "idempotent_write"}
    assert len(saved["report"]["rows"]) == len(bench.METRICS)


def test_the_secured_client_holds_only_what_its_case_needs(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0, security=True) as cluster:
        options = bench.prepare(cluster, "measured", 2,
                                transactional_id=pipeline.LATENCY_TRANSACTIONAL_ID)
        assert options == dict(cluster.client_config("bench"))
        with Admin(bootstrap=cluster.bootstrap, **cluster.client_config("admin")) as admin:
            admin.create_topic("unmeasured", partitions=1)

        with Producer(bootstrap=cluster.bootstrap, max_block_ms=PATIENT_MS,
                      delivery_timeout_ms=PATIENT_MS, **options) as producer:
            assert producer.send("measured", value=b"v", partition=1).result(timeout=60) \
                .offset == 0
            with pytest.raises(errors.TopicAuthorizationFailedError, match="unmeasured"):
                producer.send("unmeasured", value=b"v").result(timeout=60)

        with Producer(bootstrap=cluster.bootstrap,
                      transactional_id=pipeline.LATENCY_TRANSACTIONAL_ID, **options) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("measured", value=b"t", partition=0).result(timeout=60)
            producer.commit_transaction()
        with Producer(bootstrap=cluster.bootstrap, transactional_id="someone-else",
                      max_block_ms=PATIENT_MS, **options) as producer, \
                pytest.raises(errors.TransactionalIdAuthorizationFailedError):
            producer.init_transactions()

        # Not a super user: listing the ACLs needs Describe on the cluster.
        with Admin(bootstrap=cluster.bootstrap, default_api_timeout_ms=PATIENT_MS,
                   **options) as as_bench, \
                pytest.raises(errors.ClusterAuthorizationFailedError):
            as_bench.describe_acls()


def test_plain_text_needs_no_acls_and_no_options(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", group_coordinators=0) as cluster:
        assert bench.prepare(cluster, "measured", 1) == {}
        with Admin(bootstrap=cluster.bootstrap) as admin:
            assert admin.list_topics() == {"measured": 1}


def test_the_tls_setup_authenticates_and_checks_no_acls() -> None:
    with bench.started_cluster(bench.TLS) as cluster:
        options = bench.prepare(cluster, "measured", 1, authorizer=False)
        assert options == dict(cluster.client_config("bench"))
        with Admin(bootstrap=cluster.bootstrap, **cluster.client_config("admin")) as admin:
            admin.create_topic("unmeasured", partitions=1)
            with pytest.raises(errors.SecurityDisabledError):
                admin.describe_acls()
        # No ACL names User:bench, and without an authorizer it may write anything.
        with Producer(bootstrap=cluster.bootstrap, **options) as producer:
            assert producer.send("unmeasured", value=b"v").result(timeout=60).offset == 0


def test_table_takes_medians_ratios_and_the_share_kept() -> None:
    def m(case: str, setup: bench.Setup, round_no: int, **values: float) -> bench.Measurement:
        return bench.Measurement(case, setup.key, round_no, dict(values))

    plain, tls, secured = bench.PLAIN, bench.TLS, bench.SECURED
    measurements = [
        m("produce-1p", tls, 1, records_per_s=95.0),
        m("produce-1p", plain, 1, records_per_s=100.0),
        m("produce-1p", secured, 1, records_per_s=90.0),
        m("produce-1p", secured, 2, records_per_s=60.0),
        m("produce-1p", plain, 2, records_per_s=200.0),
        m("produce-1p", plain, 3, records_per_s=100.0),
        m("produce-1p", secured, 3, records_per_s=80.0),
    ]
    latency = {"send_p99_ms": 1.0, "transaction_p50_ms": 1.0, "transaction_p99_ms": 1.0}
    measurements += [m("latency", plain, 1, send_p50_ms=1.0, **latency),
                     m("latency", secured, 1, send_p50_ms=1.25, **latency)]
    rows = {r.label: r for r in bench.table(measurements, ["produce-1p", "latency"])}
    rate = rows["idempotent produce, 100 B, 1 partition"]
    assert rate.figures == {"plain": (100.0, 100.0, 200.0), "tls": (95.0, 95.0, 95.0),
                            "secured": (80.0, 60.0, 90.0)}
    # The ratio of the medians, not of the rounds: 80 / 100.
    assert rate.ratio == 0.8 and rate.kept == 0.8 and rate.tls_kept == 0.95
    assert rate.round_ratios == (0.8, 0.3, 0.9)
    send = rows["acknowledged send, one record, p50"]
    # A latency 1.25 times plain text's keeps 0.8 of its performance.
    assert (send.ratio, send.kept, send.tls_kept) == (1.25, 0.8, None)
    assert "idempotent produce, 4 partitions" not in " ".join(rows)

    lines = _table_lines(bench.render(list(rows.values())))
    (rate_line,) = [line for line in lines if line.startswith("| idempotent produce")]
    assert "100 records/s (100–200) | 95 records/s | 80 records/s (60–90) | 0.950 | " \
           "0.800 (0.300–0.900) | 0.800, misses |" in rate_line
    (send_line,) = [line for line in lines if line.startswith("| acknowledged send, one "
                                                              "record, p50")]
    assert send_line.endswith("| — | 1.250 | 0.800, misses |")


def test_setups_take_turns_going_first() -> None:
    assert [bench.setup_order(r)[0] for r in (1, 2, 3, 4)] == [
        bench.PLAIN, bench.TLS, bench.SECURED, bench.PLAIN]
    assert all(set(bench.setup_order(r)) == set(bench.SETUPS) for r in (1, 2, 3))


def test_bad_arguments_are_refused() -> None:
    for argv in (["--cases", "produce-1p,nonsense"], ["--cases", ","], ["--rounds", "0"],
                 ["--seconds", "0"], ["--latency-samples", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.parse_args([]).rounds >= 5
