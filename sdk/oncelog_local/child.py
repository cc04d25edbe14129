"""Runs a command so that it dies with the process that started it.

    python -m oncelog_local.child PARENT_PID [--netns NAME] CMD [ARGS...]

Sets PR_SET_PDEATHSIG (SIGKILL) and then execs CMD; the setting survives
exec. Doing this in a tiny wrapper instead of a subprocess `preexec_fn` keeps
the parent from having to fork() with live gRPC threads (which is unsafe);
LocalCluster spawns its children from one long-lived thread, because the
death signal follows the thread that spawned the child, not its process.
`--netns NAME` first enters the network namespace /run/netns/NAME
(LocalCluster(network="namespaces"), oncelog_local.netns): done here, while the
wrapper has one thread, since a namespace change applies to a thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"


def enter_network_namespace(name: str) -> None:
    """Moves the calling thread into the network namespace /run/netns/NAME:
    sockets it opens from then on live there (threads it starts inherit it).
    Raises OSError."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"cannot enter network namespace {name}: "
                                 f"{os.strerror(errno)}")
    finally:
        os.close(fd)


def main() -> None:
    parent_pid = int(sys.argv[1])
    argv = sys.argv[2:]
    # Not on Linux: no orphan protection, but the command still runs.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        # The parent died before the death signal was armed.
        sys.exit(1)
    if argv[:1] == ["--netns"]:
        try:
            enter_network_namespace(argv[1])
        except OSError as exc:
            sys.exit(f"oncelog_local.child: {exc}")
        argv = argv[2:]
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
