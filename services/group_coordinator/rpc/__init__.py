"""The group coordinator's gRPC layer, the only part of it besides
server.py's wiring that imports grpc (tests/unit/test_grpc_layer.py): the
servicer, proto -> runtime call -> proto or status."""
