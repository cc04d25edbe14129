"""`python -m services.partition_store ...` (see server.py for the flags)."""

from services.partition_store.server import main

main()
