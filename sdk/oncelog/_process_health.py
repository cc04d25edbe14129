"""The health-check service name by which a service process answers for
itself, and not for whatever else holds its port.

Every service registers the gRPC health service `oncelog.process.<pid>` with
the same status as its other services. LocalCluster waits for that name with
the pid it started: a process that took the port before ours could bind
answers "" as SERVING, but not our pid's name, so a process that is about to
exit because its port is taken is never mistaken for ready. It lives in the
SDK because the services may import the SDK, not the other way round.
"""

from __future__ import annotations


def process_health_service(pid: int) -> str:
    """The health service name of the service process with this pid."""
    if pid <= 0:
        raise ValueError(f"pid is {pid}; it must be > 0")
    return f"oncelog.process.{pid}"
