"""The main job (examples/payments_pipeline.py, `bash scripts/demo.sh`) at a
small size, with chaos; and with it, the two-phase-commit sink's driver
killed between its tasks' prepare and its commit.

Goal: the payments pipeline — a transactional generator with deliberate
aborts, the Spark job as its own process writing a double-entry ledger
through the two-phase-commit sink (`writeStream.format("oncelog")`), and
kill -9s of the partition store, the coordinator and the Spark driver —
ends with its own verification passed: every committed payment's debit and
credit in the ledger exactly once, no aborted payment, entries summing to
zero, every balance right; and nothing left hanging: the hanging-
transaction tool (`Admin.find_hanging_transactions`, what `oncelog
transactions find-hanging` prints) reports none and no transaction of the
sink is still prepared or open. The driver kill is aimed: with every task
of a micro-batch prepared and the driver's commit not yet begun (the
sink's commit-hold hook), then the job restarts from its checkpoint — the
streaming sink's hardest case, so it shares this run instead of starting
two more JVMs of its own.

Method: the pipeline runs as a subprocess exactly as a user runs it (2,000
payments over 10 s, three faults: one of each kind, the driver's in the
commit window, the others at seeded random moments once the Spark job is
at work); the test reads its exit status and its summary table. The
pipeline's checks are independent of the job: they read `payments` and
`ledger` back with read_committed. Two JVM starts, so this is one of the
longer default tests (one to two minutes on a busy 2-core machine).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "examples" / "payments_pipeline.py"
# Failure guard for a pipeline that never ends (not a timing assumption).
PIPELINE_TIMEOUT_S = 600


def summary(stdout: str) -> dict[str, str]:
    """The summary table's rows: name -> value (two spaces or more apart)."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("  ") and "  " in line.strip():
            name, value = line.strip().split("  ", 1)
            rows[name.strip()] = value.strip()
    return rows


def test_the_payments_pipeline_passes_its_verification_under_chaos(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(PIPELINE), "--payments", "2000", "--generate-s", "10",
         "--faults", "5", "--seed", "7", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=PIPELINE_TIMEOUT_S, check=False, cwd=REPO,
    )
    job_log = tmp_path / "job" / "job.log"
    tail = job_log.read_text(errors="replace")[-3000:] if job_log.exists() else ""
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}\n{tail}"
    rows = summary(done.stdout)
    assert "exactly once: OK" in done.stdout
    assert rows["duplicates"] == "0" and rows["missing"] == "0"
    assert rows["aborted payments in the ledger"] == "0"
    assert rows["sum of all entries (cents)"] == "0"
    assert rows["accounts whose balance is off"] == "0 of 50"
    assert rows["hanging / open sink transactions"] == "0 / 0"
    # Each kind once: a store killed and restarted, the coordinator, the
    # driver, a store's disk wiped, and last a store killed for good.
    assert rows["faults injected"] == (
        "5 (partition store 1, coordinator 1, Spark driver 1, partition store with its "
        "disk wiped 1, partition store for good 1)")
    records_in = int(rows["records in (committed payments)"].replace(",", ""))
    assert 0 < records_in < 2000, "some payments were aborted on purpose"
    assert rows["records out (ledger entries)"] == f"{2 * records_in:,}"
    assert rows["driver kills between prepare and commit"] == "1"
    assert rows["sink"].startswith("two-phase commit")
    assert int(rows["Spark job starts"].split()[0]) >= 2, "the driver was restarted"


def test_bad_usage_exits_2() -> None:
    done = subprocess.run([sys.executable, str(PIPELINE), "--payments", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--payments must be positive" in done.stderr
