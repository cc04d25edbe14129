"""Storage of the partition store: the key layout (keys.py), the port the
runtime needs (port.py), and its RocksDB and in-memory adapters."""
