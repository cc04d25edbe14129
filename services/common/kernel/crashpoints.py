"""Named crash points that only tests can arm.

A test starts a service with ONCELOG_TEST_CRASH_POINTS="name1,name2" in its
environment; when the code reaches `crash_point("name1")`, the process kills
itself with SIGKILL on the spot — no cleanup, no flush, exactly as `kill -9`
at that instant. Unarmed, a crash point costs one set lookup.
"""

from __future__ import annotations

import logging
import os
import signal

ENV_VAR = "ONCELOG_TEST_CRASH_POINTS"
_ARMED = frozenset(p.strip() for p in os.environ.get(ENV_VAR, "").split(",") if p.strip())

log = logging.getLogger(__name__)


def crash_point(name: str) -> None:
    if name in _ARMED:
        log.warning("crash point %s reached: SIGKILL", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def armed() -> frozenset[str]:
    return _ARMED
