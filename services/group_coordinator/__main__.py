"""`python -m oncelog_server.group_coordinator`"""

from ..common.kernel.grpc_engine import use_classic_tcp

# First thing: gRPC reads its transport's choice when it is imported
# (common/kernel/grpc_engine.py).
use_classic_tcp()

from ..common.rpc.server_base import run  # noqa: E402
from .server import main  # noqa: E402

if __name__ == "__main__":
    run(main)
