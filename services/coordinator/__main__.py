"""`python -m services.coordinator`"""

from services.common.server_base import run
from services.coordinator.server import main

if __name__ == "__main__":
    run(main)
