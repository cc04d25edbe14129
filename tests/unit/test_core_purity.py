"""The pure cores stay pure.

Method: parse every module under services/*/core/ and fail on an import of
I/O, clocks, threads or randomness (STYLE.md: cores take now_ms and ids as
arguments, so simulation can drive them deterministically).
"""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"grpc", "rocksdict", "asyncio", "threading", "time", "random", "uuid", "socket",
             "os", "subprocess", "datetime"}
ROOT = Path(__file__).resolve().parents[2]


def test_core_modules_import_nothing_impure() -> None:
    core_files = sorted(ROOT.glob("services/*/core/**/*.py"))
    assert core_files, "no core modules found"
    offenders = []
    for path in core_files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FORBIDDEN:
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders
