"""Whether a local cluster's service processes serve: `wait_all_ready`, and
why one that exited did (`raise_if_exited`: a port another process holds,
or another failure, with the tail of its log).

A service is ready when it answers its gRPC health check with SERVING
under its own pid's service name, which another process that holds the
port does not know. Kept apart from cluster.py, which decides what to do
about a failure (pick a fresh port, start again, give up); this module
only tells it which failure it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc

try:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ModuleNotFoundError as exc:
    # The SDK alone (`pip install oncelog`) has no services to run.
    raise ModuleNotFoundError(
        "oncelog.testing runs the oncelog services, which the SDK alone does not "
        "install: pip install 'oncelog[server]'", name=exc.name) from exc

from oncelog.wire.process import (
    GRPC,
    KAFKA,
    METRICS,
    TOKEN_GRPC,
    find_ports_in_use,
    process_health_service,
)
from oncelog_local.processes import PortTakenError, ServiceProcess, latest_output, log_tail

# How long one health check may take before the next round of checks.
CHECK_TIMEOUT_S = 1.0
# How long to sleep between rounds of checks while some are not ready.
POLL_INTERVAL_S = 0.05


def wait_all_ready(procs: Sequence[ServiceProcess], timeout_s: float,
                   channel: Callable[[str], grpc.Channel]) -> None:
    """Waits until every process serves, checking them all in each round, so
    that one that exits is noticed at once even while another is still
    waiting for it (a coordinator loads its state from the stores).
    `channel` opens a channel to an address (the cluster's: TLS as admin,
    or through the harness namespace). Raises as raise_if_exited does, or
    TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    channels = [channel(proc.address) for proc in procs]
    try:
        pending = {
            id(proc): (proc, health_pb2_grpc.HealthStub(open_channel))
            for proc, open_channel in zip(procs, channels, strict=True)
        }
        while pending:
            for key, (proc, stub) in list(pending.items()):
                raise_if_exited(proc)
                assert proc.process is not None  # alive, so started
                own_name = process_health_service(proc.process.pid)
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=own_name),
                                      timeout=CHECK_TIMEOUT_S)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        del pending[key]
                except grpc.RpcError:
                    pass
            if pending and time.monotonic() > deadline:
                proc = next(iter(pending.values()))[0]
                raise TimeoutError(
                    f"{proc.kind} {proc.node_id} at {proc.address} not ready after "
                    f"{timeout_s}s; see {proc.log_path}:\n{log_tail(proc.log_path)}"
                )
            if pending:
                time.sleep(POLL_INTERVAL_S)
    finally:
        for open_channel in channels:
            open_channel.close()


def raise_if_exited(proc: ServiceProcess) -> None:
    """Raises if the process is no longer running: PortTakenError when the
    output of its latest start says one of its ports is in use."""
    if proc.alive():
        return
    see = f"see {proc.log_path}:\n{log_tail(proc.log_path)}"
    output = latest_output(proc.log_path, proc.log_offset)
    own = {(GRPC, proc.address), (METRICS, f"{proc.host}:{proc.metrics_port}")}
    if proc.token_port:
        own.add((TOKEN_GRPC, proc.token_address))
    if proc.kafka_port:
        own.add((KAFKA, proc.kafka_address))
    for taken in find_ports_in_use(output):
        if (taken.purpose, taken.address) in own:
            raise PortTakenError(
                f"{proc.kind} {proc.node_id} cannot listen for {taken.purpose} on "
                f"{taken.address}: another process holds port {taken.port}; {see}",
                kind=proc.kind, node_id=proc.node_id, taken=taken,
            )
    raise RuntimeError(
        f"{proc.kind} {proc.node_id} exited with "
        f"{proc.process and proc.process.returncode}; {see}"
    )
