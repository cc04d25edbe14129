"""Kafka's wire protocol, served by every partition store (docs/kafka-protocol.md).

A Kafka client connects to the stores' Kafka listeners (`--kafka-listen`)
as to brokers: node ids are the stores' node ids, Produce and Fetch are
answered by the store that leads the partition from its own log (the
record batches are Kafka's record batch v2, stored as they came), and the
coordinator APIs are forwarded over gRPC to the transaction and group
coordinators that own their keys. The same ACLs decide every request as on
the gRPC port.

Rooms:

* `apis.py` — the APIs and versions served (one table);
* `messages.py` — Kafka's messages through kio (generated from Kafka's own
  schemas): decoding requests, encoding and building responses;
* `errors.py` — our error codes as each request version expects them;
* `listener.py`, `connection.py` — the TCP server, TLS and the
  per-connection request loop (ordering, pipelining, limits);
* `context.py` — what a handler is given; `broker.py` — the store as a
  broker; `rpc/forward.py` — the calls to the coordinators (the one
  module here that imports grpc);
* `handlers/` — one handler per API.
"""
