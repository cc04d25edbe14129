"""Security: who a caller is (principals), what it may do (the authorizer and
its ACL bindings), how ACLs are kept (the `__acls` topic's records) and what
every RPC needs (the per-RPC operation table). docs/security.md describes the
model. These modules are pure: no grpc, asyncio, threading, time or random,
so tests and every service evaluate them the same way
(tests/unit/test_core_purity.py).

The process's side of security lives here too: the gRPC interceptor that
authenticates and authorizes each call (guard.py), TLS credentials
(tls.py), the watcher that keeps the ACLs current (acl_watcher.py) and the
wiring of all three from a service's flags (service_security.py)."""
