"""The services stand on the wire kernel, not on the client.

Goal: what the SDK and the services share — the generated stubs
(`oncelog.v1`), the error catalogue, the status mapping, the record-batch
codec, the shared limits and the process protocol (`oncelog.wire.*`) — has
one home, and the services import nothing else of the SDK; loading every
service loads no client module (producer, consumer, admin, their threads and
channels).

Method: parse every module under services/ and list its `oncelog` imports;
import the three servers in a fresh interpreter and list the `oncelog`
modules it loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("oncelog.wire", "oncelog.v1")


def _oncelog_imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if a.name.split(".")[0] == "oncelog")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "oncelog":
                found.extend(f"oncelog.{a.name}" for a in node.names)
            elif node.module.split(".")[0] == "oncelog":
                found.append(node.module)
    return found


def _allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def test_services_import_only_the_wire_kernel() -> None:
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted((ROOT / "services").rglob("*.py"))
        if (bad := [m for m in _oncelog_imports(path) if not _allowed(m)])
    }
    assert offenders == {}


def test_the_wire_kernel_imports_nothing_of_the_client() -> None:
    for path in sorted((ROOT / "sdk" / "oncelog" / "wire").rglob("*.py")):
        bad = [m for m in _oncelog_imports(path) if not _allowed(m)]
        assert bad == [], f"{path.name} imports {bad}"


def test_loading_the_services_loads_no_client_module() -> None:
    code = (
        "import sys\n"
        "import services.partition_store.server, services.coordinator.server, "
        "services.group_coordinator.server\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('oncelog')))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                            capture_output=True, text=True, timeout=120).stdout.split()
    assert "oncelog.wire.errors" in loaded
    assert [m for m in loaded if m != "oncelog" and not _allowed(m)] == []


def test_the_public_names_stay_where_users_import_them() -> None:
    from oncelog import errors, records
    from oncelog.wire import errors as wire_errors
    from oncelog.wire import records as wire_records

    assert errors.ProducerFencedError is wire_errors.ERROR_CLASSES[
        wire_errors.ErrorCode.PRODUCER_FENCED]
    assert errors.ErrorCode is wire_errors.ErrorCode
    assert errors.PRODUCER_ERROR_CLASSES is wire_errors.PRODUCER_ERROR_CLASSES
    assert records.encode_batch is wire_records.encode_batch
    assert records.MAX_PRODUCER_EPOCH == wire_records.MAX_PRODUCER_EPOCH
