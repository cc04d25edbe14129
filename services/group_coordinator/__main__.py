"""`python -m services.group_coordinator`"""

from services.common.server_base import run
from services.group_coordinator.server import main

if __name__ == "__main__":
    run(main)
