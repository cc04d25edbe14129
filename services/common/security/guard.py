"""Who is calling, and may they: the server interceptor that authenticates
and authorizes every oncelog RPC, the same in all three services.

For each call, before the servicer runs:

1. **Authentication.** A bearer token in the call's metadata
   (`authorization: Bearer <jwt>`) names the principal when present
   (principals.validate_bearer against the configured issuers); otherwise
   the client certificate gRPC verified at the handshake does (its subject,
   mapped by the principal mapping rules). A call with neither to a service
   that requires authentication (it serves TLS, or trusts token issuers) is
   refused with UNAUTHENTICATED carrying SASL_AUTHENTICATION_FAILED, as is a
   call whose token or certificate subject does not authenticate. A service
   that serves plain text and trusts no issuer calls everyone
   `User:ANONYMOUS` (Kafka's name for an unauthenticated PLAINTEXT caller).
2. **Authorization** (with an ACL source, `--authorizer acl`). The method's
   rule (security.operations.TABLE) turns the request into checks; the first
   one the principal fails refuses the call with PERMISSION_DENIED and the
   code of the refused resource's type, naming the principal, the operation
   and the resource — before the servicer runs, so a refused call changes
   nothing. A method the table does not know is refused, never let through.
   Listings run, and the entries of their answer the principal may not see
   are left out (operations.apply_filter).

Health checking and reflection (operations.OPEN_METHODS) are neither
authenticated nor authorized: probes must get answers from any process they
reach (a TLS port still asks for TLS).

Until a service has read the ACLs once (AclSource.loaded), it cannot tell who
may do what: only super users and the service's own principal (the one its
own certificate maps to, so that the services can read `__acls` from one
another) are served; everyone else gets the retriable
COORDINATOR_LOAD_IN_PROGRESS.

Every refusal is counted in `oncelog_authorization_denials_total` and
logged at WARNING naming the principal, at most one line per principal,
operation and resource a minute (the next line says how many were not
logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from cryptography import x509
from google.protobuf.message import Message

from oncelog.wire.errors import ErrorCode

from ..kernel import metrics
from ..kernel.errors import ServiceError
from ..rpc.request_streams import Refused
from ..rpc.status import abort_with
from .authorizer import Authorizer
from .operations import OPEN_METHODS, TABLE, Check, Denial, RpcRule, apply_filter, first_denial
from .principals import (
    DEFAULT_RULES,
    AuthenticationError,
    MappingRule,
    principal_from_certificate_subject,
    validate_bearer,
)

log = logging.getLogger("oncelog.security")

ANONYMOUS = "User:ANONYMOUS"
AUTHORIZATION_METADATA = "authorization"
_BEARER = "bearer "
_OWN_PREFIX = "/oncelog."
# Denial log lines: at most one per key per window.
DENIAL_LOG_WINDOW_S = 60.0
# Keys the denial log remembers before it forgets the ones past their window.
_DENIAL_LOG_MAX_KEYS = 10_000
# Certificates whose principal is remembered (one per client identity).
_PRINCIPAL_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthenticationConfig:
    """How callers are authenticated."""

    # A call must carry a principal (the service serves TLS or trusts issuers).
    required: bool = False
    mapping_rules: tuple[MappingRule, ...] = DEFAULT_RULES
    # Trusted token issuers: `iss` -> public key in PEM. Empty: no tokens.
    issuers: Mapping[str, str] = field(default_factory=dict)
    audience: str | None = None
    sub_claim: str = "sub"
    leeway_s: float = 30.0


class AclSource(Protocol):
    """The ACLs a guard decides by (acl_watcher.AclWatcher)."""

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def loaded(self) -> bool: ...


def peer_host(peer: str) -> str:
    """The client's address from gRPC's peer string: "ipv4:10.0.0.7:5123" ->
    "10.0.0.7", "ipv6:[::1]:5123" -> "::1"; anything else as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] or rest
        return host.strip("[]")
    return peer


def subject_of(pem: bytes) -> str:
    """A certificate's subject as an RFC 4514 (= RFC 2253 order) string."""
    return x509.load_pem_x509_certificate(pem).subject.rfc4514_string()


def _auth_value(auth: Mapping[str, Any], key: str) -> bytes | None:
    values = auth.get(key)
    if not values:
        return None
    value = values[0]
    return value if isinstance(value, bytes) else str(value).encode()


def without_client_certificate(context: grpc.aio.ServicerContext) -> bool:
    """Whether a call came without a verified client certificate. On a
    service that verifies client certificates on its main port, such a call
    came through its token listener (--token-listen), and the addresses it
    is told are the token listeners' (Kafka answers on the listener a
    request arrived on)."""
    return _auth_value(context.auth_context() or {}, "x509_pem_cert") is None


@dataclass(slots=True)
class _LogEntry:
    logged_s: float
    suppressed: int = 0


class DenialLog:
    """Counts every refusal and logs it at WARNING, at most one line per key
    (principal, operation, resource) per window."""

    def __init__(self, *, window_s: float = DENIAL_LOG_WINDOW_S,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock_s = clock_s
        self._entries: dict[tuple[str, ...], _LogEntry] = {}

    def _due(self, key: tuple[str, ...]) -> int | None:
        """The count of lines not logged for this key since its last line,
        when a line is due now; None when this one is suppressed."""
        now_s = self._clock_s()
        entry = self._entries.get(key)
        if entry is not None and now_s - entry.logged_s < self._window_s:
            entry.suppressed += 1
            return None
        if len(self._entries) >= _DENIAL_LOG_MAX_KEYS:
            self._entries = {k: e for k, e in self._entries.items()
                             if now_s - e.logged_s < self._window_s}
        suppressed = 0 if entry is None else entry.suppressed
        self._entries[key] = _LogEntry(now_s)
        return suppressed

    @staticmethod
    def _more(suppressed: int) -> str:
        return f" ({suppressed} more since the last line, not logged)" if suppressed else ""

    def denied(self, denial: Denial, *, host: str, method: str) -> None:
        check = denial.check
        # The gRPC service's short name, as the RPC metrics label it.
        service = method.lstrip("/").partition("/")[0].rpartition(".")[2]
        metrics.AUTHORIZATION_DENIALS.labels(
            service, check.operation.value, check.resource_type.value).inc()
        suppressed = self._due((denial.principal, check.operation.value,
                                check.resource_type.value, check.resource_name))
        if suppressed is None:
            return
        log.warning("authorization denied: %s (host %s, %s, %s)%s", denial.message, host,
                    method, denial.decision, self._more(suppressed))

    def unauthenticated(self, message: str, *, host: str, method: str) -> None:
        suppressed = self._due(("unauthenticated", host, message[:120]))
        if suppressed is None:
            return
        log.warning("authentication failed: a call from %s to %s: %s%s", host, method, message,
                    self._more(suppressed))


Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
StreamBehavior = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str
    host: str


# The authenticated caller of the call being served, set by the guard before
# the servicer runs (a request stream's tasks inherit it): the servicer's
# client quotas are per principal. Unset without a guard: everyone is
# ANONYMOUS then.
CURRENT_CALLER: ContextVar[Caller | None] = ContextVar("oncelog_current_caller", default=None)


def current_principal() -> str:
    """The principal of the call being served (ANONYMOUS without a guard)."""
    caller = CURRENT_CALLER.get()
    return ANONYMOUS if caller is None else caller.principal


class SecurityGuard(grpc.aio.ServerInterceptor):
    """The interceptor of the module docstring."""

    def __init__(self, authentication: AuthenticationConfig, *,
                 acls: AclSource | None = None, own_principal: str | None = None,
                 clock_s: Callable[[], float] = time.time) -> None:
        self._authentication = authentication
        self._acls = acls
        self._own_principal = own_principal
        self._clock_s = clock_s
        self._denials = DenialLog()
        self._principals: dict[bytes, str] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    # ---------------------------------------------------------- authentication

    def principal_of_certificate(self, pem: bytes) -> str:
        """The principal a verified client certificate (PEM) maps to."""
        principal = self._principals.get(pem)
        if principal is None:
            try:
                subject = subject_of(pem)
            except ValueError as exc:
                raise AuthenticationError(f"the client certificate cannot be read: {exc}") from exc
            principal = principal_from_certificate_subject(subject,
                                                           self._authentication.mapping_rules)
            if len(self._principals) >= _PRINCIPAL_CACHE_SIZE:
                self._principals.clear()
            self._principals[pem] = principal
        return principal

    def principal_of_token(self, token: str) -> str:
        """The principal a bearer token (a JWT of a trusted issuer) names."""
        config = self._authentication
        if not config.issuers:
            raise AuthenticationError(
                "the caller presents a bearer token, but this service trusts no token "
                "issuer (--oauth-issuers)")
        return validate_bearer(token, config.issuers, config.audience, self._clock_s(),
                               config.leeway_s, principal_claim=config.sub_claim)

    @property
    def authentication_required(self) -> bool:
        return self._authentication.required

    def authenticate(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's principal; AuthenticationError when it has none or a bad one."""
        config = self._authentication
        for key, value in context.invocation_metadata() or ():
            if key != AUTHORIZATION_METADATA:
                continue
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if not text.lower().startswith(_BEARER):
                raise AuthenticationError(
                    "the call's 'authorization' metadata is not 'Bearer <token>'")
            return self.principal_of_token(text[len(_BEARER):].strip())
        pem = _auth_value(context.auth_context() or {}, "x509_pem_cert")
        if pem is not None:
            return self.principal_of_certificate(pem)
        if config.required:
            raise AuthenticationError(
                "the call carries neither a verified client certificate nor a bearer token "
                "('authorization: Bearer <jwt>' metadata)")
        return ANONYMOUS

    # ----------------------------------------------------------- authorization

    def _authorizer(self, principal: str) -> Authorizer | None:
        """The authorizer to decide by; None: the caller may do anything
        (no authorizer, or the ACLs are still loading and the caller is the
        service itself or a super user). Raises the retriable refusal for
        anyone else while the ACLs load."""
        if self._acls is None:
            return None
        authorizer = self._acls.authorizer
        if self._acls.loaded:
            return authorizer
        if principal == self._own_principal or authorizer.is_super_user(principal):
            return None
        raise ServiceError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           "this service is still reading the ACLs (__acls); retry")

    async def _caller(self, context: grpc.aio.ServicerContext, method: str) -> Caller:
        """The authenticated caller, or the call ends UNAUTHENTICATED."""
        host = peer_host(context.peer() or "")
        try:
            principal = self.authenticate(context)
        except AuthenticationError as exc:
            self._denials.unauthenticated(exc.message, host=host, method=method)
            await abort_with(context, exc)
        caller = Caller(principal, host)
        CURRENT_CALLER.set(caller)
        return caller

    def authorize(self, caller: Caller, method: str, request: Message) -> Authorizer | None:
        """Decides whether `caller` may make the call of `method` (a full
        gRPC method name) with `request`, by the method's rule; raises the
        refusal's ServiceError. Returns the authorizer that decided (None:
        the caller may do anything), which filters the answer of a listing
        (`filter_answer`). The Kafka listener asks this for the gRPC method
        each Kafka request maps to, so both ports obey the same ACLs."""
        authorizer = self._authorizer(caller.principal)
        if authorizer is None:
            return None
        rule = TABLE.get(method)
        if rule is None:
            raise ServiceError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{method} has no authorization rule; {caller.principal} is not allowed "
                "to call it")
        denial = first_denial(authorizer, caller.principal, caller.host, rule.checks(request))
        if denial is not None:
            self._denials.denied(denial, host=caller.host, method=method)
            raise ServiceError(denial.code, denial.message)
        return authorizer

    def authorize_checks(self, caller: Caller, what: str, checks: list[Check]) -> None:
        """Raises the refusal (ServiceError) of the first check `caller`
        fails; for a request that has no gRPC method of its own (the Kafka
        listener's DescribeConfigs). `what` names the request in the denial
        log."""
        authorizer = self._authorizer(caller.principal)
        if authorizer is None:
            return
        denial = first_denial(authorizer, caller.principal, caller.host, checks)
        if denial is not None:
            self._denials.denied(denial, host=caller.host, method=what)
            raise ServiceError(denial.code, denial.message)

    def filter_answer(self, caller: Caller, method: str, request: Message, response: Message,
                      authorizer: Authorizer | None) -> None:
        """Leaves out of a listing's answer what `caller` may not see."""
        rule = TABLE.get(method)
        if authorizer is not None and rule is not None and rule.filters:
            self._filter(rule, request, response, caller, authorizer)

    async def _admit(self, request: Message, context: grpc.aio.ServicerContext, method: str,
                     rule: RpcRule | None) -> tuple[Caller, Authorizer | None]:
        """Authenticates and authorizes a call, or ends it."""
        caller = await self._caller(context, method)
        try:
            authorizer = self.authorize(caller, method, request)
        except ServiceError as exc:
            await abort_with(context, exc)
        return caller, authorizer

    @staticmethod
    def _filter(rule: RpcRule, request: Message, response: Message, caller: Caller,
                authorizer: Authorizer) -> None:
        def allowed(check: Check) -> bool:
            return first_denial(authorizer, caller.principal, caller.host, [check]) is None

        for answer_filter in rule.filters:
            apply_filter(answer_filter, request, response, allowed, principal=caller.principal)

    def _wrap_request_stream(self, stream: Any, method: str,
                             rule: RpcRule) -> StreamBehavior:
        """A request stream (rpc/request_streams.py): the caller is authenticated
        once, when the stream opens, and every request is authorized by
        itself with the method's rule, as the unary form's request would be;
        a refused one reaches the servicer as a Refused, which it answers in
        the stream, so the client's other requests go on."""

        async def request_stream(requests: AsyncIterator[Any],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            caller = await self._caller(context, method)
            principal, host = caller.principal, caller.host

            async def admitted() -> AsyncIterator[Any]:
                async for request in requests:
                    try:
                        authorizer = self._authorizer(principal)
                    except ServiceError as exc:
                        yield Refused(request.request_id, exc)
                        continue
                    denial = None if authorizer is None else first_denial(
                        authorizer, principal, host, rule.checks(request))
                    if denial is None:
                        yield request
                        continue
                    self._denials.denied(denial, host=host, method=method)
                    yield Refused(request.request_id, ServiceError(denial.code, denial.message))

            async for answer in stream(admitted(), context):
                yield answer

        return request_stream

    # ------------------------------------------------------------ interceptor

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in self._handlers:
            return self._handlers[method]  # type: ignore[return-value]
        handler = await continuation(handler_call_details)
        if handler is None or method in OPEN_METHODS or (
                not method.startswith(_OWN_PREFIX) and method not in TABLE):
            # Unknown methods (gRPC answers UNIMPLEMENTED), health, reflection.
            return handler
        wrapped = self._wrap(handler, method, TABLE.get(method))
        self._handlers[method] = wrapped
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str,
              rule: RpcRule | None) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            unary: Behavior = handler.unary_unary  # type: ignore[assignment]

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                caller, authorizer = await self._admit(request, context, method, rule)
                response = await unary(request, context)
                if authorizer is not None and rule is not None and rule.filters:
                    self._filter(rule, request, response, caller, authorizer)
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            stream: StreamBehavior = handler.unary_stream  # type: ignore[assignment]

            async def unary_stream(request: Any,
                                   context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                caller, authorizer = await self._admit(request, context, method, rule)
                async for response in stream(request, context):
                    if authorizer is not None and rule is not None and rule.filters:
                        self._filter(rule, request, response, caller, authorizer)
                    yield response

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)

        if handler.stream_stream is not None and rule is not None and rule.per_message:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_request_stream(handler.stream_stream, method, rule),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)

        # Any other client-streaming method: the table's rules read one
        # request, so such a method could not be authorized before it runs.
        # None exists; one added later is refused rather than let through
        # unchecked.
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await abort_with(context, ServiceError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{method} streams its requests, which the authorizer cannot check"))

        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            refuse, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
