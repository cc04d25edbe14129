"""Runs a command so that it dies with the process that started it.

    python -m oncelog._child PARENT_PID CMD [ARGS...]

Sets PR_SET_PDEATHSIG (SIGKILL) and then execs CMD; the setting survives
exec. Doing this in a tiny wrapper instead of a subprocess `preexec_fn` keeps
the parent from having to fork() with live gRPC threads (which is unsafe);
LocalCluster spawns its children from one long-lived thread, because the
death signal follows the thread that spawned the child, not its process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent_pid = int(sys.argv[1])
    argv = sys.argv[2:]
    # Not on Linux: no orphan protection, but the command still runs.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        # The parent died before the death signal was armed.
        sys.exit(1)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
