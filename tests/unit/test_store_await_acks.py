"""How a produce request waits for its appends' acknowledgements.

Goal: `await_acks` (services/partition_store/shared.py) answers each append
with its outcome: done, failed with the store's error, or REQUEST_TIMED_OUT
when the wait ran out first. An append that fails after its request stopped
waiting (its leader lost leadership later) must not make asyncio log "Future
exception was never retrieved": under overload that was one ERROR line per
timed-out append, thousands of them, naming no request.

Method: the acknowledgement futures are plain asyncio futures, retrieved by
a done callback as the partition's own are (log/partition.py); the event
loop's exception handler records what asyncio would log, and the garbage
collector runs before it is read.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.partition_store.shared import await_acks


def ack_future() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: None if f.cancelled() else f.exception())
    return future


def run_logging(test: Any) -> list[str]:
    """Runs `test` and returns what the loop's exception handler was given."""
    logged: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: logged.append(str(context.get("message"))))
        await test()
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(main())
    return logged


def test_outcomes_done_failed_and_timed_out() -> None:
    async def test() -> None:
        done, failed, waiting = ack_future(), ack_future(), ack_future()
        done.set_result(None)
        failed.set_exception(ServiceError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved"))
        errors = await await_acks({0: done, 1: failed, 2: waiting}, timeout_ms=20)
        assert set(errors) == {1, 2}
        assert errors[1].code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert errors[2].code is ErrorCode.REQUEST_TIMED_OUT
        waiting.cancel()

    assert run_logging(test) == []


def test_an_append_failing_after_its_request_timed_out_is_not_logged() -> None:
    async def test() -> None:
        late = ack_future()
        errors = await await_acks({0: late}, timeout_ms=10)
        assert errors[0].code is ErrorCode.REQUEST_TIMED_OUT
        late.set_exception(ServiceError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                        "leadership moved after the request timed out"))

    assert run_logging(test) == []
