"""The committed generated protobuf code matches protos/.

Method: run scripts/gen_protos.sh into a temporary directory with the pinned
tools and compare every generated file byte for byte with sdk/oncelog/v1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", "scripts/gen_protos.sh", str(tmp_path)],
        cwd=ROOT, check=True, capture_output=True, env={**os.environ, "PYTHON": sys.executable},
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "oncelog" / "v1").iterdir()}
    committed = {
        p.name: p.read_bytes()
        for p in (ROOT / "sdk" / "oncelog" / "v1").iterdir()
        if p.is_file() and p.name != "__init__.py"
    }
    fresh.pop("__init__.py", None)
    stale = sorted(n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n))
    assert not stale, f"regenerate with scripts/gen_protos.sh: {stale}"
