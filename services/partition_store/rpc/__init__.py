"""The partition store's gRPC layer, the only part of the store besides
server.py's wiring that imports grpc (tests/unit/test_grpc_layer.py): the
servicer (proto -> call -> proto or status), the proto conversions, and the
link clients the runtime calls other processes through — the controller
(controller_link.py), the transaction coordinators (coordinator_link.py) and
the leaders a follower fetches from (replica_link.py). Each link implements
a port the runtime declares, so the runtime and the simulation never need
grpc."""
