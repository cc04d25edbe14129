"""Every service's core/ stays pure.

Goal: no module under services/*/core imports grpc, rocksdict,
asyncio, threading, time, random or uuid — directly or through the
first-party modules it imports — so the core runs the same in tests,
simulation and production, with time and ids passed in. The services'
shared kernel (services/common/kernel/), which every core imports from, may
run tasks and read the clock but reaches no grpc either.

Method: parse each core module with ast, follow imports of first-party
modules (oncelog, services) transitively, and collect top-level module names.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

FORBIDDEN = {"grpc", "rocksdict", "asyncio", "threading", "time", "random", "uuid"}
FIRST_PARTY = ("oncelog", "services")
ROOT = Path(__file__).resolve().parents[2]
# The security modules (authorizer, ACL records, the per-RPC table,
# principals) are pure cores too, shared by the three services; the rest of
# services/common/security/ is the process's side of security, named here so
# that any new module there is held pure unless it is added to this list.
SECURITY_PROCESS_MODULES = {
    "acl_watcher.py",  # an asyncio task reading `__acls` through the store client
    "guard.py",  # the gRPC server interceptor that authenticates and authorizes
    "service_security.py",  # the wiring from flags: TLS files, guard, watcher
    "tls.py",  # gRPC's server and channel credentials, reloaded from files
}
CORE_MODULES = sorted([*ROOT.glob("services/*/core/*.py"),
                       *(path for path in ROOT.glob("services/common/security/*.py")
                         if path.name not in SECURITY_PROCESS_MODULES)])


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of what the module at `path` imports; `package` is where
    its relative imports start (services/ imports itself relatively)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names.add(module)
            # `from pkg import module` imports pkg.module too.
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _source(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _closure(start: Path) -> dict[str, str]:
    """Every module imported from start, transitively through first-party
    modules, mapped to the first-party module that imports it."""
    seen: dict[str, str] = {}
    start_package = ".".join(start.relative_to(ROOT).parent.parts)
    todo = [(start, str(start.name), start_package)]
    visited: set[Path] = set()
    while todo:
        path, label, package = todo.pop()
        if path in visited:
            continue
        visited.add(path)
        for name in _imports(path, package):
            seen.setdefault(name, label)
            if name.split(".")[0] in FIRST_PARTY:
                source = _source(name)
                if source is not None:
                    todo.append((source, name, name if source.name == "__init__.py"
                                 else name.rpartition(".")[0]))
    return seen


def test_there_are_core_modules() -> None:
    assert len(CORE_MODULES) > 5


def test_security_process_modules_exist() -> None:
    """A stale name in SECURITY_PROCESS_MODULES would excuse nothing; a
    renamed module must be named again (or held pure)."""
    present = {path.name for path in ROOT.glob("services/common/security/*.py")}
    assert present >= SECURITY_PROCESS_MODULES, SECURITY_PROCESS_MODULES - present


@pytest.mark.parametrize("module", [str(p.relative_to(ROOT)) for p in CORE_MODULES])
def test_core_module_is_pure(module: str) -> None:
    imported = _closure(ROOT / module)
    bad = {
        name: via for name, via in imported.items() if name.split(".")[0] in FORBIDDEN
    }
    assert not bad, f"{module} reaches forbidden imports: {bad}"


KERNEL_MODULES = sorted(ROOT.glob("services/common/kernel/*.py"))


def test_there_are_kernel_modules() -> None:
    assert len(KERNEL_MODULES) > 5


@pytest.mark.parametrize("module", [str(p.relative_to(ROOT)) for p in KERNEL_MODULES])
def test_kernel_module_reaches_no_grpc(module: str) -> None:
    imported = _closure(ROOT / module)
    bad = {name: via for name, via in imported.items()
           if name.split(".")[0] == "grpc" or name.rpartition(".")[2].endswith("_pb2_grpc")}
    assert not bad, f"{module} reaches grpc: {bad}"
