"""`python -m oncelog_server.partition_store ...` (see server.py for the flags)."""

from .server import main

main()
