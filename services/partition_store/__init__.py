"""The partition store: owns partitions of topics, each an append-only log of
encoded record batches in RocksDB, with producer state for idempotence (and,
in the next version, transactions). See docs/partition-store.md."""
