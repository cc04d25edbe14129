"""Only the rpc layer of the services imports grpc.

Goal: every service is a pure core/, a node layer (asyncio, no grpc) and an
rpc layer (servicers, proto conversions, link clients) that alone imports
grpc, beside the server.py that wires a process (docs/contributing.md, "The
shape of a service"). The node layer then runs unchanged in the simulation
and in tests without a server, and a reader knows where the wire ends.

Method: parse every module under services/ with ast and collect each import
of grpc's packages (grpc, grpc_health, grpc_reflection, grpc_status) and of
the generated `*_pb2_grpc` stub modules, at the top level and inside
functions, including `__import__("grpc")` and `importlib.import_module` with
a literal name. A module outside the allowed places below that imports one
fails the test, named with the line. The checker itself is fed made-up
sources (a node module with grpc imported inside a function, and the same
module in an rpc/ package) so that it is shown to catch what it must.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

# grpc's own packages; `grpc.aio` and `grpc_health.v1` are caught by their
# first name.
GRPC_PACKAGES = frozenset({"grpc", "grpc_health", "grpc_reflection", "grpc_status"})
GRPC_STUB_SUFFIX = "_pb2_grpc"

# The rpc layer: a package named rpc directly under a service or under
# common (services/<service>/rpc/, services/common/rpc/).
RPC_PACKAGE = "rpc"

# Each service process's wiring: flags, the grpc server, health, reflection,
# graceful shutdown. It builds the servicers and the link clients, so it
# names grpc's types; it holds no request handling.
WIRING_MODULES = frozenset({
    "services/partition_store/server.py",
    "services/coordinator/server.py",
    "services/group_coordinator/server.py",
})

# Modules outside an rpc/ package that import grpc, each for a reason that
# keeps it where its subject is rather than in an rpc layer.
ALLOWED_MODULES: dict[str, str] = {
    # The metadata store's etcd adapter speaks etcd's own v3 gRPC API (aetcd's
    # generated stubs on grpc.aio channels): a storage adapter behind the
    # MetadataStore port, not a call between oncelog's services.
    "services/common/metadata/etcd.py": "etcd v3 is a gRPC API",
    # The security guard is a grpc server interceptor: authentication reads
    # the call's metadata and the TLS peer's certificate from grpc's context.
    "services/common/security/guard.py": "a grpc server interceptor",
    # TLS is grpc's: server credentials with a certificate fetcher, and the
    # channel credentials of the services' own calls.
    "services/common/security/tls.py": "grpc's TLS credentials",
    # The wiring of the guard, TLS and the ACL watcher from a service's flags,
    # which hands the server its interceptor and credentials.
    "services/common/security/service_security.py": "wires the guard and TLS into the server",
}


def grpc_imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) for each import of grpc or a generated stub module in
    `source`, wherever it stands (module level, function, class, branch)."""
    found: list[tuple[int, str]] = []

    def check(line: int, module: str) -> None:
        if module.split(".")[0] in GRPC_PACKAGES or any(
                part.endswith(GRPC_STUB_SUFFIX) for part in module.split(".")):
            found.append((line, module))

    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            # Relative imports stay inside services/, which holds no grpc
            # package; a stub module is caught by its own name.
            if node.level == 0:
                check(node.lineno, module)
            for alias in node.names:
                if alias.name.endswith(GRPC_STUB_SUFFIX):
                    check(node.lineno, f"{module}.{alias.name}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            first = node.args[0]
            if (name in ("__import__", "import_module") and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                check(node.lineno, first.value)
    return sorted(found)


def may_import_grpc(relative_path: str) -> bool:
    """Whether the module at `relative_path` (from the repository root, with
    forward slashes) belongs to the rpc layer or the wiring."""
    parts = relative_path.split("/")
    in_rpc_package = len(parts) >= 4 and parts[0] == "services" and parts[2] == RPC_PACKAGE
    return in_rpc_package or relative_path in WIRING_MODULES or relative_path in ALLOWED_MODULES


def violations(modules: Iterable[tuple[str, str]]) -> list[str]:
    """One line per grpc import outside the rpc layer, for (path, source)
    pairs."""
    return [f"{path}:{line} imports {module}"
            for path, source in modules if not may_import_grpc(path)
            for line, module in grpc_imports(source, path)]


def _service_modules() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), path.read_text())
            for path in sorted(SERVICES.rglob("*.py"))]


def test_only_the_rpc_layer_imports_grpc() -> None:
    found = violations(_service_modules())
    assert not found, (
        "grpc imported outside services/*/rpc/ and the server.py wiring "
        "(move the module into its service's rpc/ package, or give the node "
        "layer a port that an rpc/ module implements):\n" + "\n".join(found))


def test_the_rpc_layer_is_where_grpc_is() -> None:
    """The walk finds the rpc layer's grpc imports, so an empty result above
    is not an empty walk: each service's servicer or link imports grpc."""
    importing = {path for path, source in _service_modules() if grpc_imports(source, path)}
    for expected in ("services/partition_store/rpc/servicer.py",
                     "services/coordinator/rpc/servicer.py",
                     "services/group_coordinator/rpc/servicer.py",
                     "services/kafka/rpc/forward.py",
                     "services/common/rpc/interceptor.py"):
        assert expected in importing, expected


def test_every_allowed_exception_exists_and_needs_its_place() -> None:
    """A stale entry (a module renamed or moved away) or one that no longer
    imports grpc would widen the rule for nothing."""
    for relative_path in sorted(WIRING_MODULES | set(ALLOWED_MODULES)):
        path = ROOT / relative_path
        assert path.is_file(), f"{relative_path} is allowed grpc but does not exist"
        assert grpc_imports(path.read_text(), relative_path), (
            f"{relative_path} is allowed grpc but imports none: drop it from the list")


def test_the_checker_reports_grpc_in_a_node_module() -> None:
    node_source = (
        "from __future__ import annotations\n"
        "from oncelog.v1 import partition_store_pb2\n"
        "from .core import replicas\n"
        "import grpcio_not_grpc\n"
        "\n"
        "def fetch_from_leader() -> None:\n"
        "    import grpc.aio\n"
        "    from grpc_health.v1 import health\n"
        "    from oncelog.v1 import partition_store_pb2_grpc as stubs\n"
        "    importlib.import_module('grpc_reflection.v1alpha')\n"
        "\n"
        "class Link:\n"
        "    def stub(self) -> None:\n"
        "        from oncelog.v1.coordinator_pb2_grpc import TransactionCoordinatorStub\n"
        "        __import__('grpc')\n"
    )
    found = violations([("services/partition_store/replication/fetcher.py", node_source)])
    assert found == [
        "services/partition_store/replication/fetcher.py:7 imports grpc.aio",
        "services/partition_store/replication/fetcher.py:8 imports grpc_health.v1",
        "services/partition_store/replication/fetcher.py:9 imports "
        "oncelog.v1.partition_store_pb2_grpc",
        "services/partition_store/replication/fetcher.py:10 imports grpc_reflection.v1alpha",
        "services/partition_store/replication/fetcher.py:14 imports "
        "oncelog.v1.coordinator_pb2_grpc",
        "services/partition_store/replication/fetcher.py:15 imports grpc",
    ]
    # The same source is fine in an rpc/ package and in the wiring, and a
    # module merely named like one (a runtime's rpc_ helper) is not exempt.
    assert violations([("services/partition_store/rpc/replica_link.py", node_source)]) == []
    assert violations([("services/common/rpc/channels.py", node_source)]) == []
    assert violations([("services/partition_store/server.py", node_source)]) == []
    assert violations([("services/partition_store/rpc_helpers.py", node_source)])
    assert violations([("services/partition_store/core/rpc/x.py", node_source)])
    assert violations([("services/kafka/server.py", node_source)])
