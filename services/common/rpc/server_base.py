"""What every oncelog service process shares: configuration from flags and
environment, logging, the gRPC server with health checking and reflection,
TLS, authentication and ACLs (security/service_security.py, docs/security.md), the
Prometheus metrics port, and graceful shutdown on SIGTERM/SIGINT.

Every flag `--some-name` can also be set as the environment variable
`ONCELOG_SOME_NAME`; the flag wins. docs/configuration.md lists them all.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import errno
import gc
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TextIO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import disable_created_metrics, start_http_server

from oncelog.wire import VERSION
from oncelog.wire.limits import (
    KEEPALIVE_TIME_MS,
    KEEPALIVE_TIMEOUT_MS,
    SERVER_MIN_PING_INTERVAL_MS,
)
from oncelog.wire.process import (
    GRPC,
    METRICS,
    TOKEN_GRPC,
    port_in_use_line,
    process_health_service,
)

from ..kernel import limits, metrics
from ..metadata.cluster import ClusterLayout, split_addresses
from ..security.acl_watcher import DEFAULT_ACL_REFRESH_INTERVAL_MS
from ..security.service_security import AUTHORIZER_CHOICES, ServiceSecurity
from ..security.tls import CLIENT_AUTH_CHOICES, DEFAULT_CLIENT_AUTH, DEFAULT_RELOAD_INTERVAL_MS
from .interceptor import ErrorTranslator, RpcInterceptor

log = logging.getLogger("oncelog")


def env_name(flag: str) -> str:
    """The environment variable of a flag: --some-name -> ONCELOG_SOME_NAME."""
    return "ONCELOG_" + flag.upper().replace("-", "_")


def env_default(name: str, default: str | None = None) -> str | None:
    """A flag's default from the environment. Give typed flags their default
    as a string: argparse converts it with the flag's type, so a bad value in
    the environment gets the same clear error as a bad flag."""
    return os.environ.get(env_name(name), default)


def add_int_flags(parser: argparse.ArgumentParser,
                  flags: Iterable[tuple[str, int, str]], *,
                  leave_out: Collection[str] = ()) -> None:
    """Integer flags given as (name, default, help), each defaulting from
    the environment (env_default), except those named in `leave_out`: a
    process that already has a flag of that name sets both with it."""
    for flag, default, help_text in flags:
        if flag not in leave_out:
            parser.add_argument(f"--{flag}", type=int,
                                default=env_default(flag, str(default)), help=help_text)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """An on/off flag's default from the environment."""
    value = (env_default(name, "") or "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise SystemExit(f"{env_name(name)}={value!r}: expected one of {', '.join(_TRUE)} "
                         f"or {', '.join(v for v in _FALSE if v)}")
    return value in _TRUE


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    """A default from the environment that must be one of `choices`
    (argparse checks choices on the command line only)."""
    value = env_default(name, default) or default
    for choice in choices:
        if choice.upper() == value.upper():
            return choice
    raise SystemExit(f"{env_name(name)}={value!r}: expected one of {', '.join(choices)}")


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every service takes."""
    add = parser.add_argument
    add("--node-id", type=int, default=env_default("node-id", "0"),
        help="this process's index among the processes of its kind")
    add("--listen", default=env_default("listen"),
        help="host:port to bind (default: the advertised address)")
    add("--advertised", default=env_default("advertised"),
        help="host:port clients are told (default: this node's entry in the layout)")
    add("--stores", default=env_default("stores", ""),
        help="comma-separated advertised addresses of every partition store, by node id")
    add("--coordinators", default=env_default("coordinators", ""),
        help="comma-separated advertised addresses of every transaction coordinator")
    add("--group-coordinators", default=env_default("group-coordinators", ""),
        help="comma-separated advertised addresses of every group coordinator")
    add("--transaction-state-partitions", type=int,
        default=env_default("transaction-state-partitions", "8"),
        help="partitions of __transaction_state (fixed for the cluster's life)")
    add("--consumer-offsets-partitions", type=int,
        default=env_default("consumer-offsets-partitions", "8"),
        help="partitions of __consumer_offsets (fixed for the cluster's life)")
    add("--metrics-port", type=int, default=env_default("metrics-port", "0"),
        help="Prometheus /metrics HTTP port on the listen host (0: off)")
    add("--log-format", choices=LOG_FORMATS,
        default=env_choice("log-format", "text", LOG_FORMATS),
        help="text, or json: one JSON object per line")
    add("--log-level", choices=LOG_LEVELS, type=str.upper,
        default=env_choice("log-level", "INFO", LOG_LEVELS), help="the least severe level logged")
    add("--shutdown-grace-ms", type=int,
        default=env_default("shutdown-grace-ms", str(limits.SHUTDOWN_GRACE_MS)),
        help="on SIGTERM, how long requests already running get to finish")
    add_security_arguments(parser)


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS, authentication and authorization flags (docs/security.md)."""
    add = parser.add_argument
    add("--tls-cert-file", default=env_default("tls-cert-file"),
        help="serve TLS with this certificate chain (PEM); also this service's client "
             "certificate on its calls to the other services. Without it: plain text")
    add("--tls-key-file", default=env_default("tls-key-file"),
        help="the private key (PEM, unencrypted) of --tls-cert-file")
    add("--tls-ca-file", default=env_default("tls-ca-file"),
        help="CA bundle (PEM) that verifies client certificates and, on this service's own "
             "calls, the other services' certificates")
    add("--tls-client-auth", choices=CLIENT_AUTH_CHOICES,
        default=env_choice("tls-client-auth", DEFAULT_CLIENT_AUTH, CLIENT_AUTH_CHOICES),
        help="client certificates: required or requested (verified at the handshake; gRPC's "
             "Python server cannot make one optional), none (callers use bearer tokens)")
    add("--tls-reload-interval-ms", type=int,
        default=env_default("tls-reload-interval-ms", str(DEFAULT_RELOAD_INTERVAL_MS)),
        help="how often the TLS files are checked for changes (new connections then use the "
             "new certificate)")
    add("--token-listen", default=env_default("token-listen"),
        help="also serve TLS on this host:port without asking for a client certificate: "
             "the listener for clients that authenticate with a bearer token only (needs TLS "
             "and trusted token issuers)")
    add("--token-advertised", default=env_default("token-advertised"),
        help="host:port token clients are told for this node (default: this node's entry "
             "in the token-listener addresses of its kind, else the token listen address)")
    add("--token-stores", default=env_default("token-stores", ""),
        help="comma-separated token-listener addresses of every partition store, by node "
             "id: what callers without a client certificate are told")
    add("--token-coordinators", default=env_default("token-coordinators", ""),
        help="comma-separated token-listener addresses of every transaction coordinator")
    add("--token-group-coordinators", default=env_default("token-group-coordinators", ""),
        help="comma-separated token-listener addresses of every group coordinator")
    add("--ssl-principal-mapping-rules", default=env_default("ssl-principal-mapping-rules",
                                                             "DEFAULT"),
        help="how a client certificate's subject becomes a principal (Kafka's "
             "ssl.principal.mapping.rules syntax)")
    add("--oauth-issuers", default=env_default("oauth-issuers"),
        help='trusted bearer-token issuers: a JSON file {"<issuer>": "<path to PEM public '
             'key>", ...}; without it no token is accepted')
    add("--oauth-audience", default=env_default("oauth-audience"),
        help="when set, a bearer token's 'aud' must include it")
    add("--oauth-sub-claim", default=env_default("oauth-sub-claim", "sub"),
        help="the token claim that names the principal (User:<claim>)")
    add("--oauth-leeway-s", type=float, default=env_default("oauth-leeway-s", "30"),
        help="clock skew tolerated on a token's exp and nbf")
    add("--authorizer", choices=AUTHORIZER_CHOICES,
        default=env_choice("authorizer", "none", AUTHORIZER_CHOICES),
        help="acl: check every call against the ACLs in __acls; none: an authenticated "
             "caller may do anything")
    add("--super-users", default=env_default("super-users", ""),
        help="principals that may do everything, separated by semicolons "
             "('User:admin;User:oncelog-service')")
    add("--allow-everyone-if-no-acl-found", action="store_true",
        default=env_flag("allow-everyone-if-no-acl-found"),
        help="allow an operation on a resource that no ACL names at all (off: deny)")
    add("--acl-refresh-interval-ms", type=int,
        default=env_default("acl-refresh-interval-ms", str(DEFAULT_ACL_REFRESH_INTERVAL_MS)),
        help="how often __acls is read: the bound on how long an ACL change takes to reach "
             "this service")


def layout_from_args(args: argparse.Namespace) -> ClusterLayout:
    return ClusterLayout(
        stores=split_addresses(args.stores),
        coordinators=split_addresses(args.coordinators),
        group_coordinators=split_addresses(args.group_coordinators),
        token_stores=split_addresses(args.token_stores),
        token_coordinators=split_addresses(args.token_coordinators),
        token_group_coordinators=split_addresses(args.token_group_coordinators),
        kafka_stores=split_addresses(getattr(args, "kafka_stores", "")),
        transaction_state_partitions=args.transaction_state_partitions,
        consumer_offsets_partitions=args.consumer_offsets_partitions,
    )


def token_advertised(args: argparse.Namespace, token_addresses: Sequence[str],
                     node_id: int) -> str | None:
    """This node's token-listener address as clients are told it:
    --token-advertised, else its entry in the layout's token addresses, else
    --token-listen; None when it has no token listener."""
    if not args.token_listen:
        return None
    if args.token_advertised:
        return str(args.token_advertised)
    if node_id < len(token_addresses):
        return token_addresses[node_id]
    return str(args.token_listen)


def _json_entry(*, ts_ms: int, level: str, service: str, logger: str, msg: str,
                exc: str | None = None) -> str:
    entry = {"ts_ms": ts_ms, "level": level, "service": service, "logger": logger, "msg": msg}
    if exc:
        entry["exc"] = exc
    return json.dumps(entry)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: ts_ms, level, service, logger, msg (and exc)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        return _json_entry(
            ts_ms=int(record.created * 1000), level=record.levelname, service=self._service,
            logger=record.name, msg=record.getMessage(),
            exc=self.formatException(record.exc_info) if record.exc_info else None,
        )


# gRPC's C core logs "I1122 17:13:17.281398 19726 file.cc:12] text".
_NATIVE_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_NATIVE_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^\]]+\] ")


def _wrap_native_stderr(service: str, lock: threading.RLock) -> TextIO:
    """Makes everything written to file descriptor 2 by anything but our
    logging handler — gRPC's C core, an uncaught exception's traceback —
    arrive as JSON lines too: fd 2 becomes a pipe that a thread reads and
    wraps. Returns the real stderr, for the handler. At exit the pipe is
    closed and drained, so a last traceback is not lost."""
    real_stderr = os.fdopen(os.dup(2), "w", buffering=1)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode(errors="replace").rstrip("\n")
                if not line.strip():
                    continue
                native = _NATIVE_LINE.match(line)
                entry = _json_entry(
                    ts_ms=int(time.time() * 1000),
                    level=_NATIVE_LEVELS[native.group(1)] if native else "ERROR",
                    service=service, logger="grpc" if native else "stderr", msg=line,
                )
                with lock:
                    real_stderr.write(entry + "\n")

    thread = threading.Thread(target=pump, name="stderr-to-json", daemon=True)
    thread.start()

    def drain() -> None:
        sys.stderr.flush()
        os.dup2(real_stderr.fileno(), 2)  # closes the pipe's last write end
        thread.join(5.0)

    atexit.register(drain)
    return real_stderr


def configure_logging(fmt: str, level: str, service: str) -> None:
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(_JsonFormatter(service))
        # One lock for both writers of the real stderr: whole lines only.
        lock = threading.RLock()
        handler.lock = lock
        handler.setStream(_wrap_native_stderr(service, lock))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


GRPC_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_send_message_length", limits.MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", limits.MAX_GRPC_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # The clients' keepalive pings (oncelog.wire.limits): accepted this often,
    # with or without calls, and the server pings idle clients the same way.
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
    ("grpc.http2.max_ping_strikes", 0),
)


# How often the conditions behind `health_checks` statuses are evaluated.
HEALTH_CHECK_INTERVAL_MS = 200
# At the end of a graceful shutdown: how long the server's last streams
# (health watches) may run on to send what they have queued (shutdown()).
HEALTH_WATCH_FLUSH_S = 0.2


class ServiceServer:
    """A gRPC server with health checking, reflection and the RPC interceptor
    (metrics, shutdown gate), and its graceful shutdown:

    1. every health status turns NOT_SERVING — health and reflection still
       answer, so probes see the process draining rather than gone — and
       `before_draining` runs while the process still serves every request
       (a store hands its leaderships over: it answers as a follower
       meanwhile, NOT_LEADER_OR_FOLLOWER to producers, fetches to followers);
    2. new oncelog RPCs are refused with SHUTTING_DOWN (retriable) and
       `on_draining` runs (the store wakes its long-polls);
    3. the RPCs already running get up to `shutdown_grace_ms` to finish
       (an acknowledged write is acknowledged before the process goes);
    4. the server stops (health watches end) and `on_shutdown` runs (stop
       timers, snapshot, close storage).

    `health_checks`: more health service names, each SERVING while its
    condition holds (looked at every HEALTH_CHECK_INTERVAL_MS from
    set_serving on) and NOT_SERVING otherwise — a store's "in sync" status,
    which its readiness probe asks for.
    """

    def __init__(
        self,
        *,
        service_name: str,
        full_service_names: Sequence[str],
        register: Callable[[grpc.aio.Server], None],
        shutdown_grace_ms: int = limits.SHUTDOWN_GRACE_MS,
        on_draining: Callable[[], Awaitable[None]] | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        credentials: grpc.ServerCredentials | None = None,
        guard: grpc.aio.ServerInterceptor | None = None,
        before_draining: Callable[[], Awaitable[None]] | None = None,
        health_checks: Mapping[str, Callable[[], bool]] | None = None,
        translate_error: ErrorTranslator | None = None,
    ) -> None:
        if shutdown_grace_ms < 0:
            raise ValueError(f"shutdown grace is {shutdown_grace_ms} ms; it must be >= 0")
        self.service_name = service_name
        # Our pid's name lets a caller that started this process tell it from
        # another process holding the port (oncelog.wire.process).
        self._names = ["", *full_service_names, process_health_service(os.getpid())]
        self._shutdown_grace_ms = shutdown_grace_ms
        self._on_draining = on_draining
        self._on_shutdown = on_shutdown
        self._before_draining = before_draining
        self._health_checks = dict(health_checks or {})
        self._health_watch: asyncio.Task[None] | None = None
        self.interceptor = RpcInterceptor(service_name, translate_error=translate_error)
        # TLS when given credentials, else plain text.
        self._credentials = credentials
        # The RPC interceptor first: its shutdown gate and undecodable-request
        # refusal come before authentication, and its metrics count refusals.
        interceptors: list[grpc.aio.ServerInterceptor] = [self.interceptor]
        if guard is not None:
            interceptors.append(guard)
        self.server = grpc.aio.server(options=list(GRPC_OPTIONS), interceptors=interceptors)
        register(self.server)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*full_service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self._shutdown_started = False

    async def start(self, listen: str, *, token_listen: str | None = None,
                    token_credentials: grpc.ServerCredentials | None = None) -> int:
        """Binds and starts serving (health NOT_SERVING until set_serving);
        returns the bound port. `token_listen`: a second port, served with
        `token_credentials` (the token listener: TLS without client
        certificates), by the same handlers and interceptors. Exits with a
        one-line reason when it cannot bind (a taken port in the words of
        oncelog.wire.process)."""
        port = self._bind(listen, self._credentials, GRPC)
        if token_listen is not None:
            if token_credentials is None:
                raise ValueError("a token listener needs TLS credentials")
            self._bind(token_listen, token_credentials, TOKEN_GRPC)
        # The health servicer starts with "" SERVING; nothing is served yet.
        for name in [*self._names, *self._health_checks]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        return port

    def _bind(self, listen: str, credentials: grpc.ServerCredentials | None,
              purpose: str) -> int:
        try:
            if credentials is None:
                port = self.server.add_insecure_port(listen)
            else:
                port = self.server.add_secure_port(listen, credentials)
        except RuntimeError:
            # grpcio raises "Failed to bind" without the reason (older
            # versions returned 0); the reason is asked of the OS below.
            port = 0
        if port == 0:
            raise SystemExit(listen_failure(self.service_name, purpose, listen,
                                            _bind_error(listen)))
        return port

    async def set_serving(self) -> None:
        # The extra statuses first: whoever sees the process serving finds
        # them already telling the truth.
        shown: dict[str, int] = {}
        await self._apply_health_checks(shown)
        for name in self._names:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        metrics.SERVING.set(1)
        if self._health_checks and self._health_watch is None:
            self._health_watch = asyncio.get_running_loop().create_task(
                self._watch_health_checks(shown), name="health-checks")

    async def _apply_health_checks(self, shown: dict[str, int]) -> None:
        """Sets each `health_checks` status to its condition where it
        changed (a condition that raises counts as not holding, and is
        logged)."""
        for name, check in self._health_checks.items():
            try:
                holds = check()
            except Exception:
                log.exception("%s: health check %r failed", self.service_name, name)
                holds = False
            status = (health_pb2.HealthCheckResponse.SERVING if holds
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            if shown.get(name) != status:
                shown[name] = status
                await self.health.set(name, status)

    async def _watch_health_checks(self, shown: dict[str, int]) -> None:
        while not self._shutdown_started:
            await asyncio.sleep(HEALTH_CHECK_INTERVAL_MS / 1000)
            await self._apply_health_checks(shown)

    async def shutdown(self) -> None:
        """The graceful shutdown described in the class docstring (once)."""
        if self._shutdown_started:
            return
        self._shutdown_started = True
        if self._health_watch is not None:
            self._health_watch.cancel()
        metrics.SERVING.set(0)
        await self.health.enter_graceful_shutdown()
        if self._before_draining is not None:
            await self._before_draining()
        self.interceptor.draining = True
        log.info("%s draining: new requests are refused, %d in flight",
                 self.service_name, self.interceptor.in_flight)
        if self._on_draining is not None:
            await self._on_draining()
        if not await self.interceptor.wait_idle(self._shutdown_grace_ms / 1000):
            log.warning("%s: %d requests still running after the %d ms grace; cancelling them",
                        self.service_name, self.interceptor.in_flight, self._shutdown_grace_ms)
        # Not stop(0): that cancels the health watches at once, and a watch
        # whose NOT_SERVING update was queued but not yet written (its
        # handler had not run again since) would end without it - a probe
        # would see the process gone rather than draining. Only watches and
        # calls past the grace above are left; they get this long.
        await self.server.stop(HEALTH_WATCH_FLUSH_S)
        if self._on_shutdown is not None:
            await self._on_shutdown()


def listen_failure(service_name: str, purpose: str, address: str,
                   error: OSError | None) -> str:
    """Why a service cannot listen on `address`, in one line. A taken port
    gets the fixed wording of oncelog.wire.process, which LocalCluster looks
    for to pick a fresh port instead of failing."""
    if error is not None and error.errno == errno.EADDRINUSE:
        return port_in_use_line(service_name, purpose, address)
    reason = str(error) if error is not None else (
        "reason unknown (GRPC_VERBOSITY=debug makes gRPC log it)")
    return f"{service_name}: cannot listen for {purpose} on {address}: {reason}"


def _bind_error(listen: str) -> OSError | None:
    """The OS's reason a server cannot bind `listen` ("host:port") now, found
    by binding a plain socket the way gRPC binds its listener (SO_REUSEADDR,
    so a port left in TIME_WAIT counts as free); None when it binds or the
    address is not host:port."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        return None
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc
    family, sock_type, proto, _, sockaddr = infos[0]
    with socket.socket(family, sock_type, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            return exc
    return None


async def _probe_event_loop_lag() -> None:
    """Measures how late the event loop wakes a timer: the time it was kept
    from running callbacks (CPU-bound work, the GIL, a blocking call)."""
    loop = asyncio.get_running_loop()
    interval_s = metrics.EVENT_LOOP_PROBE_INTERVAL_S
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        metrics.EVENT_LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))


async def serve(
    *,
    service_name: str,
    full_service_names: Sequence[str],
    listen: str,
    register: Callable[[grpc.aio.Server], None],
    node_id: int = 0,
    metrics_port: int = 0,
    shutdown_grace_ms: int = limits.SHUTDOWN_GRACE_MS,
    on_started: Callable[[], Awaitable[None]] | None = None,
    on_draining: Callable[[], Awaitable[None]] | None = None,
    on_shutdown: Callable[[], Awaitable[None]] | None = None,
    security: ServiceSecurity | None = None,
    before_draining: Callable[[], Awaitable[None]] | None = None,
    health_checks: Mapping[str, Callable[[], bool]] | None = None,
    translate_error: ErrorTranslator | None = None,
) -> None:
    """Runs a service until SIGTERM/SIGINT, then shuts it down gracefully
    (ServiceServer.shutdown). A second SIGINT during shutdown exits at once,
    as after a crash (everything acknowledged is already durable); a
    repeated SIGTERM changes nothing. With `security`, the server serves
    TLS and runs its guard as configured, and its ACL watcher (if any) runs
    from the server's start to its shutdown."""

    async def shutdown() -> None:
        if security is not None:
            await security.stop()
        if on_shutdown is not None:
            await on_shutdown()

    server = ServiceServer(
        service_name=service_name, full_service_names=full_service_names, register=register,
        shutdown_grace_ms=shutdown_grace_ms, on_draining=on_draining, on_shutdown=shutdown,
        credentials=None if security is None else security.server_credentials(),
        guard=None if security is None else security.guard(),
        before_draining=before_draining, health_checks=health_checks,
        translate_error=translate_error,
    )
    # The client's *_created series would double the series count for
    # nothing a dashboard uses.
    disable_created_metrics()
    metrics.SERVICE_INFO.labels(service_name, str(node_id), VERSION).set(1)
    metrics.SERVING.set(0)
    if metrics_port:
        host = listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
        try:
            start_http_server(metrics_port, addr=host)
        except OSError as exc:
            address = f"[{host}]:{metrics_port}" if ":" in host else f"{host}:{metrics_port}"
            raise SystemExit(listen_failure(service_name, METRICS, address, exc)) from exc
    await server.start(
        listen, token_listen=None if security is None else security.settings.token_listen,
        token_credentials=None if security is None else security.token_server_credentials())
    if security is not None:
        security.log_startup()
        # After the server starts: a store may lead __acls itself, and reads
        # it through its own server.
        security.start()
    if on_started is not None:
        await on_started()
    await server.set_serving()
    log.info("%s serving on %s (metrics port %s)", service_name, listen, metrics_port or "off")
    probe = asyncio.ensure_future(_probe_event_loop_lag())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            stop.set()
        elif signum == signal.SIGINT:
            # A second Ctrl-C: the person at the terminal does not want to wait.
            log.warning("%s: interrupted again during shutdown; exiting now", service_name)
            os._exit(1)
        else:
            log.info("%s: already shutting down (signal %d)", service_name, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await stop.wait()
    log.info("%s shutting down", service_name)
    probe.cancel()
    await server.shutdown()
    log.info("%s stopped", service_name)


# How many collections of the middle generation may pass before CPython's
# collector looks at the oldest one (its third threshold; CPython's default
# is 10). A service under load keeps every object of a batch alive until
# the batch is acknowledged, so tens of thousands of short-lived objects
# reach the oldest generation each second, and CPython's rule (a full
# collection once they are a quarter of the long-lived ones) then ran one
# every second in each store at 1,000 partitions: 130,000 objects scanned,
# 0.2-0.3 s of stalled event loop each on a busy machine, to free next to
# nothing (at most 1,449 objects in all over 13 of them). At 100 a full
# collection comes at most a tenth as often; the young generations are
# collected as before, so cycles still go (docs/performance.md, "The
# services' garbage collector").
GC_FULL_COLLECTION_EVERY_GEN1 = 100


def collect_oldest_generation_rarely() -> None:
    """Raises CPython's third collector threshold to
    GC_FULL_COLLECTION_EVERY_GEN1, keeping the first two."""
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, GC_FULL_COLLECTION_EVERY_GEN1)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Entry point helper: a short switch interval keeps the storage flusher
    thread from starving behind the event loop (see docs/design.md); full
    garbage collections come rarely (collect_oldest_generation_rarely)."""
    sys.setswitchinterval(0.0005)
    collect_oldest_generation_rarely()
    asyncio.run(main())
