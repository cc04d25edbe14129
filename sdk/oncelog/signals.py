"""Stopping a long-running command cleanly on SIGINT/SIGTERM: the CLI's
`cluster up` and `consume`, and the Spark jobs, wait on this."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set an event instead of raising KeyboardInterrupt in the
    middle of SDK code (which could leave a client half-way through a call
    and hang its close()).

    Look at it with is_set(), never wait() on it: the handler runs in the
    main thread, and a signal that lands while the main thread is inside
    wait() makes set() take the lock that wait() holds, which hangs the
    process for good."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
