"""SaslHandshake (17) and SaslAuthenticate (36): SASL/OAUTHBEARER.

The one mechanism offered is OAUTHBEARER (RFC 7628, Kafka's KIP-255), with
the same bearer tokens (JWTs of the issuers the store trusts,
--oauth-issuers) as the gRPC token listener, and the same principal
(`User:<sub>`). It is offered on a TLS listener to a client that came
without a certificate; a bearer token sent in plain text could be replayed
by anyone who saw it, so a plain-text listener offers no mechanism.
SASL/PLAIN and SCRAM are not offered: they need a credential store, which
the cluster does not keep (and PLAIN sends passwords). A failed exchange is
answered with SASL_AUTHENTICATION_FAILED and the connection closes, as
Kafka's broker does; a successful one tells the client when its token
expires (KIP-368), after which the connection must authenticate again.
Handshake version 0 (raw SASL frames outside Kafka's framing) is not
served: every client we serve uses version 1 with SaslAuthenticate.
"""

from __future__ import annotations

import time
from typing import Any

import jwt

from oncelog.wire.errors import ErrorCode

from ...common.security.principals import AuthenticationError
from .. import metrics
from ..context import RequestContext

OAUTHBEARER = "OAUTHBEARER"
# Kafka's codes that our enum does not hold (no gRPC call can meet them).
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
_SEPARATOR = "\x01"


def mechanisms(ctx: RequestContext) -> tuple[str, ...]:
    """What this connection may authenticate with: OAUTHBEARER on a TLS
    connection that came without a client certificate, when the store
    trusts token issuers."""
    session = ctx.session
    offered = session.sasl_allowed and session.tls and session.principal is None
    return (OAUTHBEARER,) if offered else ()


async def handshake(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    offered = mechanisms(ctx)
    if request.mechanism not in offered:
        return builder.response(error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=offered)
    ctx.session.sasl_mechanism = request.mechanism
    return builder.response(error_code=0, mechanisms=offered)


def bearer_token(auth_bytes: bytes) -> str:
    """The token of an OAUTHBEARER client-first message:
    `n,[a=authzid],` 0x01 `auth=Bearer <token>` 0x01 ... 0x01 0x01."""
    text = auth_bytes.decode("utf-8", errors="strict")
    header, _, rest = text.partition(_SEPARATOR)
    if not header.startswith("n,") and not header.startswith("y,"):
        raise AuthenticationError("the OAUTHBEARER message does not start with a GS2 header "
                                  "('n,,')")
    for pair in rest.split(_SEPARATOR):
        key, _, value = pair.partition("=")
        if key == "auth":
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError("the OAUTHBEARER 'auth' value is not 'Bearer <token>'")
            return token.strip()
    raise AuthenticationError("the OAUTHBEARER message carries no 'auth' value")


async def authenticate(ctx: RequestContext, request: Any) -> Any:
    builder = ctx.builder()
    session = ctx.session
    guard = ctx.broker.guard
    if session.sasl_mechanism != OAUTHBEARER or guard is None:
        return builder.response(error_code=ILLEGAL_SASL_STATE,
                                error_message="SaslAuthenticate before a SaslHandshake that "
                                "chose OAUTHBEARER", auth_bytes=b"", session_lifetime=0)
    try:
        token = bearer_token(bytes(request.auth_bytes))
        principal = guard.principal_of_token(token)
    except (AuthenticationError, UnicodeDecodeError) as exc:
        metrics.AUTHENTICATION_FAILURES.labels("oauthbearer").inc()
        message = exc.message if isinstance(exc, AuthenticationError) else str(exc)
        session.sasl_mechanism = None
        # Answered, then the connection closes (the client reads the error first).
        session.failed_authentication = message
        return builder.response(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                                error_message=f"authentication failed: {message}",
                                auth_bytes=b"", session_lifetime=0)
    expiry_ms = _expiry_ms(token)
    session.principal = principal
    session.sasl_mechanism = None
    session.session_expiry_ms = expiry_ms
    lifetime_ms = 0 if expiry_ms is None else max(expiry_ms - int(time.time() * 1000), 0)
    return builder.response(error_code=0, error_message=None, auth_bytes=b"",
                            session_lifetime=lifetime_ms)


def _expiry_ms(token: str) -> int | None:
    """When an already validated token expires (ms since the epoch)."""
    claims = jwt.decode(token, options={"verify_signature": False})
    exp = claims.get("exp")
    return int(exp * 1000) if isinstance(exp, (int, float)) else None

