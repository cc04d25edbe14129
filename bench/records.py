"""The record codec's per-record cost: encode_batch and the readers.

Times, on batches of --records records of --value-bytes bytes (timestamps
spread over 10 ms, as a producer's batch has them), with and without keys:

* `encode`: records.encode_batch (the producer's per-batch work),
* `decode`: list(records.iter_records(batch)) (Records, named tuples),
* `consume`: what the consumer does per batch: the records unpacked into
  ConsumerRecords (through iter_record_fields where the codec has it).

With --compare PATH, the same cases also run on another copy of the codec
(a records.py file, for instance the previous version:
`git show REV:sdk/oncelog/wire/records.py > /tmp/records_before.py`),
interleaved with this one round by round, so a noisy machine slows both
alike; the figures are medians over the rounds, in microseconds per batch.

    .venv/bin/python bench/records.py
    .venv/bin/python bench/records.py --compare /tmp/records_before.py --rounds 15
    .venv/bin/python bench/records.py --compression gzip
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from oncelog import ConsumerRecord
from oncelog.wire import records as current
from oncelog.wire.compression import CODEC_NAMES

BASE_TS = 1_700_000_000_000


def load_codec(path: Path) -> ModuleType:
    """A records.py file as a module of its own. Its relative imports (the
    current version's .compression and .limits) resolve in oncelog.wire."""
    spec = importlib.util.spec_from_file_location("oncelog.wire._records_compared", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rows(count: int, value_bytes: int, keyed: bool
         ) -> list[tuple[bytes | None, bytes | None, None, int]]:
    return [((b"key-%d" % i) if keyed else None, bytes(value_bytes), None,
             BASE_TS + i * 10 // count) for i in range(count)]


def consume(codec: ModuleType, batch: bytes) -> list[ConsumerRecord]:
    """The consumer's per-record work: each record unpacked into a ConsumerRecord."""
    fields: Callable[..., Iterator[Any]] = getattr(codec, "iter_record_fields",
                                                   codec.iter_records)
    new_tuple = tuple.__new__
    return [new_tuple(ConsumerRecord, ("t", 0, offset, key, value, headers, ts))
            for offset, ts, key, value, headers in fields(batch, min_offset=0)]


def cases(codec: ModuleType, *, count: int, value_bytes: int, keyed: bool,
          compression: str) -> dict[str, Callable[[], object]]:
    data = rows(count, value_bytes, keyed)
    options = {}
    if compression != "none":
        options["compression"] = CODEC_NAMES[compression]
    batch = codec.encode_batch(data, **options)
    return {
        "encode": lambda: codec.encode_batch(data, **options),
        "decode": lambda: list(codec.iter_records(batch)),
        "consume": lambda: consume(codec, batch),
    }


def time_us(fn: Callable[[], object], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--repeat", type=int, default=100, help="calls per timing")
    parser.add_argument("--compression", choices=sorted(CODEC_NAMES), default="none")
    parser.add_argument("--compare", type=Path, help="another records.py to time alongside")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    codecs = {"this": current}
    if args.compare is not None:
        codecs["compared"] = load_codec(args.compare)
        if args.compression != "none":
            raise SystemExit("--compression applies to this codec only; leave it out "
                             "with --compare")
    timings: dict[tuple[str, str, str], list[float]] = {}
    runs = {
        (name, "keyed" if keyed else "no key", case): fn
        for keyed in (False, True)
        for name, codec in codecs.items()
        for case, fn in cases(codec, count=args.records, value_bytes=args.value_bytes,
                              keyed=keyed, compression=args.compression).items()
    }
    for _ in range(args.rounds):
        for run, fn in runs.items():
            timings.setdefault(run, []).append(time_us(fn, args.repeat))
    results = []
    print(f"{args.records} records of {args.value_bytes} B per batch, compression "
          f"{args.compression}, median of {args.rounds} rounds (us per batch)")
    for (name, keys, case), values in timings.items():
        median = statistics.median(values)
        results.append({"codec": name, "keys": keys, "case": case, "us_per_batch": median,
                        "ns_per_record": median * 1000 / args.records})
        print(f"  {case:8s} {keys:7s} {name:9s} {median:9.1f} us  "
              f"({median * 1000 / args.records:6.0f} ns/record)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
