"""Which of gRPC core's two TCP implementations the services use.

gRPC core (grpcio 1.85, the version uv.lock holds) ships two. In its classic
one, the thread that polls a completion queue also reads and writes the
sockets. In EventEngine's, the default, a poller thread of its own and a
thread pool do that and hand each finished operation to the completion
queue's thread, and grpc.aio hands it once more, to the event loop. Every
hop between two services pays those hand-overs on both sides, and each
wake-up of another thread waits for a CPU and for the GIL.

Measured on 2 vCPUs (docs/performance.md, "gRPC's classic TCP in the
services"): a grpc.aio stream round trip between two processes took 91 µs
with the classic client and listener against 155–162 µs with EventEngine's;
with the services on the classic one, an acknowledged send took 12–21 %
less (one store, RF 1 and RF 3 on three stores) and a one-record
transaction 6–10 % less, and the stores' produce rate stayed within the
noise (at 1,000 partitions a loss of a few per cent is not excluded).

Only the services: the SDK (gRPC's sync stack) stays on gRPC's default. A
client on the classic one was faster in one A/B (0.46 against 0.54 ms per
acknowledged send) and no faster in three later runs of
bench/transport_floor.py (0.48–0.50 against 0.49–0.52 ms); and in the
default test run it got no answer from a TLS listener (every secured
cluster's readiness check timed out), and a producer at an address where
nothing listens waited out its whole budget instead of failing fast. On the
classic TCP a connection makes progress only while a thread polls for it:
grpc.aio's poller always does, the sync stack's threads only inside a call,
and gRPC's backup poller every 5 s (docs/performance.md).

gRPC reads the choice once, from the environment, when `grpc` is imported
(GRPC_EXPERIMENTS; an "experiment" only in gRPC's naming: the classic
implementation is the one gRPC ran on for years). So each service's entry
point calls `use_classic_tcp()` first thing. A service started with
GRPC_EXPERIMENTS already set (even to the empty string, gRPC's own
default: the way to opt out) keeps exactly that.

In the kernel because it must not import grpc.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
# EventEngine's TCP client and listener off: gRPC's classic ones serve.
CLASSIC_TCP_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def use_classic_tcp(environ: MutableMapping[str, str] | None = None,
                    modules: Mapping[str, object] | None = None) -> bool:
    """Chooses gRPC's classic TCP client and listener for this process,
    unless GRPC_EXPERIMENTS is already set or grpc is already imported (too
    late: gRPC has read its settings; the entry points' test guards their
    order). Returns whether the choice was made here."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if GRPC_EXPERIMENTS_ENV in environ or "grpc" in modules:
        return False
    environ[GRPC_EXPERIMENTS_ENV] = CLASSIC_TCP_EXPERIMENTS
    return True
