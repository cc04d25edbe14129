"""A deterministic asyncio event loop for the simulation.

Goal: run the production runtimes (their own asyncio code, unchanged) so that
one seed decides everything that happens: which callback runs next, when
timers fire, which node is paused or dead. Same seed, same run, event for
event; no real sleeping, no I/O.

Method: a subclass of `asyncio.BaseEventLoop` with its own `_run_once`, the
one method that decides what runs (the base class keeps everything else:
futures, tasks, `call_at`, `run_until_complete`):

* **Time** is a number the loop owns (`time()`, seconds). When no callback is
  ready, it jumps to the earliest timer instead of sleeping. So a 30 s
  timeout costs nothing, and the runtimes' `asyncio.sleep`, `wait_for` and
  their injected `now_ms`/`clock_ms` (which the simulation reads from here)
  all see the same simulated clock.
* **Order**: each iteration takes every ready callback (and every timer that
  is due), and a seeded `random.Random` permutes them before they run. Real
  asyncio runs them FIFO; the permutation stands for the fact that in a
  cluster of processes nothing orders independent events, and it lets one
  seed explore interleavings that FIFO would never produce. (`fifo=True`
  turns it off, to tell a bug that needs the permutation from one that does
  not.)
* **Nodes**: every callback runs in a `contextvars.Context`; the simulation
  marks each node incarnation's tasks with `NODE` in their context (a task
  copies its creator's context, so everything a node starts stays marked).
  A callback of a *paused* node is parked until the node resumes (a stopped
  process: its timers do not fire, nothing it was doing advances); one of a
  *dead* node is dropped, never to run (kill -9: no `finally` clause of the
  dead process runs either, which is why dead tasks are kept referenced in
  `graveyard` instead of being garbage-collected, which would close their
  coroutines and run those clauses).
* **Threads**: none. `run_in_executor` (the group-commit writer's fsync
  on its flusher thread, with `--fsync`) runs the function on the loop, in
  the caller's node context, after a seeded delay of up to
  MAX_EXECUTOR_DELAY_S (a device's sync latency): the moment the work
  happens is the seed's, and a machine crash can strike while it is in
  flight. A paused node's work waits; a dead node's never happens.
* **Steps**: one iteration is one step; `on_step` runs between iterations
  (the checker), with no callback of any node half-done.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import random
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol


class NodeState(Protocol):
    """What the loop needs to know about the node a callback belongs to."""

    @property
    def paused(self) -> bool: ...

    @property
    def dead(self) -> bool: ...

    parked: list[asyncio.Handle]


# The longest a thread's work (an fsync) takes in simulated time.
MAX_EXECUTOR_DELAY_S = 0.005

# The node incarnation a callback belongs to (None: the simulator itself).
NODE: contextvars.ContextVar[NodeState | None] = contextvars.ContextVar("sim_node", default=None)


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is set, but the main task is not done."""


class DeterministicLoop(asyncio.BaseEventLoop):
    # BaseEventLoop's own state, which typeshed does not declare.
    # (Handles' private fields `_when`, `_scheduled`, `_context` too: Any.)
    _ready: deque[Any]
    _scheduled: list[Any]
    _timer_cancelled_count: int
    _stopping: bool

    def __init__(self, rng: random.Random, *, fifo: bool = False) -> None:
        super().__init__()
        self._rng = rng
        self._fifo = fifo
        self._now_s = 0.0
        self.steps = 0
        self.callbacks_run = 0
        self.on_step: Callable[[], None] | None = None
        # What the exception handler saw that must not happen (see below).
        self.errors: list[str] = []
        # Exceptions that are answers, not bugs (the simulation adds the
        # error types of the services, the SDK and the simulated transport).
        self.expected_errors: tuple[type[BaseException], ...] = (
            asyncio.CancelledError, TimeoutError)
        # Tasks of dead nodes, kept so their coroutines are never closed.
        self.graveyard: list[asyncio.Task[Any]] = []
        self._tasks_by_node: dict[int, list[asyncio.Task[Any]]] = {}

    # ------------------------------------------------------------ the clock

    def time(self) -> float:
        return self._now_s

    def now_ms(self) -> int:
        """The simulated clock in milliseconds (what runtimes get as now_ms)."""
        return int(self._now_s * 1000)

    # --------------------------------------------------------- I/O (none)

    def _process_events(self, event_list: list[Any]) -> None:
        """No selector, no events."""

    def _write_to_self(self) -> None:
        """Nothing to wake: there is no selector to interrupt."""

    # ------------------------------------------------------------ threads

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., Any], *args: Any,
    ) -> asyncio.Future[Any]:
        """Runs `func` on the loop after a seeded delay instead of on the
        executor's thread, whose finishing moment no seed would decide (see
        the module docstring). The executor is never used."""
        del executor
        future: asyncio.Future[Any] = self.create_future()

        def work() -> None:
            if future.cancelled():
                return
            try:
                result = func(*args)
            except Exception as exc:  # the thread's exception, as the caller would get it
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.call_later(self._rng.uniform(0.0, MAX_EXECUTOR_DELAY_S), work)
        return future

    # --------------------------------------------------------------- tasks

    def create_task(  # type: ignore[override]
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task = super().create_task(coro, name=name, context=context)
        node = (context.get(NODE) if context is not None else NODE.get())
        if node is not None:
            self._tasks_by_node.setdefault(id(node), []).append(task)
        return task

    def bury(self, node: NodeState) -> None:
        """Keeps a dead node's tasks referenced (see the module docstring)
        and silences asyncio's "destroyed but pending" warning for them."""
        for task in self._tasks_by_node.pop(id(node), []):
            if not task.done():
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                self.graveyard.append(task)
        node.parked.clear()

    def forget_done_tasks(self) -> None:
        """Drops finished tasks from the per-node lists (bounded memory)."""
        for key, tasks in list(self._tasks_by_node.items()):
            self._tasks_by_node[key] = [t for t in tasks if not t.done()]

    def resume(self, node: NodeState) -> None:
        """Puts a resumed node's parked callbacks back in the ready queue."""
        self._ready.extend(node.parked)
        node.parked.clear()

    # ---------------------------------------------------------- one step

    def _run_once(self) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        if not self._ready and not self._stopping:
            if not scheduled:
                raise SimulationStuck(
                    f"at t={self._now_s:.3f}s nothing is ready and no timer is set"
                )
            # Jump to the next timer instead of sleeping until it.
            self._now_s = max(self._now_s, scheduled[0]._when)
        while scheduled and scheduled[0]._when <= self._now_s:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            if handle._cancelled:
                self._timer_cancelled_count -= 1
                continue
            self._ready.append(handle)
        batch: list[Any] = []
        while self._ready:
            handle = self._ready.popleft()
            if handle._cancelled:
                continue
            node = handle._context.get(NODE)
            if node is not None:
                if node.dead:
                    continue
                if node.paused:
                    node.parked.append(handle)
                    continue
            batch.append(handle)
        if not self._fifo:
            self._rng.shuffle(batch)
        self.steps += 1
        for handle in batch:
            if not handle._cancelled:
                self.callbacks_run += 1
                handle._run()
        if self.on_step is not None:
            self.on_step()


def new_loop(seed: int, *, fifo: bool = False) -> tuple[DeterministicLoop, random.Random]:
    """A loop and the seeded generator it shares with the rest of the run."""
    rng = random.Random(seed)
    loop = DeterministicLoop(rng, fifo=fifo)
    loop.set_exception_handler(_record_unexpected)
    return loop, rng


def _record_unexpected(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A callback that raised is a bug (of a runtime or of the simulation);
    so is a task that died of anything but an expected error. Unretrieved
    expected errors of abandoned futures (a timed-out caller's reply, a
    crashed node's request) are normal in a simulation."""
    if not isinstance(loop, DeterministicLoop):
        return
    exc = context.get("exception")
    if "handle" not in context and (exc is None or isinstance(exc, loop.expected_errors)):
        return
    loop.errors.append(f"{context.get('message')}: {exc!r}")


__all__ = ["MAX_EXECUTOR_DELAY_S", "NODE", "DeterministicLoop", "NodeState", "SimulationStuck",
           "new_loop"]
