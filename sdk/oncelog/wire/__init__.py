"""The wire kernel: what the SDK and the services share, in one place.

Both sides of every gRPC call import these, and the services import nothing
else of the SDK (a test walks their imports), so the house is not drawn as
servers standing on the client:

* `oncelog.v1` — the generated protobuf messages and stubs (the contract);
* `oncelog.wire.errors` — the closed error catalogue, each code's kind and
  the producer's error classes (KIP-1050);
* `oncelog.wire.status` — our Error into and out of a gRPC status;
* `oncelog.wire.records` — the record-batch codec;
* `oncelog.wire.limits` — the bounds both sides must agree on;
* `oncelog.wire.process` — what a service process tells whoever started it;
* `oncelog.wire.vocabulary` — the shared words (ACLs, states, options) as
  StrEnums, and `oncelog.wire.proto_enums` — each beside its proto enum, and
  how a message's (string, enum) pair is read.

The SDK's public `oncelog.errors` and `oncelog.records` are these modules
under the names users import.
"""

from __future__ import annotations

# The release, shown by `--version` and served by every service.
VERSION = "0.1.0"
