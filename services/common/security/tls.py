"""TLS for the services, with gRPC's own TLS: the credentials a service
serves with, and those of its own calls to the other services.

The certificate, key and CA files are read again when they change (their
modification time or size), checked at most every `reload_interval_ms`, so
that a certificate rotated in place (cert-manager renewing a Secret mounted
as files) is used without a restart:

* the server hands gRPC a certificate-configuration fetcher, which gRPC
  calls before each new connection's handshake; it answers with the new
  files once they changed, so new connections get the new certificate while
  the connections already open keep theirs;
* the services' outgoing channels (rpc/channels.py's ChannelPool) are made
  with the files as they are when the channel is made; after a change, new channels
  use the new files (ChannelPool replaces its channels).

A certificate and key that do not belong together (a rotation caught
between writing the one and the other) are not taken: the previous pair
stays in use, a WARNING says why, and the files are read again at the next
check.

gRPC's Python server cannot ask for a client certificate without requiring
one (`require_client_auth=False` does not ask at all), so `requested` and
`required` both verify a client certificate at the handshake; `none` asks
for none (the callers authenticate with bearer tokens). A service can serve
both at once: its main port asks for certificates (the services' own calls,
clients with certificates) and its token listener (--token-listen) asks for
none (clients with bearer tokens only), as a Kafka broker has an SSL and a
SASL_SSL listener. docs/security.md says what that means for clients.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

log = logging.getLogger("oncelog.tls")

CLIENT_AUTH_CHOICES = ("required", "requested", "none")
DEFAULT_CLIENT_AUTH = "requested"
DEFAULT_RELOAD_INTERVAL_MS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """Which files a service serves TLS with, and how it treats client certificates."""

    cert_file: Path
    key_file: Path
    # Verifies client certificates, and the peers' server certificates on
    # the service's own calls (None: the system's roots for those).
    ca_file: Path | None = None
    client_auth: str = DEFAULT_CLIENT_AUTH
    reload_interval_ms: int = DEFAULT_RELOAD_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH_CHOICES:
            raise ValueError(f"client auth {self.client_auth!r}; expected one of "
                             f"{', '.join(CLIENT_AUTH_CHOICES)}")
        if self.reload_interval_ms < 0:
            raise ValueError(f"TLS reload interval is {self.reload_interval_ms} ms; "
                             "it must be >= 0")
        if self.verifies_client_certificates and self.ca_file is None:
            raise ValueError(f"--tls-client-auth {self.client_auth} verifies client "
                             "certificates and needs the CA that signs them (--tls-ca-file)")

    @property
    def verifies_client_certificates(self) -> bool:
        return self.client_auth != "none"


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The files' contents at one moment; `generation` grows with each change."""

    certificate_chain: bytes
    private_key: bytes
    root_certificates: bytes | None
    generation: int
    # The serving certificate's serial number, for the log.
    serial_number: int


class TlsError(ValueError):
    """TLS files that cannot be used: missing, unreadable, or not a matching
    certificate and key."""


_Signature = tuple[tuple[int, int], ...]


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc


def _check_pair(cert_pem: bytes, key_pem: bytes, config: TlsConfig) -> int:
    """The certificate's serial number, when the first certificate of the
    chain and the key belong together; TlsError otherwise."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsError(f"{config.cert_file} holds no PEM certificate: {exc}") from exc
    try:
        key = load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"{config.key_file} holds no unencrypted PEM private key: {exc}") from exc
    spki = (Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    if certificate.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise TlsError(f"the key in {config.key_file} does not belong to the certificate in "
                       f"{config.cert_file}")
    return int(certificate.serial_number)


class TlsFiles:
    """The files of a TlsConfig, read again when they change. Safe to use
    from gRPC's threads (the server's fetcher runs there)."""

    def __init__(self, config: TlsConfig, *,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._material = self._load(generation=1)
        self._checked_s = clock_s()

    def _paths(self) -> list[Path]:
        paths = [self.config.cert_file, self.config.key_file]
        if self.config.ca_file is not None:
            paths.append(self.config.ca_file)
        return paths

    def _stat(self) -> _Signature:
        out = []
        for path in self._paths():
            try:
                st = os.stat(path)
            except OSError:
                out.append((-1, -1))
                continue
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self, generation: int) -> TlsMaterial:
        cert = _read(self.config.cert_file, "TLS certificate file")
        key = _read(self.config.key_file, "TLS key file")
        ca = (None if self.config.ca_file is None
              else _read(self.config.ca_file, "TLS CA file"))
        if ca is not None:
            try:
                x509.load_pem_x509_certificates(ca)
            except ValueError as exc:
                raise TlsError(f"{self.config.ca_file} holds no PEM certificate: {exc}") from exc
        serial = _check_pair(cert, key, self.config)
        return TlsMaterial(cert, key, ca, generation, serial)

    def current(self) -> TlsMaterial:
        """The files' contents, read again if they changed since the last
        check and that check is at least the reload interval old."""
        with self._lock:
            now_s = self._clock_s()
            if now_s - self._checked_s < self.config.reload_interval_ms / 1000:
                return self._material
            self._checked_s = now_s
            signature = self._stat()
            if signature == self._signature:
                return self._material
            try:
                material = self._load(self._material.generation + 1)
            except TlsError as exc:
                # Keep serving the old pair; the signature is not taken, so
                # the next check reads the files again.
                log.warning("TLS files changed but cannot be used yet (keeping the previous "
                            "certificate): %s", exc)
                return self._material
            self._signature = signature
            self._material = material
            log.info("TLS files changed: using certificate serial %x from %s (new connections)",
                     material.serial_number, self.config.cert_file)
            return material


def _configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.certificate_chain)],
        root_certificates=material.root_certificates)


def server_credentials(files: TlsFiles, *, client_certificates: bool | None = None
                       ) -> grpc.ServerCredentials:
    """Credentials that serve the files, taking changed files for new
    connections. `client_certificates` overrides the configuration's
    --tls-client-auth (False: the token listener, which asks for none)."""
    if client_certificates is None:
        client_certificates = files.config.verifies_client_certificates
    first = files.current()
    served = [first.generation]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before a handshake; must not raise.
        try:
            material = files.current()
        except Exception:  # noqa: BLE001 - logged; the old certificate stays in use
            log.exception("reading the TLS files failed; keeping the previous certificate")
            return None
        if material.generation == served[0]:
            return None
        served[0] = material.generation
        return _configuration(material)

    return grpc.dynamic_ssl_server_credentials(
        # grpc-stubs types the fetcher without its documented None ("no change").
        _configuration(first), fetch,  # type: ignore[arg-type]
        require_client_authentication=client_certificates)


class ClientTls:
    """Credentials for the services' own outgoing calls: the service's
    certificate as its client certificate, its CA to verify the peer."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._cached: tuple[int, grpc.ChannelCredentials] | None = None

    def credentials(self) -> tuple[int, grpc.ChannelCredentials]:
        """(generation of the files, credentials made from them)."""
        material = self._files.current()
        with self._lock:
            if self._cached is None or self._cached[0] != material.generation:
                self._cached = (material.generation, grpc.ssl_channel_credentials(
                    root_certificates=material.root_certificates,
                    private_key=material.private_key,
                    certificate_chain=material.certificate_chain))
            return self._cached
