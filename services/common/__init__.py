"""What every service shares, one package per subject (docs/contributing.md,
"The shape of a service"): kernel/ (no grpc: ServiceError, invariant(),
limits, the durable envelope), rpc/ (the gRPC side: server base,
interceptor, status mapping, the services' clients of each other),
metadata/ (cluster layout, the metadata store), security/ (principals,
ACLs, the guard, TLS) and shards/ (the runtime both coordinators build on)."""
