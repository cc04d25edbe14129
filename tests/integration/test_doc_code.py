"""The Python code in README.md and docs/*.md runs as written.

Goal: a doc's example can no longer drift from what works, and every example
is re-runnable (it creates what it uses, and a second run does not fail on
what the first one made).

Method: every ```python block of README.md and docs/*.md (found by glob, so a
new doc is covered without touching this file) is one test, named by its file
and the line of its fence. A block runs as a user would paste it into a file:
a fresh interpreter (this one, `sys.executable`), a temporary directory as its
working directory, a timeout — twice, in the same directory. One LocalCluster,
shared by the module, is the running cluster the docs talk about: its address
is in ONCELOG_BOOTSTRAP, which blocks read with
`os.environ.get("ONCELOG_BOOTSTRAP", "127.0.0.1:9092")` (the CLI's variable
and default); a block that starts its own `LocalCluster` simply does. Each run
must exit 0, and a block that prints (`print(`, a DataFrame's `.show(`) must
print something other than empty collections or None.

An HTML comment on the line before a fence (blank lines between are allowed)
changes how a block is run:

* `<!-- doc-test: skip (reason) -->` — not run; pytest reports the reason.
  For a block that cannot run alone and cannot be rewritten to.
* `<!-- doc-test: slow (reason) -->` — run only outside the default test run
  (marked `slow`, which `scripts/test.sh` deselects): blocks that start Spark,
  whose JVM makes each run cost tens of seconds.
* `<!-- doc-test: signature (module.Name) -->` — the block is one call that
  lists a callable's keyword parameters with their defaults (`...` for a
  required one; `32 MiB` may stand for 32 * 1024 * 1024). It is not run;
  its names, their order and the defaults are compared with the real
  signature of `module.Name`, so a new or changed option fails until the
  doc says so.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import LocalCluster

REPO = Path(__file__).resolve().parents[2]
# The docs whose code is run: README.md and every docs/*.md.
DOC_GLOBS = ("README.md", "docs/*.md")
# Fence info strings taken for Python (the first word after the backticks).
PYTHON_LANGUAGES = frozenset({"python", "py", "python3"})
# Failure guards, not expectations: a normal block takes a few seconds, a
# Spark block 20-50 s; these only stop a hung one.
RUN_TIMEOUT_S = 120.0
SLOW_RUN_TIMEOUT_S = 300.0
RUNS = 2

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<kind>\w+)\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
_DIRECTIVE_START = re.compile(r"^\s*<!--\s*doc-test:")
# What makes a block's output worth checking: it prints, or shows a DataFrame.
_PRINTS = re.compile(r"\bprint\(|\.show\(")
# Printed lines that say nothing: an empty collection, None.
_NOTHING = frozenset({"", "[]", "{}", "()", "set()", "None"})
DIRECTIVES = ("skip", "slow", "signature")
# The units a signature block may use for a default of bytes.
_SIZE = re.compile(r"\b(\d+) (KiB|MiB|GiB)\b")
_SIZE_FACTOR = {"KiB": "1024", "MiB": "1024 ** 2", "GiB": "1024 ** 3"}


class DocParseError(ValueError):
    """A doc's fences or doc-test comments cannot be read unambiguously."""


@dataclass(frozen=True, slots=True)
class DocBlock:
    path: str  # relative to the repository, e.g. "docs/sdk.md"
    line: int  # 1-based line of the opening fence
    code: str
    directive: str | None  # one of DIRECTIVES, or None: run it
    reason: str  # the directive's parenthesis (for signature: the callable)

    @property
    def test_id(self) -> str:
        return f"{self.path}:{self.line}"


def extract_blocks(text: str, path: str) -> list[DocBlock]:
    """The ```python blocks of one markdown text, each with the doc-test
    directive of the comment before its fence, if any."""
    blocks: list[DocBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks = opening["indent"], opening["ticks"]
        words = opening["info"].split()
        start = i
        i += 1
        body: list[str] = []
        # A fence closes at a line of at least as many backticks and nothing else.
        while i < len(lines) and not re.fullmatch(rf"\s*{ticks}`*\s*", lines[i]):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise DocParseError(f"{path}:{start + 1}: a code fence that is never closed")
        i += 1
        if not words or words[0] not in PYTHON_LANGUAGES:
            continue
        directive, reason = _directive_before(lines, start, path)
        blocks.append(DocBlock(path, start + 1, "\n".join(body) + "\n", directive, reason))
    return blocks


def _directive_before(lines: list[str], fence: int, path: str) -> tuple[str | None, str]:
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0 or not _DIRECTIVE_START.match(lines[j]):
        return None, ""
    found = _DIRECTIVE.match(lines[j])
    if found is None or found["kind"] not in DIRECTIVES:
        raise DocParseError(
            f"{path}:{j + 1}: write `<!-- doc-test: KIND (reason) -->` with KIND one of "
            f"{', '.join(DIRECTIVES)}; got {lines[j].strip()!r}"
        )
    return found["kind"], found["reason"].strip()


def doc_paths() -> list[Path]:
    return sorted({p for pattern in DOC_GLOBS for p in REPO.glob(pattern)})


def all_blocks() -> list[DocBlock]:
    return [
        block
        for path in doc_paths()
        for block in extract_blocks(path.read_text(encoding="utf-8"),
                                    path.relative_to(REPO).as_posix())
    ]


def _run_params() -> list[object]:
    params: list[object] = []
    for block in all_blocks():
        if block.directive == "signature":
            continue
        marks: list[pytest.MarkDecorator] = []
        if block.directive == "skip":
            marks.append(pytest.mark.skip(reason=f"{block.test_id}: {block.reason}"))
        elif block.directive == "slow":
            marks += [pytest.mark.slow, pytest.mark.timeout(RUNS * SLOW_RUN_TIMEOUT_S + 60)]
        params.append(pytest.param(block, marks=marks, id=block.test_id))
    return params


@dataclass(frozen=True, slots=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


def run_block(block: DocBlock, cwd: Path, env: dict[str, str], timeout_s: float) -> Run:
    """Runs the block from a file, as a pasted script, in its own session so
    that a timeout can end everything it started (a Spark JVM included)."""
    script = cwd / "doc_block.py"
    script.write_text(block.code, encoding="utf-8")
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, script.name], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(
                f"{block.test_id} did not finish within {timeout_s:.0f} s\n"
                f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
            )
    return Run(process.returncode, stdout, stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def doc_env(shared_cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "ONCELOG_BOOTSTRAP": shared_cluster.bootstrap}


@pytest.mark.parametrize("block", _run_params())
def test_doc_block_runs(block: DocBlock, doc_env: dict[str, str], tmp_path: Path) -> None:
    timeout_s = SLOW_RUN_TIMEOUT_S if block.directive == "slow" else RUN_TIMEOUT_S
    for attempt in range(1, RUNS + 1):
        run = run_block(block, tmp_path, doc_env, timeout_s)
        what = f"{block.test_id}, run {attempt} of {RUNS} ({run.elapsed_s:.1f} s)"
        assert run.returncode == 0, (
            f"{what} exited {run.returncode}\n--- code\n{block.code}"
            f"--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-5000:]}"
        )
        if _PRINTS.search(block.code):
            assert _says_something(run.stdout), (
                f"{what} prints, but printed nothing of substance: {run.stdout!r}\n"
                f"--- stderr\n{run.stderr[-3000:]}"
            )


def _says_something(stdout: str) -> bool:
    """False for output with nothing in it: no line, or only empty
    collections and None (what printing a poll that found nothing gives)."""
    return any(line.strip() not in _NOTHING for line in stdout.splitlines())


def documented_call(block: DocBlock) -> tuple[str, list[tuple[str, Any]]]:
    """The callable's name and its (keyword, default) pairs as the block
    writes them; a default of `...` stays Ellipsis (required)."""
    source = _SIZE.sub(lambda m: f"({m[1]} * {_SIZE_FACTOR[m[2]]})", block.code)
    tree = ast.parse(source, mode="eval").body
    if not isinstance(tree, ast.Call) or not isinstance(tree.func, ast.Name) or tree.args:
        raise DocParseError(f"{block.test_id}: a signature block is one call Name(kw=default, ...)")
    pairs: list[tuple[str, Any]] = []
    for keyword in tree.keywords:
        if keyword.arg is None:
            raise DocParseError(f"{block.test_id}: **kwargs in a signature block")
        # Our own docs' constant expressions: no names, no builtins.
        value = eval(compile(ast.Expression(keyword.value), block.test_id, "eval"),
                     {"__builtins__": {}})
        pairs.append((keyword.arg, value))
    return tree.func.id, pairs


def _signature_params() -> list[object]:
    return [pytest.param(b, id=b.test_id) for b in all_blocks() if b.directive == "signature"]


def signature_mismatch(block: DocBlock, target: Any) -> str | None:
    """None when the block lists `target`'s parameters (a class: its
    __init__'s) with their defaults, in order; else what differs."""
    name, documented = documented_call(block)
    if name != target.__name__:
        return f"the block calls {name}, not {target.__name__}"
    function = target.__init__ if inspect.isclass(target) else target
    actual = [
        (p.name, ... if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(function).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    return None if documented == actual else _signature_diff(documented, actual)


@pytest.mark.parametrize("block", _signature_params())
def test_doc_signature_matches(block: DocBlock) -> None:
    module_name, _, attribute = block.reason.rpartition(".")
    target = getattr(importlib.import_module(module_name), attribute)
    mismatch = signature_mismatch(block, target)
    assert mismatch is None, f"{block.test_id} documents {block.reason} wrongly: {mismatch}"


def _signature_diff(documented: list[tuple[str, Any]], actual: list[tuple[str, Any]]) -> str:
    doc, code = dict(documented), dict(actual)
    undocumented = [n for n in code if n not in doc]
    unknown = [n for n in doc if n not in code]
    defaults = [f"{n} documented {doc[n]!r}, is {code[n]!r}"
                for n in doc if n in code and doc[n] != code[n]]
    problems = ([f"not in the doc: {undocumented}"] if undocumented else []) + (
        [f"not in the code: {unknown}"] if unknown else []) + defaults
    if [n for n in doc if n in code] != [n for n in code if n in doc]:
        problems.append(f"order: the code's is {list(code)}")
    return "; ".join(problems)


def test_signature_check_has_teeth() -> None:
    def connect(*, bootstrap: str, buffer_bytes: int = 32 * 1024**2, retry: bool = False) -> None:
        """A stand-in with a required option, a size and a flag."""

    def listing(code: str) -> DocBlock:
        return DocBlock("x.md", 1, code, "signature", "x.connect")

    assert signature_mismatch(
        listing("connect(bootstrap=..., buffer_bytes=32 MiB, retry=False)"), connect) is None
    wrong = {
        "connect(bootstrap=..., buffer_bytes=32 MiB)": "not in the doc: ['retry']",
        "connect(bootstrap=..., buffer_bytes=32 MiB, retry=False, x=1)": "not in the code: ['x']",
        "connect(bootstrap=..., buffer_bytes=1 MiB, retry=False)": "buffer_bytes documented",
        "connect(bootstrap=None, buffer_bytes=32 MiB, retry=False)": "bootstrap documented",
        "connect(bootstrap=..., retry=False, buffer_bytes=32 MiB)": "order",
        "Connect(bootstrap=..., buffer_bytes=32 MiB, retry=False)": "calls Connect",
    }
    for code, expected in wrong.items():
        mismatch = signature_mismatch(listing(code), connect)
        assert mismatch is not None and expected in mismatch, (code, mismatch)


def test_every_doc_is_searched() -> None:
    """A guard on the discovery itself: an empty parametrization would pass
    silently."""
    names = {p.relative_to(REPO).as_posix() for p in doc_paths()}
    assert "README.md" in names and "docs/sdk.md" in names, names
    by_file = {b.path for b in all_blocks()}
    assert {"README.md", "docs/sdk.md"} <= by_file, by_file


def test_extract_blocks_reads_fences_and_directives() -> None:
    text = "\n".join([
        "# Doc",
        "```python",
        "print('a')",
        "```",
        "<!-- doc-test: skip (a signature) -->",
        "",
        "```python",
        "f(x=...)",
        "```",
        "```bash",
        "echo no",
        "```",
        "* a list item:",
        "  <!-- doc-test: slow (starts Spark) -->",
        "  ```py",
        "  if True:",
        "      print('b')",
        "  ```",
        "````python",
        "s = '''",
        "```",
        "'''",
        "````",
    ])
    blocks = extract_blocks(text, "x.md")
    assert [(b.line, b.directive, b.reason) for b in blocks] == [
        (2, None, ""), (7, "skip", "a signature"), (15, "slow", "starts Spark"), (19, None, ""),
    ]
    assert blocks[0].code == "print('a')\n"
    assert blocks[2].code == "if True:\n    print('b')\n"
    assert blocks[3].code == "s = '''\n```\n'''\n"


@pytest.mark.parametrize("text", [
    "<!-- doc-test: skip -->\n```python\nx = 1\n```\n",
    "<!-- doc-test: ignore (why) -->\n```python\nx = 1\n```\n",
    "```python\nx = 1\n",
])
def test_extract_blocks_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(DocParseError):
        extract_blocks(text, "x.md")
