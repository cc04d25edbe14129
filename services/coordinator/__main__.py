"""`python -m oncelog_server.coordinator`"""

from ..common.rpc.server_base import run
from .server import main

if __name__ == "__main__":
    run(main)
