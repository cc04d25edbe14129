"""The certificate authority, certificates and bearer-token issuer of a
secured LocalCluster (`LocalCluster(security=True)`), as files in one
directory of its data dir, made on first use and kept for the next run.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

# A secured cluster (security=True): what its services are started with.
SECURITY_DIR = "security"
SERVICE_COMMON_NAME = "oncelog-service"
SUPER_USERS = ("User:admin", f"User:{SERVICE_COMMON_NAME}")
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
TOKEN_ISSUER = "oncelog-local"
# Characters a client name may not have: it becomes a certificate's CN,
# which the mapping rule above reads up to the first comma.
_NAME_FORBIDDEN = set(',+="\\<>;#/')


class LocalTokenProvider:
    """A fresh bearer token for one principal whenever the client asks
    (the SDK asks again once 80 % of a token's lifetime has passed)."""

    def __init__(self, pki: LocalPki, name: str, ttl_s: float) -> None:
        self._pki = pki
        self._name = name
        self._ttl_s = ttl_s

    def token(self) -> str:
        return self._pki.token(self._name, self._ttl_s)


class LocalPki:
    """The certificate authority, certificates and token issuer of a secured
    LocalCluster, as files in one directory (made on first use, kept after).
    Uses `cryptography` and PyJWT, which the server extra installs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        (directory / "services").mkdir(parents=True, exist_ok=True)
        (directory / "clients").mkdir(exist_ok=True)
        self.ca_file = directory / "ca.pem"
        self.ca_key_file = directory / "ca.key"
        self.issuer_key_file = directory / "issuer.key"
        self.issuer_public_file = directory / "issuer.pub.pem"
        self.issuers_file = directory / "oauth-issuers.json"
        with self._lock:
            if not (self.ca_file.exists() and self.ca_key_file.exists()):
                self._make_ca()
            if not (self.issuer_key_file.exists() and self.issuer_public_file.exists()
                    and self.issuers_file.exists()):
                self._make_issuer()

    @staticmethod
    def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
        """Writes a file whole (a reader never sees half of it)."""
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as out:
            if secret:
                os.fchmod(out.fileno(), 0o600)
            out.write(data)
        os.replace(part, path)

    @staticmethod
    def _new_key() -> Any:
        from cryptography.hazmat.primitives.asymmetric import ec

        return ec.generate_private_key(ec.SECP256R1())

    @staticmethod
    def _key_pem(key: Any) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))

    def _make_ca(self) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        key = self._new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oncelog LocalCluster CA")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        self._write(self.ca_key_file, self._key_pem(key), secret=True)
        self._write(self.ca_file, certificate.public_bytes(serialization.Encoding.PEM))

    def _make_issuer(self) -> None:
        import json

        from cryptography.hazmat.primitives import serialization

        key = self._new_key()
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        self._write(self.issuer_key_file, self._key_pem(key), secret=True)
        self._write(self.issuer_public_file, public)
        self._write(self.issuers_file, json.dumps(
            {TOKEN_ISSUER: str(self.issuer_public_file)}).encode())

    def issue(self, common_name: str, cert_file: Path, key_file: Path, *, server: bool,
              valid_days: int = 825) -> None:
        """A new key and a certificate for `CN=<common_name>` signed by the
        CA, written over `cert_file` and `key_file`; a server certificate
        names 127.0.0.1, ::1 and localhost and serves clients too."""
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = serialization.load_pem_private_key(self.ca_key_file.read_bytes(), None)
        ca = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        key = self._new_key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca.public_key()), critical=False)  # type: ignore[arg-type]
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
                x509.DNSName("localhost"),
            ]), critical=False)
        certificate = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        # The key first: a reader that sees the new certificate finds its key.
        self._write(key_file, self._key_pem(key), secret=True)
        self._write(cert_file, certificate.public_bytes(serialization.Encoding.PEM))

    def _files(self, folder: str, name: str, *, server: bool) -> tuple[Path, Path]:
        cert_file = self.directory / folder / f"{name}.pem"
        key_file = self.directory / folder / f"{name}.key"
        with self._lock:
            if not (cert_file.exists() and key_file.exists()):
                self.issue(SERVICE_COMMON_NAME if server else name, cert_file, key_file,
                           server=server)
        return cert_file, key_file

    def service_files(self, kind: str, node_id: int) -> tuple[Path, Path]:
        return self._files("services", f"{kind}-{node_id}", server=True)

    def client_files(self, name: str) -> tuple[Path, Path]:
        if not isinstance(name, str) or not name or name != name.strip() or (
                set(name) & _NAME_FORBIDDEN):
            raise ValueError(f"client name {name!r} cannot be a certificate's common name "
                             f"here: use a non-empty name without spaces at its ends and "
                             f"without any of {''.join(sorted(_NAME_FORBIDDEN))}")
        return self._files("clients", name, server=False)

    def token(self, name: str, ttl_s: float) -> str:
        import jwt

        if not isinstance(name, str) or not name:
            raise ValueError(f"token subject {name!r}: expected a non-empty name")
        now = int(time.time())
        claims = {"iss": TOKEN_ISSUER, "sub": name, "iat": now, "exp": now + int(ttl_s)}
        return jwt.encode(claims, self.issuer_key_file.read_bytes(), algorithm="ES256")
