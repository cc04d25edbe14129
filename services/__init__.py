"""The oncelog services (installed as `oncelog_server`): the partition store,
the transaction coordinator and the group coordinator.

They need the `server` extra's packages (RocksDB, the Prometheus client, the
etcd client, gRPC's health, reflection and rich-status helpers, JWT
checking), which the SDK alone (`pip install oncelog`) does not install: a
service started without them stops here with the command that installs them,
not deep inside an import with a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib.util

# Import name -> the distribution that brings it (pyproject.toml's `server`).
_SERVER_EXTRA_MODULES = {
    "rocksdict": "rocksdict",
    "prometheus_client": "prometheus-client",
    "aetcd": "aetcd",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "grpc_status": "grpcio-status",
    "jwt": "pyjwt",
}

_missing = [dist for module, dist in _SERVER_EXTRA_MODULES.items()
            if importlib.util.find_spec(module) is None]
if _missing:
    raise ModuleNotFoundError(
        f"the oncelog services need {', '.join(_missing)}, which the SDK alone does not "
        "install: pip install 'oncelog[server]'",
        name=_missing[0])
