"""`python -m oncelog_server.partition_store ...` (see server.py for the flags)."""

from ..common.kernel.grpc_engine import use_classic_tcp

# First thing: gRPC reads its transport's choice when it is imported
# (common/kernel/grpc_engine.py).
use_classic_tcp()

from .server import main  # noqa: E402

main()
