"""No module under tests/ answers the services' RPCs itself (issue 18).

Goal: the SDK's tests run against the real servicers and runtimes
(tests/support/inprocess_cluster.py), not against a second implementation
of how the services handle requests, which would drift
(docs/contributing.md, "Tests"); this test keeps a new copy from growing back.

Method: every function defined under tests/ is checked against the method
names of the three gRPC services, read from their descriptors. A
function named after an RPC is a handler of it. The one allowed is a
stand-in that only holds a call open to test the server plumbing around it
(ServiceServer's drain), not how a service answers.
"""

from __future__ import annotations

import ast
from pathlib import Path

from oncelog.v1 import coordinator_pb2, group_coordinator_pb2, partition_store_pb2

TESTS = Path(__file__).resolve().parents[1]

# (module under tests/, function): stand-ins that answer nothing a service would.
ALLOWED = {("integration/test_lifecycle.py", "FindCoordinator")}


def rpc_names() -> set[str]:
    return {
        method.name
        for module in (partition_store_pb2, coordinator_pb2, group_coordinator_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_no_module_under_tests_handles_an_rpc() -> None:
    names = rpc_names()
    assert {"Produce", "Fetch", "EndTxn", "ConsumerGroupHeartbeat"} <= names
    handlers = []
    for path in sorted(TESTS.rglob("*.py")):
        relative = path.relative_to(TESTS).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.name in names and (relative, node.name) not in ALLOWED):
                handlers.append(f"{relative}:{node.lineno} {node.name}")
    assert handlers == [], (
        "these functions answer a service's RPC in a test's place; run the real "
        f"servicer instead (tests/support/inprocess_cluster.py): {handlers}")
