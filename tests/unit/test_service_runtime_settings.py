"""What `server_base.run`, every service's entry point, sets for the process
before its event loop starts: the collector's threshold for full
collections (docs/performance.md, "The services' garbage collector") and the
interpreter's switch interval."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from services.common.rpc import server_base


@pytest.fixture
def restore_process_settings() -> Iterator[None]:
    thresholds, interval_s = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(interval_s)


@pytest.mark.usefixtures("restore_process_settings")
def test_a_service_collects_its_oldest_generation_rarely() -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    seen: list[tuple[int, int, int]] = []

    async def service() -> None:
        seen.append(gc.get_threshold())

    server_base.run(service)

    # The young generations keep CPython's thresholds; only the oldest is
    # collected less often.
    assert seen == [(700, 10, server_base.GC_FULL_COLLECTION_EVERY_GEN1)]
    assert server_base.GC_FULL_COLLECTION_EVERY_GEN1 > 10
    assert sys.getswitchinterval() == pytest.approx(0.0005)
