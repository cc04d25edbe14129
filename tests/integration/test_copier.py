"""The exactly-once copier (examples/copier.py) under faults, as real processes.

Goal: a consume-transform-produce pipeline in group mode is exactly once —
every input record appears in the output (read_committed) once, in input
order per key, and the group's committed offsets end at the input's end
offsets — while
* copier processes are kill -9'd and restarted at random moments, and each
  service (partition store, transaction coordinator, group coordinator) is
  kill -9'd and restarted;
* the copiers abort every third transaction on purpose and rewind to the
  committed offsets;
* a copier is paused (SIGSTOP) past its session timeout while its partitions
  move to another member, then resumed: that zombie's TxnOffsetCommit is
  fenced, its transaction aborted, and nothing it wrote becomes visible.

Method: LocalCluster plus three `python examples/copier.py` processes, the
checks in tests/support/copier.py. A longer run (100,000 records, more
kills) is tests/chaos/test_copier_chaos.py, behind `bash scripts/chaos.sh`.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog import Admin
from oncelog.testing import LocalCluster
from tests.support.copier import (
    Chaos,
    CopierFleet,
    produce_in_background,
    produce_input,
    verify_exactly_once,
    wait_until_copied,
)

PARTITIONS = 4
RECORDS = 10_000
SESSION_MS = 3000
_ids = itertools.count()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", consumer_offsets_partitions=2,
                      extra_args={"group_coordinator": ["--min-session-timeout-ms", "500"]}) as c:
        yield c


def topics(cluster: LocalCluster) -> tuple[str, str, str]:
    n = next(_ids)
    names = (f"in-{n}", f"out-{n}", f"copier-{n}")
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(names[0], partitions=PARTITIONS)
        admin.create_topic(names[1], partitions=PARTITIONS)
    return names


def fleet(cluster: LocalCluster, tmp_path: Path, names: tuple[str, str, str],
          *extra: str) -> CopierFleet:
    return CopierFleet(
        bootstrap=cluster.bootstrap, input_topic=names[0], output_topic=names[1],
        group=names[2], log_dir=tmp_path / "copiers",
        extra_args=["--session-timeout-ms", str(SESSION_MS), "--max-poll-records", "200",
                    *extra],
    )


def test_copier_is_exactly_once_while_copiers_and_services_are_killed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    names = topics(cluster)
    copiers = fleet(cluster, tmp_path, names)
    for i in range(3):
        copiers.start(i)
    plan = ["copier", "partition_store", "copier", "coordinator", "copier", "group_coordinator"]
    chaos = Chaos(cluster, copiers, seed=int(os.environ.get("ONCELOG_CHAOS_SEED", "7")),
                  interval_s=1.5, plan=plan)
    # Input keeps arriving for as long as the faults do, so every fault lands
    # while the copiers are busy.
    producer = produce_in_background(cluster.bootstrap, names[0], RECORDS, duration_s=10)
    chaos.start()
    try:
        producer.join(timeout=120)
        chaos.join()
        wait_until_copied(cluster, copiers, PARTITIONS, timeout_s=240)
    finally:
        chaos.stop()
        copiers.stop_all()
    assert chaos.error is None, repr(chaos.error)
    assert chaos.done == plan
    checked = verify_exactly_once(cluster.bootstrap, names[0], names[1], PARTITIONS)
    assert checked == RECORDS
    print(f"faults injected: {chaos.done}")


def test_copier_aborting_every_third_transaction_is_exactly_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    names = topics(cluster)
    produce_input(cluster.bootstrap, names[0], RECORDS // 2)
    copiers = fleet(cluster, tmp_path, names, "--abort-every", "3")
    for i in range(3):
        copiers.start(i)
    try:
        wait_until_copied(cluster, copiers, PARTITIONS, timeout_s=180)
    finally:
        copiers.stop_all()
    assert verify_exactly_once(cluster.bootstrap, names[0], names[1], PARTITIONS) == \
        RECORDS // 2
    aborted = sum(path.read_text().count("aborting and rewinding") for path in
                  (tmp_path / "copiers").glob("*.log"))
    assert aborted == 0, "planned aborts are not failures"


def test_a_paused_copier_is_fenced_and_nothing_it_wrote_is_visible(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    names = topics(cluster)
    produce_input(cluster.bootstrap, names[0], 2000)
    copiers = fleet(cluster, tmp_path, names, "--max-poll-records", "20")
    # Copier 0 stops itself in its 5th transaction: records sent, offsets not.
    copiers.extra_args += ["--test-stop-before-offsets", "5", "--transaction-timeout-ms", "60000"]
    copiers.start(0)
    copiers.extra_args = copiers.extra_args[:-4]
    deadline = time.monotonic() + 60
    while _state(copiers.procs[0].pid) != "T":
        assert time.monotonic() < deadline, copiers.log_tail()
        time.sleep(0.1)
    copiers.start(1)
    try:
        # The zombie's session times out; copier 1 takes every partition and
        # copies everything (its output stays behind the zombie's open
        # transaction for read_committed readers until that one ends).
        wait_until_copied(cluster, copiers, PARTITIONS, timeout_s=120,
                          restart_exited=False)
        copiers.procs[0].send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 60
        log0 = tmp_path / "copiers" / "copier-0.log"
        while "aborting and rewinding" not in log0.read_text():
            assert time.monotonic() < deadline, copiers.log_tail()
            time.sleep(0.2)
        assert "UnknownMemberIdError" in log0.read_text(), copiers.log_tail()
    finally:
        copiers.procs[0].send_signal(signal.SIGCONT)
        copiers.stop_all()
    assert verify_exactly_once(cluster.bootstrap, names[0], names[1], PARTITIONS) == 2000


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
