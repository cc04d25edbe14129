"""Runs seeds of the real-runtime simulation from the command line.

    .venv/bin/python -m tests.sim.real --seed 17            # one seed, trace tail on failure
    .venv/bin/python -m tests.sim.real --seed 17 --verbose  # every event
    .venv/bin/python -m tests.sim.real --seeds 1..200       # a range, then a summary
    .venv/bin/python -m tests.sim.real --seeds 1..50 --bug no-confirm-ownership
    .venv/bin/python -m tests.sim.real --seed 17 --replicated   # three replicated stores
    .venv/bin/python -m tests.sim.real --seeds 1..20 --replicated --bug elect-outside-isr
    .venv/bin/python -m tests.sim.real --seeds 1..50 --fsync        # machine crashes anywhere
    .venv/bin/python -m tests.sim.real --seeds 1..20 --fsync --replicated --bug fsync-ignored

String hashing is randomized per process unless PYTHONHASHSEED is set; the
run re-executes itself with PYTHONHASHSEED=0 so a seed replays the same
anywhere (the pytest module checks that the hash seed does not matter).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.sim.real.simulation import BUGS, replay_command, run_seed


def _seed_range(text: str) -> range:
    first, _, last = text.partition("..")
    return range(int(first), int(last or first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.real", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--seeds", type=_seed_range, help="A..B, both included")
    parser.add_argument("--steps", type=int, default=None,
                        help="loop iterations before quiescing (default 5000; 20000 "
                             "with --replicated)")
    parser.add_argument("--bug", choices=sorted(BUGS), help="run a deliberately broken runtime")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--replicated", action="store_true",
                        help="three replicated stores (RF 3, min.insync.replicas 2) with the "
                             "metadata in a shared in-memory etcd, and replication's faults")
    parser.add_argument("--fsync", action="store_true",
                        help="stores that fsync each group commit before acknowledging it, "
                             "and machine crashes (lost unsynced writes) of any store at any "
                             "moment, several or all at once")
    parser.add_argument("--verbose", action="store_true", help="print every trace line")
    args = parser.parse_args(argv)
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else args.seeds
    failed: list[int] = []
    started_s = time.perf_counter()
    steps = 0
    for seed in seeds:
        result = run_seed(seed, steps=args.steps, bug=args.bug, verbose=args.verbose,
                          faults=not args.no_faults, replicated=args.replicated,
                          fsync=args.fsync)
        steps += result.steps
        print(result.summary(), flush=True)
        if not result.ok:
            failed.append(seed)
            if not args.verbose:
                print(result.trace_tail)
            print(f"FAILED: {result.failure}")
            replay = replay_command(seed, steps=args.steps, bug=args.bug,
                                    replicated=args.replicated, fsync=args.fsync)
            print(f"replay: {replay}", flush=True)
    wall_s = time.perf_counter() - started_s
    print(f"{len(seeds)} seeds, {len(failed)} failed {failed[:20]}; {steps / wall_s:.0f} "
          f"steps/s, {len(seeds) / wall_s * 60:.1f} seeds/min")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim.real", *sys.argv[1:]])
    sys.exit(main())
