"""Background tasks a service runtime owns, and stops together on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any


class TaskGroup:
    """Tasks started with spawn(); stop() cancels them (and any extra ones
    given) and waits for each to end, swallowing what they raise."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self, extra: Iterable[asyncio.Task[None]] = ()) -> None:
        tasks = [*self._tasks, *extra]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
