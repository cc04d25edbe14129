"""The kernel every service shares, free of grpc (so `core/` modules may
import it): the expected-failure value `ServiceError` and `invariant()`,
the bounds (limits), the durable envelope, background tasks, crash points
for tests, the transaction-fate vocabulary, the Prometheus metrics every
service exports, and the choice of gRPC's TCP implementation (made before
grpc is imported, so it cannot live beside the grpc code)."""
