"""Security: who a caller is (principals), what it may do (the authorizer and
its ACL bindings), how ACLs are kept (the `__acls` topic's records) and what
every RPC needs (the per-RPC operation table). docs/security.md describes the
model. These modules are pure: no grpc, asyncio, threading, time or random,
so tests and every service evaluate them the same way."""
