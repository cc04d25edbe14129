"""What security costs: TLS and ACL authorization against plain text, in the
same run.

Three set-ups, each on a fresh LocalCluster (one partition store, one
transaction coordinator, each its own process) for every case and round:

* `plain`: plain text, no authorizer (`LocalCluster(...)`).
* `tls`: `LocalCluster(security=True)` with `--authorizer none`: TLS and
  authentication (every call's principal from its client certificate), no
  ACLs; the measured client connects as `User:bench` as in `secured`. It
  splits the secured set-up's cost into TLS with authentication, and the
  authorizer on top.
* `secured`: `LocalCluster(security=True)`: every service serves TLS and
  verifies client certificates, principals come from the certificates, and
  `--authorizer acl` checks every call against the ACLs. The measured
  client connects as `User:bench`, a principal that is not a super user and
  holds exactly what its case needs: Write on the topic and IdempotentWrite
  on the cluster (what Kafka documents for an idempotent producer;
  InitProducerId without a transactional id accepts either, see
  services/common/security/operations.py), and for the latency case Write
  on the transactional id of its transactions. So every produce, every
  InitProducerId and every transaction call is authorized through ACLs.
  Topics and ACLs are set up by `User:admin` before the clock starts, and
  the case starts once every service has read the ACLs.

Cases (`--cases`, comma-separated), the workloads of bench/peers.py and
bench/replication.py, run by the same code:

* `produce-1p`, `produce-4p`: the idempotent producer, 100 B records, one
  or four partitions, for `--seconds` (bench/produce.py's run_sdk, linger
  5 ms, 512 KiB batches); records/s. Afterwards the topic's high watermarks
  must add up to the records sent.
* `latency`: back-to-back one-record transactions (begin, send, wait for
  the acknowledgement, commit), then back-to-back acknowledged sends of one
  record (`send().result()`), linger 0, 4 partitions, `--latency-samples`
  each after 20 to warm up (bench/pipeline.py's measure_latency); p50, p99.

Each round runs every case on every set-up, the order rotated from round
to round (plain, tls, secured; then tls, secured, plain; ...), so none
always finds the machine as another left it. The table gives, per measure,
the median over the rounds with the lowest and highest round in brackets,
what TLS alone keeps of plain text's performance, the ratio secured / plain
of the medians (with the range of the per-round ratios), and what the
secured cluster keeps of plain text's performance (the ratio for rates, its
inverse for latencies) against the target of 0.85.

    .venv/bin/python -m bench.security                       # 5 rounds (~10 min)
    .venv/bin/python -m bench.security --rounds 1 --seconds 1 --latency-samples 20   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Run as a script (`python bench/security.py`), the repository root is not on
# sys.path; the sibling benchmarks are imported as the package `bench`.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import peers, pipeline, produce, replication  # noqa: E402
from bench.peers import cell  # noqa: E402
from bench.replication import Measurement, spread, wait_until  # noqa: E402
from oncelog import AclBinding, Admin  # noqa: E402
from oncelog.testing import KINDS, LocalCluster  # noqa: E402
from oncelog.types import ACL_CLUSTER_NAME  # noqa: E402

# The measured client's principal on the secured cluster, and the super
# user that sets up topics and ACLs (LocalCluster's SUPER_USERS).
CLIENT_NAME = "bench"
PRINCIPAL = f"User:{CLIENT_NAME}"
ADMIN_NAME = "admin"
ACLS_TOPIC = "__acls"
ACLS_APPLIED_TIMEOUT_S = 60.0

# The target: the secured cluster keeps at least this share of plain
# text's throughput (and, for latencies, plain / secured at least this).
TARGET_KEPT = 0.85

CASES = replication.COMPARED_CASES
# The rows of the other benchmarks' tables, defined once (bench/peers.py).
METRICS = replication.METRICS


@dataclass(frozen=True, slots=True)
class Setup:
    key: str
    title: str
    security: bool
    # --authorizer acl (with security): every call checked against the ACLs.
    authorizer: bool


PLAIN = Setup("plain", "plain text", security=False, authorizer=False)
TLS = Setup("tls", f"TLS, no authorizer ({PRINCIPAL})", security=True, authorizer=False)
SECURED = Setup("secured", f"TLS + ACLs ({PRINCIPAL})", security=True, authorizer=True)
SETUPS = (PLAIN, TLS, SECURED)


@dataclass(frozen=True, slots=True)
class TableRow:
    label: str
    unit: str
    higher_is_better: bool
    # setup key -> (median, min, max) over the rounds.
    figures: dict[str, tuple[float, float, float]]
    # secured's median / plain's median; None without both.
    ratio: float | None
    # secured / plain taken per round: (median, min, max); None without both.
    round_ratios: tuple[float, float, float] | None
    # What the secured cluster keeps of plain text's performance: the ratio
    # for rates, its inverse for latencies (1.0: no cost).
    kept: float | None
    # The same for TLS alone (the `tls` set-up); None without both.
    tls_kept: float | None = None


@dataclass(frozen=True, slots=True)
class Report:
    rows: list[TableRow]
    # Records sent and not in the log afterwards: 0 unless something is wrong.
    undelivered_records: int
    # The 1-minute load average when the run started and ended.
    load_at_start: float
    load_at_end: float


def setup_order(round_no: int) -> tuple[Setup, ...]:
    """SETUPS rotated by one each round: each goes first in turn."""
    shift = (round_no - 1) % len(SETUPS)
    return SETUPS[shift:] + SETUPS[:shift]


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


# --- clusters, ACLs and clients --------------------------------------------------


@contextlib.contextmanager
def started_cluster(setup: Setup) -> Iterator[LocalCluster]:
    """A fresh cluster (one store, one transaction coordinator, no group
    coordinator) in a temporary directory, as `setup` says."""
    # LocalCluster's extra_args come after its security flags, and win.
    no_authorizer = {kind: ["--authorizer", "none"] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0, security=setup.security,
                         extra_args=None if setup.authorizer else no_authorizer) as cluster:
        yield cluster


def admin_options(cluster: LocalCluster) -> dict[str, Any]:
    """Admin's connection options: the super user on a secured cluster."""
    return dict(cluster.client_config(ADMIN_NAME)) if cluster.security else {}


def bench_acls(topic: str, *, transactional_id: str | None = None) -> list[AclBinding]:
    """Everything the measured principal may do: write `topic` idempotently
    and, when given, run transactions under `transactional_id`. Write
    implies Describe, which Metadata and FindCoordinator need."""
    bindings = [
        AclBinding(principal=PRINCIPAL, resource_type="topic", resource_name=topic,
                   operation="write"),
        AclBinding(principal=PRINCIPAL, resource_type="cluster",
                   resource_name=ACL_CLUSTER_NAME, operation="idempotent_write"),
    ]
    if transactional_id is not None:
        bindings.append(AclBinding(principal=PRINCIPAL, resource_type="transactional_id",
                                   resource_name=transactional_id, operation="write"))
    return bindings


ACL_APPLIED = re.compile(r"^oncelog_acl_applied_offset(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)


def acl_applied_offset(cluster: LocalCluster, kind: str, index: int) -> float | None:
    """How far one service has read `__acls`, from its metrics."""
    with urllib.request.urlopen(cluster.metrics_url(kind, index), timeout=10) as resp:
        found = ACL_APPLIED.search(resp.read().decode())
    return None if found is None else float(found.group(1))


def wait_acls_applied(cluster: LocalCluster) -> None:
    """Waits until every running service has read `__acls` to its end as it
    is now, so the measured client's first call is decided by its ACLs (a
    service that has not read them answers COORDINATOR_LOAD_IN_PROGRESS, and
    one that read only part of them refuses)."""
    with Admin(bootstrap=cluster.bootstrap, **admin_options(cluster)) as admin:
        end = sum(p.high_watermark for p in admin.describe_topic(ACLS_TOPIC).partitions)
    for kind in KINDS:
        for proc in cluster.processes[kind]:
            if not proc.alive():
                continue

            def applied(kind: str = kind, index: int = proc.node_id) -> bool:
                try:
                    offset = acl_applied_offset(cluster, kind, index)
                except OSError:  # its metrics port not answering yet: not yet
                    return False
                return offset is not None and offset >= end

            wait_until(f"{kind} {proc.node_id} reads {ACLS_TOPIC} up to offset {end}",
                       applied, ACLS_APPLIED_TIMEOUT_S)


def prepare(cluster: LocalCluster, topic: str, partitions: int, *,
            transactional_id: str | None = None, authorizer: bool = True) -> dict[str, Any]:
    """Creates the topic (as the super user on a secured cluster), grants
    the measured principal its ACLs and waits until every service has them
    (`authorizer`: a cluster that checks ACLs); returns the measured
    client's connection options ({} in plain text)."""
    with Admin(bootstrap=cluster.bootstrap, **admin_options(cluster)) as admin:
        admin.create_topic(topic, partitions=partitions, config=replication.TOPIC_CONFIG)
        if not cluster.security:
            return {}
        if authorizer:
            admin.create_acls(bench_acls(topic, transactional_id=transactional_id))
    if authorizer:
        wait_acls_applied(cluster)
    return dict(cluster.client_config(CLIENT_NAME))


def records_in_log(cluster: LocalCluster, topic: str) -> int:
    with Admin(bootstrap=cluster.bootstrap, **admin_options(cluster)) as admin:
        return sum(p.high_watermark for p in admin.describe_topic(topic).partitions)


# --- the cases ---------------------------------------------------------------------


def run_produce(args: argparse.Namespace, setup: Setup, partitions: int) -> Measurement:
    """bench/produce.py's SDK client on a fresh cluster; the clock covers
    creating the producer and the final flush, as in bench/peers.py."""
    topic = replication.PRODUCE_TOPIC
    with started_cluster(setup) as cluster:
        options = prepare(cluster, topic, partitions, authorizer=setup.authorizer)
        load = load_1m()
        started = time.perf_counter()
        sent, _ = produce.run_sdk(cluster.bootstrap, topic, value_bytes=peers.SMALL_BYTES,
                                  partitions=partitions, duration_s=args.seconds,
                                  batch_size=peers.BATCH_SIZE_BYTES,
                                  linger_ms=peers.LINGER_MS, producer_options=options)
        elapsed = time.perf_counter() - started
        # run_sdk counts what it sent; the high watermarks say what was
        # acknowledged (the idempotent producer writes nothing twice).
        written = records_in_log(cluster, topic)
    if written != sent:
        print(f"# WARNING: {setup.key}, {partitions} partition(s): {sent} records sent, "
              f"{written} in the log", flush=True)
    return Measurement("", setup.key, 0, {"records_per_s": round(sent / elapsed)},
                       {"records": sent, "seconds": round(elapsed, 2),
                        "undelivered": sent - written, "load_1m": load})


def run_latency(args: argparse.Namespace, setup: Setup) -> Measurement:
    """bench/pipeline.py's latency case on a fresh cluster."""
    with started_cluster(setup) as cluster:
        options = prepare(cluster, pipeline.OUTPUT, pipeline.PARTITIONS,
                          transactional_id=pipeline.LATENCY_TRANSACTIONAL_ID,
                          authorizer=setup.authorizer)
        load = load_1m()
        run = pipeline.measure_latency(cluster.bootstrap,
                                       latency_samples=args.latency_samples,
                                       value_bytes=peers.SMALL_BYTES, producer_options=options)
    return Measurement("", setup.key, 0, {
        "send_p50_ms": run.send_p50_ms, "send_p99_ms": run.send_p99_ms,
        "transaction_p50_ms": run.transaction_p50_ms,
        "transaction_p99_ms": run.transaction_p99_ms,
    }, {"first_send_p50_ms": run.first_send_p50_ms, "commit_p50_ms": run.commit_p50_ms,
        "load_1m": load})


RUNNERS: dict[str, Callable[[argparse.Namespace, Setup], Measurement]] = {
    "produce-1p": lambda a, s: run_produce(a, s, 1),
    "produce-4p": lambda a, s: run_produce(a, s, pipeline.PARTITIONS),
    "latency": run_latency,
}


# --- rounds and the table ----------------------------------------------------------


def run_rounds(args: argparse.Namespace) -> list[Measurement]:
    measurements: list[Measurement] = []
    for round_no in range(1, args.rounds + 1):
        for case in CASES:
            if case not in args.case_list:
                continue
            for setup in setup_order(round_no):
                m = RUNNERS[case](args, setup)
                m.case, m.round = case, round_no
                measurements.append(m)
                print(f"# round {round_no} {case:10} {setup.key:7} {m.values} {m.details}",
                      flush=True)
    return measurements


def table(measurements: Sequence[Measurement], cases: Sequence[str]) -> list[TableRow]:
    rows: list[TableRow] = []
    for metric in METRICS:
        if metric.case not in cases:
            continue
        mine, figures = replication.case_figures(measurements, metric,
                                                 [s.key for s in SETUPS])
        ratio = _ratio(figures, SECURED)
        kept = _kept(ratio, metric.higher_is_better)
        tls_kept = _kept(_ratio(figures, TLS), metric.higher_is_better)
        per_round = [s.values[metric.key] / p.values[metric.key]
                     for s in mine if s.setup == SECURED.key
                     for p in mine if p.setup == PLAIN.key and p.round == s.round
                     and p.values[metric.key]]
        rows.append(TableRow(metric.label, metric.unit, metric.higher_is_better, figures,
                             ratio, spread(per_round) if per_round else None, kept, tls_kept))
    return rows


def _ratio(figures: dict[str, tuple[float, float, float]], setup: Setup) -> float | None:
    """`setup`'s median / plain text's; None without both."""
    if setup.key in figures and PLAIN.key in figures and figures[PLAIN.key][0]:
        return round(figures[setup.key][0] / figures[PLAIN.key][0], 3)
    return None


def _kept(ratio: float | None, higher_is_better: bool) -> float | None:
    """What a ratio to plain text keeps of its performance: the ratio for
    rates, its inverse for latencies."""
    if ratio is None or (not higher_is_better and not ratio):
        return None
    return ratio if higher_is_better else round(1 / ratio, 3)


def render(rows: Sequence[TableRow]) -> str:
    lines = ["| measure | " + " | ".join(s.title for s in SETUPS)
             + " | TLS alone keeps | secured / plain (per round) | kept of plain text "
             f"(target >= {TARGET_KEPT}) |",
             "|---" * (len(SETUPS) + 4) + "|"]
    for r in rows:
        better = "higher is better" if r.higher_is_better else "lower is better"
        ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"
        if r.round_ratios is not None and r.round_ratios[1] != r.round_ratios[2]:
            _median, low, high = r.round_ratios
            ratio += f" ({low:.3f}–{high:.3f})"
        kept = "—" if r.kept is None else (
            f"{r.kept:.3f}, {'meets' if r.kept >= TARGET_KEPT else 'misses'}")
        tls_kept = "—" if r.tls_kept is None else f"{r.tls_kept:.3f}"
        lines.append(f"| {r.label} ({better}) | "
                     + " | ".join(cell(r.figures.get(s.key), r.unit) for s in SETUPS)
                     + f" | {tls_kept} | {ratio} | {kept} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long each produce case sends")
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--json", help="also write every round and the table to this file")
    args = parser.parse_args(argv)
    args.case_list = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown or not args.case_list:
        parser.error(f"--cases: {', '.join(unknown) or 'none given'}; known: {', '.join(CASES)}")
    if args.rounds < 1:
        parser.error(f"--rounds is {args.rounds}; it must be >= 1")
    if args.seconds <= 0:
        parser.error(f"--seconds is {args.seconds}; it must be positive")
    if args.latency_samples < 1:
        parser.error(f"--latency-samples is {args.latency_samples}; it must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> Report:
    args = parse_args(argv)
    cases = [c for c in CASES if c in args.case_list]
    load_at_start = load_1m()
    print(f"# {os.cpu_count()} CPUs; {args.rounds} round(s); {args.seconds:g} s per produce "
          f"case; {args.latency_samples} latency samples; cases {', '.join(cases)}; "
          f"Python {sys.version.split()[0]}; load average (1 min) {load_at_start}", flush=True)
    measurements = run_rounds(args)
    report = Report(table(measurements, cases),
                    sum(m.details.get("undelivered", 0) for m in measurements),
                    load_at_start, load_1m())
    print()
    print(f"medians of {args.rounds} round(s) (min–max over the rounds); secured / plain is "
          f"the ratio of the medians (in brackets: the range of the per-round ratios); "
          f"load average (1 min) {report.load_at_start} at the start, "
          f"{report.load_at_end} at the end")
    print(render(report.rows), flush=True)
    if report.undelivered_records:
        print(f"\nWARNING: {report.undelivered_records} records sent were not in the log "
              f"afterwards (see the rounds above)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items()},
                       "principal": PRINCIPAL,
                       "acls": {case: [asdict(b) for b in bench_acls(
                           pipeline.OUTPUT if case == "latency" else replication.PRODUCE_TOPIC,
                           transactional_id=pipeline.LATENCY_TRANSACTIONAL_ID if case == "latency"
                           else None)] for case in cases},
                       "measurements": [asdict(m) for m in measurements],
                       "report": asdict(report)}, f, indent=2)
    return report


if __name__ == "__main__":
    main()
