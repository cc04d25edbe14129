"""bench/records.py: the codec benchmark cannot rot.

Goal: every case (encode, decode, consume; with and without keys) runs on
this codec, with a compression codec, and against a second copy of a codec
loaded from a file, through the script's own path (argument parsing, the
interleaved rounds, the table, the JSON file), and every figure is a
positive time.

Method: the script as a subprocess with tiny sizes (20 records, one round,
one call per timing); the second codec is this repository's own records.py
loaded from its path. No assertion depends on timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = {(keys, case) for keys in ("no key", "keyed") for case in ("encode", "decode", "consume")}


def _run(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    out = tmp_path / "records.json"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "records.py"), "--records", "20", "--rounds", "1",
         "--repeat", "1", "--json", str(out), *args],
        check=True, capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    results: list[dict[str, object]] = json.loads(out.read_text())
    return results


def test_every_case_runs_on_this_codec_and_a_compared_one(tmp_path: Path) -> None:
    results = _run(tmp_path, "--compare", str(REPO / "sdk" / "oncelog" / "wire" / "records.py"))
    for codec in ("this", "compared"):
        mine = [r for r in results if r["codec"] == codec]
        assert {(r["keys"], r["case"]) for r in mine} == CASES
        assert all(float(r["us_per_batch"]) > 0 for r in mine)  # type: ignore[arg-type]


def test_a_compression_codec_runs(tmp_path: Path) -> None:
    results = _run(tmp_path, "--compression", "zstd")
    assert {(r["keys"], r["case"]) for r in results} == CASES
