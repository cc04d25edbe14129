"""No class in the services, the SDK or the Spark helpers grows past
MAX_CLASS_LINES.

Goal: each class does one job a newcomer can hold in mind (the store's
runtime, the partition, the producer and the consumer were each split by job
once they had grown to 1,100-2,400 lines: docs/contributing.md); a class that
grows past the bound is a sign it has taken a second job, and this test says
which class, where.

Method: every class statement in services/, sdk/ and spark/ (generated
protobuf code aside), parsed with `ast`; its length is the lines from its
`class` line to its last statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("services", "sdk", "spark")
MAX_CLASS_LINES = 800


def _class_lengths() -> list[tuple[int, str]]:
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    where = f"{path.relative_to(REPO)}:{node.lineno} {node.name}"
                    found.append((node.end_lineno - node.lineno + 1, where))
    return found


def test_the_classes_are_parsed() -> None:
    lengths = _class_lengths()
    assert len(lengths) > 100
    assert any(where.endswith(" Producer") for _n, where in lengths)


def test_no_class_is_over_the_bound() -> None:
    over = sorted((n, where) for n, where in _class_lengths() if n > MAX_CLASS_LINES)
    assert not over, (f"classes over {MAX_CLASS_LINES} lines (split them by job, as "
                      f"docs/contributing.md says): {over}")
