"""The Kafka listener: a TCP server in the partition store process.

Who a connection is, by how the store serves gRPC (docs/kafka-protocol.md,
"Security"):

* a store that serves plain text without token issuers: plain text, every
  client `User:ANONYMOUS` (Kafka's PLAINTEXT listener);
* a store that serves TLS: TLS only (plain text is refused: the handshake
  fails), with the store's own certificate, re-read when its files change
  (new connections get the new one). A client certificate signed by the
  store's CA names the principal, with the same mapping rules as the gRPC
  port (Kafka's SSL listener). A client without one must authenticate with
  SASL/OAUTHBEARER, with a JWT of the issuers the store trusts (Kafka's
  SASL_SSL listener), before any request but ApiVersions and SASL's own;
  without token issuers such a client is refused at the handshake.

The same ACLs decide every request on either port (context.authorize).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass

from ..common.kernel import limits
from ..common.kernel.invariants import InvariantViolation
from ..common.security.guard import ANONYMOUS, SecurityGuard
from ..common.security.principals import AuthenticationError
from ..common.security.tls import TlsFiles
from . import metrics
from .broker import KafkaBroker, split_host_port
from .connection import Connection
from .context import Session

log = logging.getLogger("oncelog.kafka")

# How long a client has for the TLS handshake.
TLS_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """TLS files (None: plain text), and whether a client without a
    certificate may authenticate with SASL/OAUTHBEARER instead."""

    tls: TlsFiles | None = None
    sasl_oauthbearer: bool = False
    # A client with no certificate and no SASL may do anything as
    # User:ANONYMOUS (a plain-text cluster without authentication).
    anonymous: bool = True


class KafkaListener:
    def __init__(self, broker: KafkaBroker, listen: str, security: ListenerSecurity) -> None:
        self._broker = broker
        self._host, self._port = split_host_port(listen)
        self._security = security
        self._server: asyncio.Server | None = None
        # Open connections: their tasks (asyncio's, one per client) and writers.
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._context: ssl.SSLContext | None = None
        self._context_generation = 0

    @property
    def broker(self) -> KafkaBroker:
        return self._broker

    @property
    def guard(self) -> SecurityGuard | None:
        return self._broker.guard

    async def start(self) -> None:
        tls: ssl.SSLContext | None = None
        if self._security.tls is not None:
            # Made now, so bad files fail the start, not the first client.
            tls = self._ssl_context()
            # Each handshake takes the context of the files as they are now
            # (rotated certificates reach new connections without a restart).
            tls.sni_callback = self._select_context
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, reuse_address=True,
            limit=limits.KAFKA_MAX_REQUEST_BYTES, ssl=tls,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if tls is not None else None)
        log.info("Kafka listener on %s:%d (%s)", self._host, self._port,
                 "TLS" if self._security.tls is not None else "PLAIN TEXT")

    def _ssl_context(self) -> ssl.SSLContext:
        files = self._security.tls
        if files is None:
            raise InvariantViolation("the Kafka listener made a TLS context without TLS files")
        material = files.current()
        if self._context is None or material.generation != self._context_generation:
            config = files.config
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            if self._context is not None:
                context.sni_callback = self._select_context
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(str(config.cert_file), str(config.key_file))
            if config.ca_file is not None and config.verifies_client_certificates:
                context.load_verify_locations(cafile=str(config.ca_file))
                # Asked for, verified when given; a client without one
                # authenticates with SASL (or is refused when it cannot).
                context.verify_mode = (ssl.CERT_REQUIRED
                                       if not self._security.sasl_oauthbearer
                                       and config.client_auth == "required"
                                       else ssl.CERT_OPTIONAL)
            self._context = context
            self._context_generation = material.generation
        return self._context

    def _select_context(self, connection: ssl.SSLObject, _server_name: str | None,
                        _context: ssl.SSLContext) -> None:
        connection.context = self._ssl_context()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None:
            writer.close()
            return
        if len(self._connections) >= limits.KAFKA_MAX_CONNECTIONS:
            metrics.CONNECTIONS_REFUSED.labels("limit").inc()
            writer.close()
            return
        self._connections[task] = writer
        metrics.CONNECTIONS.inc()
        try:
            await self._serve(reader, writer)
        finally:
            metrics.CONNECTIONS.dec()
            self._connections.pop(task, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        session = Session(host=str(peer[0]), port=int(peer[1]),
                          sasl_allowed=self._security.sasl_oauthbearer)
        sasl = False
        if self._security.tls is not None:
            # The server's TLS: asyncio completed the handshake before this
            # runs (a failed one never gets here).
            session.tls = True
            try:
                session.principal = self._certificate_principal(writer)
            except AuthenticationError as exc:
                metrics.AUTHENTICATION_FAILURES.labels("ssl").inc()
                log.warning("Kafka connection from %s:%d: its client certificate names no "
                            "principal: %s", session.host, session.port, exc.message)
                writer.transport.abort()
                return
            # No certificate: the connection must authenticate with SASL.
            sasl = session.principal is None
            if sasl and not self._security.sasl_oauthbearer:
                metrics.CONNECTIONS_REFUSED.labels("tls").inc()
                writer.transport.abort()
                return
        elif self._security.anonymous:
            session.principal = ANONYMOUS
        else:
            sasl = True
        await Connection(self._broker, reader, writer, session, sasl=sasl).run()

    def _certificate_principal(self, writer: asyncio.StreamWriter) -> str | None:
        """The principal of the client's certificate, None without one;
        AuthenticationError when it maps to none."""
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return None
        if self.guard is None:
            return ANONYMOUS
        return self.guard.principal_of_certificate(ssl.DER_cert_to_PEM_cert(der).encode())

    async def close(self) -> None:
        """Stops accepting, and ends every connection (their transports are
        closed, so their loops end by themselves: asyncio's own tasks are
        not cancelled under it)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for writer in list(self._connections.values()):
            writer.transport.abort()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=limits.SHUTDOWN_GRACE_MS / 1000)
        with contextlib.suppress(Exception):
            await server.wait_closed()
