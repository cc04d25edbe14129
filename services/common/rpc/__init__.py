"""The gRPC side every service shares: the server base (flags, health,
reflection, graceful shutdown), the RPC interceptor and the mapping of
error codes to gRPC statuses, request streams, and the services' own
clients of each other (channels, stream and store clients, the leader
directory). Only here, in each service's `rpc/` and its `server.py` is
grpc imported (tests/unit/test_grpc_layer.py)."""
