"""The compiled SDK against the pure one and the peer, interleaved.

`bench/peers.py` measures whichever oncelog its interpreter imports: `.venv`
runs the source tree's `.py` files (an editable install is never compiled),
`.venv-compiled` the compiled wheel (scripts/compiled-venv.sh). This runs
one round of `peers.py` per flavour in turn, each in its own process on a
fresh cluster or broker, for `--rounds` rounds, the order reversed every
other round (compiled, pure, peer; then peer, pure, compiled), and prints
one table of medians (min-max over the rounds) with the ratios compiled /
pure and compiled / peer. The load average is printed before every run: the
machine is shared, and a figure taken under load says so.

The compiled flavour's `LocalCluster` runs the installed `oncelog_server`,
whose stores import the compiled record codec too; the services' own modules
are the same `.py` files in both.

    .venv/bin/python bench/flavours.py                                  # 3 rounds
    .venv/bin/python bench/flavours.py --rounds 1 --seconds 2 --latency-samples 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import peers  # noqa: E402

COMPILED, PURE, PEER = "compiled", "pure", "peer"
# flavour -> (interpreter, peers.py's --systems)
FLAVOURS = {
    COMPILED: (REPO_ROOT / ".venv-compiled" / "bin" / "python", peers.ONCELOG),
    PURE: (REPO_ROOT / ".venv" / "bin" / "python", peers.ONCELOG),
    PEER: (REPO_ROOT / ".venv" / "bin" / "python", peers.PEER),
}
DEFAULT_CASES = "produce-1p,produce-4p,produce-many,latency"
# A failure guard for one peers.py run, not an expectation.
RUN_TIMEOUT_S = 1800.0


def _check_compiled(python: Path) -> None:
    """Refuses to measure a `.venv-compiled` that is missing, stale or pure."""
    check = subprocess.run(["bash", "scripts/compiled-venv.sh", "--check"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise SystemExit(check.stderr.strip())
    origin = subprocess.run(
        [str(python), "-c", "import oncelog.producer; print(oncelog.producer.__file__)"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if not origin.endswith(".so"):
        raise SystemExit(f"{python} imports the pure producer ({origin}), not the compiled one")


def run_one(flavour: str, round_no: int, args: argparse.Namespace,
            out_dir: Path) -> dict[str, dict[str, float]]:
    """One round of peers.py for one flavour: case -> its values."""
    python, system = FLAVOURS[flavour]
    out = out_dir / f"{flavour}-{round_no}.json"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# round {round_no} {flavour}: load average {load}", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run(
        [str(python), "bench/peers.py", "--rounds", "1", "--systems", system,
         "--cases", args.cases, "--seconds", str(args.seconds),
         "--latency-samples", str(args.latency_samples),
         "--copier-records", str(args.copier_records), "--json", str(out)],
        cwd=REPO_ROOT, env=env, check=True, timeout=RUN_TIMEOUT_S,
        stdout=subprocess.DEVNULL if args.quiet else None)
    data = json.loads(out.read_text())
    return {m["case"]: m["values"] for m in data["rounds"]}


def _ratio(figures: dict[str, tuple[float, float, float]], a: str, b: str) -> str:
    """a's median over b's, when both ran."""
    if a in figures and b in figures and figures[b][0]:
        return f"{figures[a][0] / figures[b][0]:.2f}"
    return "—"


def render(results: dict[str, list[dict[str, dict[str, float]]]], cases: Sequence[str],
           copier_records: int) -> str:
    lines = ["| measure | compiled | pure | peer | compiled / pure | compiled / peer |",
             "|---|---|---|---|---|---|"]
    for metric in peers.METRICS:
        if metric.case not in cases:
            continue
        figures: dict[str, tuple[float, float, float]] = {}
        for flavour, rounds in results.items():
            values = [r[metric.case][metric.key] for r in rounds if metric.case in r]
            if values:
                figures[flavour] = (statistics.median(values), min(values), max(values))

        better = "higher is better" if metric.higher_is_better else "lower is better"
        label = metric.label.format(copier_records=f"{copier_records:,}")
        lines.append(f"| {label} ({better}) | "
                     + " | ".join(peers.cell(figures.get(f), metric.unit)
                                  for f in (COMPILED, PURE, PEER))
                     + f" | {_ratio(figures, COMPILED, PURE)} | "
                     f"{_ratio(figures, COMPILED, PEER)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help=f"peers.py's cases, comma-separated (default: {DEFAULT_CASES})")
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--copier-records", type=int, default=1_000_000,
                        help="records the copier case copies (peers.py's --copier-records)")
    parser.add_argument("--flavours", default=",".join(FLAVOURS),
                        help=f"comma-separated, of: {', '.join(FLAVOURS)}")
    parser.add_argument("--quiet", action="store_true", help="hide peers.py's own output")
    parser.add_argument("--json", help="also write every round to this file")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    flavours = [f for f in args.flavours.split(",") if f]
    unknown = [c for c in cases if c not in peers.CASES] + [f for f in flavours
                                                           if f not in FLAVOURS]
    if unknown or not cases or not flavours or args.rounds < 1:
        parser.error(f"unknown or empty: {', '.join(unknown) or '--cases/--flavours/--rounds'}")
    if COMPILED in flavours:
        _check_compiled(FLAVOURS[COMPILED][0])
    results: dict[str, list[dict[str, dict[str, float]]]] = {f: [] for f in flavours}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-flavours-") as tmp:
        for round_no in range(1, args.rounds + 1):
            order = flavours if round_no % 2 else list(reversed(flavours))
            for flavour in order:
                results[flavour].append(run_one(flavour, round_no, args, Path(tmp)))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nmedians of {args.rounds} round(s) (min–max over the rounds); "
          f"load average at the end {load}")
    print(render(results, cases, args.copier_records), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rounds": results}, f, indent=2)


if __name__ == "__main__":
    main()
