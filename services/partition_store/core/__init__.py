"""Pure logic of the partition store: append rules, offsets, retention planning,
snapshots, topic validation. Nothing here does I/O or reads a clock: callers
pass `now_ms` and ids in, and get values (decisions, plans, bytes) back.
tests/unit/test_partition_store_core_imports.py keeps it that way."""
