"""The Kafka listener's gRPC layer, the only part of it that imports grpc
(tests/unit/test_grpc_layer.py): the forwarding of the coordinators' APIs
to the transaction and group coordinators (forward.py)."""
