"""The kernel every service shares, free of grpc (so `core/` modules may
import it): the expected-failure value `ServiceError` and `invariant()`,
the bounds (limits), the durable envelope, background tasks, crash points
for tests, the transaction-fate vocabulary and the Prometheus metrics every
service exports."""
