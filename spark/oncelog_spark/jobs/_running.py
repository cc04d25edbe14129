"""What every streaming job does once its query has started: wait for it,
stop it cleanly on SIGINT/SIGTERM, and turn its end into an exit status."""

from __future__ import annotations

import sys

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from oncelog.signals import stop_on_signals

# How often the job looks up from waiting on its query to check for a signal.
_WAIT_SLICE_S = 1


def await_query(query: StreamingQuery, job: str) -> int:
    """Waits until the query ends (AvailableNow done, failure) or a signal
    asks to stop; returns 0 when it ended cleanly, 1 when it failed (the
    error is printed)."""
    try:
        with stop_on_signals() as stop:
            while not stop.is_set() and not query.awaitTermination(_WAIT_SLICE_S):
                pass
    except StreamingQueryException as exc:
        print(f"{job} failed: {exc}", file=sys.stderr)
        return 1
    if query.isActive:
        query.stop()
    return 0
