"""How a client connects to a secured cluster: TLS, client certificates and
bearer tokens (docs/security.md, docs/sdk.md "Connecting to a secured
cluster").

The options are kafka-python's: `security_protocol` PLAINTEXT (the
default), SSL (TLS; with `ssl_certfile` and `ssl_keyfile` also a client
certificate, which is the principal under mutual TLS) or SASL_SSL (TLS and
a bearer token: `sasl_mechanism="OAUTHBEARER"`, the only mechanism, and a
`sasl_oauth_token_provider`, an object whose `.token()` returns the token).
`security_options` checks them once, when the client is made, and every
mistake is a ValueError naming the option: an unknown protocol, a
certificate without its key, a file that does not exist or is not PEM,
TLS files or a token provider given with a protocol that would not use them.

The token travels in each call's metadata as `authorization: Bearer
<token>` (gRPC call credentials, so only over TLS). A JWT is kept until 80 %
of its lifetime has passed (Kafka's sasl.login.refresh.window.factor), then
the provider is asked for a new one; a token that is not a JWT (its expiry
unknown) is asked for at every call. The payload is decoded to read `exp`
and nothing else: the cluster verifies the signature.

Failures that are the connection's and not the cluster's are named here too
(`tls_failure`): a TLS handshake that failed (the cluster's certificate is
not signed by `ssl_cafile`, or the address serves plain text), a token
provider that raised, and a plain-text client at an address that serves TLS
(`speaks_tls`, a TLS handshake of our own to see whether the address
answers it). Each is an AuthenticationFailedError (Kafka's
SslAuthenticationException is one too): retrying the same connection cannot
help, so the client raises it at once instead of retrying until its time
budget runs out.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import grpc

from oncelog.wire.vocabulary import SecurityProtocol

PLAINTEXT = SecurityProtocol.PLAINTEXT.value
SSL = SecurityProtocol.SSL.value
SASL_SSL = SecurityProtocol.SASL_SSL.value
SECURITY_PROTOCOLS = tuple(p.value for p in SecurityProtocol)
OAUTHBEARER = "OAUTHBEARER"
SASL_MECHANISMS = (OAUTHBEARER,)

# A JWT is used until this fraction of its lifetime has passed, then a new
# one is asked for (Kafka's sasl.login.refresh.window.factor default).
TOKEN_REFRESH_WINDOW_FACTOR = 0.8
# How long the check whether an address serves TLS may take.
TLS_PROBE_TIMEOUT_S = 1.0

_PEM_MARKER = b"-----BEGIN "


@runtime_checkable
class TokenProvider(Protocol):
    """kafka-python's AbstractTokenProvider: `token()` returns a bearer
    token (a JWT) for the next connection."""

    def token(self) -> str: ...


class TokenFileProvider:
    """A token provider that reads the token from a file at each `token()`,
    so a file another process keeps fresh (a Kubernetes projected service
    account token, a sidecar) is followed. What the CLI's
    `--sasl-oauth-token-file` and the Spark option `sasl_oauth_token_file`
    use."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def token(self) -> str:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read the token file {str(self.path)!r}: "
                             f"{exc.strerror or exc}") from None
        if not text:
            raise ValueError(f"the token file {str(self.path)!r} is empty")
        return text

    def __repr__(self) -> str:
        return f"TokenFileProvider({str(self.path)!r})"


def jwt_expiry_s(token: str) -> float | None:
    """The `exp` claim (seconds since the epoch) of a JWT, read without
    verifying anything; None when the token is not a JWT or has no `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(decoded)
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return None
    return float(exp)


class BearerToken:
    """The token a client sends, from its provider, kept while it is fresh
    (module docstring). Thread-safe: gRPC asks from its own threads."""

    def __init__(self, provider: TokenProvider, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._provider = provider
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at_s = 0.0

    def current(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is not None and now < self._refresh_at_s:
                return self._token
            token = self._provider.token()
            if not isinstance(token, str) or not token.strip():
                raise ValueError(f"sasl_oauth_token_provider.token() must return a non-empty "
                                 f"str, got {token!r}")
            token = token.strip()
            expiry_s = jwt_expiry_s(token)
            self._token = token
            # Not a JWT, or one already expired (the cluster says so): ask
            # again next time rather than keep it.
            self._refresh_at_s = (
                0.0 if expiry_s is None or expiry_s <= now
                else now + (expiry_s - now) * TOKEN_REFRESH_WINDOW_FACTOR
            )
            return token


class _BearerAuth(grpc.AuthMetadataPlugin):
    """Adds `authorization: Bearer <token>` to every call of a channel."""

    def __init__(self, token: BearerToken) -> None:
        self._token = token

    def __call__(self, context: grpc.AuthMetadataContext,
                 callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            token = self._token.current()
        except Exception as exc:  # the provider is the application's code
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),), None)


@dataclass(slots=True)
class _PemFile:
    """A PEM file an option names, read again when it changes (a rotated
    client certificate is used by the next connection); the last good
    contents stay when it cannot be read for a moment."""

    option: str
    path: str
    data: bytes = b""
    stamp: tuple[float, int] = (0.0, -1)

    def read(self) -> bytes:
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime, stat.st_size)
            if stamp != self.stamp:
                data = Path(self.path).read_bytes()
                if _PEM_MARKER in data:
                    self.data, self.stamp = data, stamp
        except OSError:
            pass
        return self.data


def _pem_file(option: str, value: object) -> _PemFile | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ValueError(f"{option} must be the path of a PEM file, got {value!r}")
    path = os.fspath(value)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{option}: no such file {path!r}") from None
    except OSError as exc:
        raise ValueError(f"{option}: cannot read {path!r}: {exc.strerror or exc}") from None
    if _PEM_MARKER not in data:
        raise ValueError(
            f"{option}: {path!r} is not a PEM file (no '-----BEGIN' line); JKS and PKCS#12 "
            f"stores are not read: convert them to PEM (e.g. `openssl pkcs12 -in store.p12 "
            f"-out store.pem -nodes`)")
    stat = os.stat(path)
    return _PemFile(option, path, data, (stat.st_mtime, stat.st_size))


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """A client's connection security, checked (security_options). Holds
    the files it reads and the token it caches, so one per client."""

    protocol: str = PLAINTEXT
    cafile: _PemFile | None = None
    certfile: _PemFile | None = None
    keyfile: _PemFile | None = None
    token: BearerToken | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.protocol != PLAINTEXT

    def describe(self) -> str:
        """How this client connects, for messages: "SSL, ssl_cafile='ca.pem'"."""
        parts = [f"security_protocol={self.protocol!r}"]
        for pem in (self.cafile, self.certfile):
            if pem is not None:
                parts.append(f"{pem.option}={pem.path!r}")
        return ", ".join(parts)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """The credentials of a new channel (None: plain text); the files
        as they are now."""
        if not self.tls:
            return None
        creds = grpc.ssl_channel_credentials(
            root_certificates=None if self.cafile is None else self.cafile.read(),
            private_key=None if self.keyfile is None else self.keyfile.read(),
            certificate_chain=None if self.certfile is None else self.certfile.read(),
        )
        if self.token is None:
            return creds
        return grpc.composite_channel_credentials(
            creds, grpc.metadata_call_credentials(_BearerAuth(self.token), name="oncelog"))


PLAINTEXT_CONFIG = SecurityConfig()


def security_options(
    *,
    security_protocol: object = PLAINTEXT,
    ssl_cafile: object = None,
    ssl_certfile: object = None,
    ssl_keyfile: object = None,
    sasl_mechanism: object = None,
    sasl_oauth_token_provider: object = None,
) -> SecurityConfig:
    """The security options of a Producer, Consumer or Admin, checked (module
    docstring); a ValueError names the option that is wrong."""
    if not isinstance(security_protocol, str):
        raise ValueError(f"security_protocol must be one of "
                         f"{', '.join(repr(str(p)) for p in SECURITY_PROTOCOLS)}, "
                         f"got {security_protocol!r}")
    protocol = security_protocol.strip().upper()
    if protocol == "SASL_PLAINTEXT":
        raise ValueError(
            "security_protocol='SASL_PLAINTEXT' is not supported: a bearer token travels only "
            "over TLS; use security_protocol='SASL_SSL'")
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"security_protocol must be one of "
                         f"{', '.join(repr(str(p)) for p in SECURITY_PROTOCOLS)}, "
                         f"got {security_protocol!r}")
    files = {"ssl_cafile": ssl_cafile, "ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile}
    given_files = [name for name, value in files.items() if value is not None]
    if protocol == PLAINTEXT and given_files:
        raise ValueError(
            f"{given_files[0]} is set, but security_protocol is 'PLAINTEXT' (no TLS): set "
            f"security_protocol='SSL' (or 'SASL_SSL') to connect with TLS")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        given, missing = (("ssl_certfile", "ssl_keyfile") if ssl_keyfile is None
                          else ("ssl_keyfile", "ssl_certfile"))
        raise ValueError(f"{given} is set without {missing}: a client certificate needs both "
                         f"the certificate (ssl_certfile) and its private key (ssl_keyfile)")
    mechanism: str | None = None
    if sasl_mechanism is not None:
        if not isinstance(sasl_mechanism, str) or sasl_mechanism.strip().upper() not in (
                SASL_MECHANISMS):
            raise ValueError(f"sasl_mechanism must be 'OAUTHBEARER' (the only mechanism: a "
                             f"bearer token) or None, got {sasl_mechanism!r}")
        mechanism = OAUTHBEARER
    if protocol != SASL_SSL:
        for name, value in (("sasl_mechanism", mechanism),
                            ("sasl_oauth_token_provider", sasl_oauth_token_provider)):
            if value is not None:
                raise ValueError(f"{name} is set, but security_protocol is {protocol!r}: a "
                                 f"bearer token is sent with security_protocol='SASL_SSL'")
    elif sasl_oauth_token_provider is None:
        raise ValueError("security_protocol='SASL_SSL' needs sasl_oauth_token_provider: an "
                         "object whose token() returns the bearer token (a JWT)")
    if sasl_oauth_token_provider is not None and not callable(
            getattr(sasl_oauth_token_provider, "token", None)):
        raise ValueError(f"sasl_oauth_token_provider must have a token() method returning the "
                         f"token (kafka-python's AbstractTokenProvider), got "
                         f"{sasl_oauth_token_provider!r}")
    return SecurityConfig(
        protocol=protocol,
        cafile=_pem_file("ssl_cafile", ssl_cafile),
        certfile=_pem_file("ssl_certfile", ssl_certfile),
        keyfile=_pem_file("ssl_keyfile", ssl_keyfile),
        token=(None if sasl_oauth_token_provider is None
               else BearerToken(sasl_oauth_token_provider)),  # type: ignore[arg-type]
    )


# ------------------------------------------------------------ diagnosis

_PLUGIN_FAILED = "getting metadata from plugin failed"


def tls_failure(details: str, security: SecurityConfig | None) -> str | None:
    """What went wrong, in words, when a call's status `details` say that
    the TLS handshake failed or the bearer token could not be had; None for
    any other failure."""
    lowered = details.lower()
    if _PLUGIN_FAILED in lowered:
        cause = details[lowered.index(_PLUGIN_FAILED) + len(_PLUGIN_FAILED):]
        cause = cause.removeprefix(" with error:").strip()
        return f"sasl_oauth_token_provider.token() failed: {cause or 'no reason given'}"
    if "handshake failed" not in lowered and "handshake_failure" not in lowered:
        return None
    how = "" if security is None else f" ({security.describe()})"
    if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
        return (f"TLS handshake failed: the server's certificate is not trusted{how}; is "
                f"ssl_cafile the CA that signed the cluster's certificates?")
    if "wrong_version_number" in lowered or "packet_length_too_long" in lowered:
        return (f"TLS handshake failed: the address does not speak TLS{how}; it may serve "
                f"plain text (security_protocol='PLAINTEXT')")
    if "certificate_required" in lowered or "alert" in lowered:
        return (f"TLS handshake failed: the server refused this client's certificate{how}; "
                f"it may require one signed by its CA (ssl_certfile, ssl_keyfile)")
    return f"TLS handshake failed{how}"


# What a TLS handshake of our own finds at an address (probe_tls).
PROBE_PLAIN = "plain"            # no TLS there (or nothing at all)
PROBE_TLS = "tls"                # TLS, and the server goes on talking after it
PROBE_TLS_CLOSED = "tls closed"  # TLS, then the server closed the connection at once


def probe_tls(address: str, *, timeout_s: float = TLS_PROBE_TIMEOUT_S) -> str:
    """Whether `address` (host:port) serves TLS: a handshake without a
    client certificate, verifying nothing. PROBE_TLS when it completes (or
    the server answers it with a TLS alert) and the server then speaks
    (HTTP/2 begins with the server's SETTINGS frame); PROBE_TLS_CLOSED when
    it completes and the server then closes the connection without a word,
    which is what a gRPC server that requires a client certificate does;
    PROBE_PLAIN otherwise."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock, \
                context.wrap_socket(sock) as tls:
            try:
                return PROBE_TLS if tls.recv(1) else PROBE_TLS_CLOSED
            except TimeoutError:
                return PROBE_TLS
            except ssl.SSLError as exc:
                alert = "ALERT" in str(exc.reason or "").upper()
                return PROBE_TLS_CLOSED if alert else PROBE_TLS
            except OSError:
                return PROBE_TLS_CLOSED
    except ssl.SSLError as exc:
        return PROBE_TLS if "ALERT" in str(exc.reason or "").upper() else PROBE_PLAIN
    except (OSError, ValueError):
        return PROBE_PLAIN


def client_certificate_needed_message(address: str, service: str) -> str:
    return (f"the {service} at {address} closed the connection after the TLS handshake: it "
            f"requires a client certificate signed by the cluster's CA (ssl_certfile and "
            f"ssl_keyfile), which this client does not have; a client with a bearer token "
            f"alone connects to the cluster's token listener (docs/security.md)")


def plaintext_to_tls_message(address: str, service: str) -> str:
    return (f"the {service} at {address} serves TLS, and this client connects in plain text "
            f"(security_protocol='PLAINTEXT'): set security_protocol='SSL' and ssl_cafile to "
            f"the cluster's CA (and ssl_certfile/ssl_keyfile for a client certificate, or "
            f"security_protocol='SASL_SSL' with a token)")
