"""What a handler is given: the request's header, the connection's session
and the broker (the store it runs in), with the few helpers every handler
needs (error numbers for its version, authorization, the response builder)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from oncelog.wire.errors import ErrorCode

from ..common.kernel.errors import ServiceError
from ..common.security.authorizer import Authorizer
from ..common.security.guard import ANONYMOUS, Caller
from ..common.security.operations import Check
from .apis import ApiKey
from .errors import kafka_code
from .messages import Builder, RequestHeader

if TYPE_CHECKING:
    from .broker import KafkaBroker


@dataclass(slots=True)
class Session:
    """One client connection: who it is and how it came."""

    host: str
    port: int
    tls: bool = False
    # Set once the connection has authenticated: its TLS client
    # certificate's principal, a SASL exchange's, or User:ANONYMOUS on a
    # listener that asks for neither.
    principal: str | None = None
    # The listener lets a connection without a principal authenticate with
    # SASL/OAUTHBEARER.
    sasl_allowed: bool = False
    # The mechanism a SaslHandshake chose, until SaslAuthenticate completes.
    sasl_mechanism: str | None = None
    # A SASL exchange failed: the connection closes once its answer is sent.
    failed_authentication: str | None = None
    # SASL/OAUTHBEARER: when the token expires (ms since the epoch), after
    # which the connection must authenticate again (KIP-368), or None.
    session_expiry_ms: int | None = None

    @property
    def caller(self) -> Caller:
        return Caller(self.principal or ANONYMOUS, self.host)


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    session: Session
    broker: KafkaBroker
    api: ApiKey = field(init=False)

    def __post_init__(self) -> None:
        self.api = ApiKey(self.header.api_key)

    @property
    def version(self) -> int:
        return self.header.api_version

    def builder(self) -> Builder:
        return Builder(self.header.api_key, self.header.api_version)

    def code(self, error: ErrorCode | ServiceError | None) -> int:
        """The Kafka error number this request's version answers for `error`."""
        if isinstance(error, ServiceError):
            error = error.code
        return kafka_code(error, self.api, self.version)

    def authorize(self, method: str, request: Message) -> Authorizer | None:
        """Raises the refusal (ServiceError) when the session's principal may
        not make the gRPC call `method` with `request`, which is what this
        Kafka request does."""
        guard = self.broker.guard
        if guard is None:
            return None
        return guard.authorize(self.session.caller, method, request)

    def authorize_checks(self, what: str, checks: list[Check]) -> None:
        """The same for a request with no gRPC method of its own."""
        guard = self.broker.guard
        if guard is not None:
            guard.authorize_checks(self.session.caller, what, checks)

    def filter_answer(self, method: str, request: Message, response: Message,
                      authorizer: Authorizer | None) -> None:
        guard = self.broker.guard
        if guard is not None:
            guard.filter_answer(self.session.caller, method, request, response, authorizer)


# A handler answers a request with a response body, or None when the request
# takes no answer (Produce with acks=0).
Handler = Callable[[RequestContext, Any], Awaitable[Any]]


class CloseConnection(Exception):
    """The connection ends without an answer to this request (Kafka's
    broker closes a connection it cannot or must not answer: a failed
    Produce with acks=0, a request before authentication, ...)."""
