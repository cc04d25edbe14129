"""Integration tests: real service processes, real RocksDB, real gRPC on loopback."""
