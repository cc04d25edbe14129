"""The certificate authority, certificates and bearer-token issuer of a
secured LocalCluster (`LocalCluster(security=True)`), as files in one
directory of its data dir, made on first use and kept for the next run;
and what the cluster hands out from them: its services' security flags,
the SDK's keyword arguments for a client, and the admin credentials of the
cluster's own calls. Kept apart from cluster.py, which only passes these on,
so that what "secured" means for a local cluster reads in one place.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

import grpc

from oncelog._security import TokenProvider

# A secured cluster (security=True): what its services are started with.
SECURITY_DIR = "security"
SERVICE_COMMON_NAME = "oncelog-service"
SUPER_USERS = ("User:admin", f"User:{SERVICE_COMMON_NAME}")
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
TOKEN_ISSUER = "oncelog-local"
# How often a secured cluster's services re-read ACLs and TLS files.
SECURE_ACL_REFRESH_INTERVAL_MS = 200
SECURE_TLS_RELOAD_INTERVAL_MS = 1000
# Characters a client name may not have: it becomes a certificate's CN,
# which the mapping rule above reads up to the first comma.
_NAME_FORBIDDEN = set(',+="\\<>;#/')


class ClientSecurityConfig(TypedDict):
    """LocalCluster.client_config's answer: the SDK's keyword arguments for
    TLS with a client certificate (typed, so that `**config` is checked
    against Producer's, Consumer's and Admin's parameters)."""

    security_protocol: str
    ssl_cafile: str
    ssl_certfile: str
    ssl_keyfile: str


class TokenSecurityConfig(TypedDict):
    """LocalCluster.token_config's answer: the SDK's keyword arguments for
    TLS without a client certificate and a bearer token."""

    security_protocol: str
    ssl_cafile: str
    sasl_mechanism: str
    sasl_oauth_token_provider: TokenProvider


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
    LocalCluster, as files in one directory (made on first use, kept after),
    and the flags and client settings made from them. Uses `cryptography`
    and PyJWT, which the server extra installs."""

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
        # The admin's TLS credentials, read once (admin_credentials).
        self._admin_credentials: grpc.ChannelCredentials | None = None
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

    def service_args(self, kind: str, node_id: int, token_address: str) -> list[str]:
        """A service's security flags: TLS with its certificate and client
        certificates verified, principals from the certificate's CN, tokens
        of this issuer trusted on its token listener (`token_address`), the
        ACL authorizer with the super users."""
        cert_file, key_file = self.service_files(kind, node_id)
        return [
            "--token-listen", token_address,
            "--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file),
            "--tls-ca-file", str(self.ca_file), "--tls-client-auth", "requested",
            "--tls-reload-interval-ms", str(SECURE_TLS_RELOAD_INTERVAL_MS),
            "--ssl-principal-mapping-rules", PRINCIPAL_MAPPING_RULES,
            "--oauth-issuers", str(self.issuers_file),
            "--authorizer", "acl", "--super-users", ";".join(SUPER_USERS),
            "--acl-refresh-interval-ms", str(SECURE_ACL_REFRESH_INTERVAL_MS),
        ]

    def client_config(self, name: str) -> ClientSecurityConfig:
        """The SDK's keyword arguments for `User:<name>` over TLS with a
        client certificate (made on first use)."""
        cert_file, key_file = self.client_files(name)
        return {"security_protocol": "SSL", "ssl_cafile": str(self.ca_file),
                "ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file)}

    def token_config(self, name: str, ttl_s: float) -> TokenSecurityConfig:
        """The SDK's keyword arguments for `User:<name>` with a bearer token
        (a fresh one, valid `ttl_s`, whenever the client asks) and no client
        certificate."""
        return {"security_protocol": "SASL_SSL", "ssl_cafile": str(self.ca_file),
                "sasl_mechanism": "OAUTHBEARER",
                "sasl_oauth_token_provider": LocalTokenProvider(self, name, ttl_s)}

    def admin_credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials of `User:admin` (a super user), for the cluster's
        own health checks and Metadata polls; read once, as every channel of
        the cluster uses them."""
        if self._admin_credentials is None:
            cert_file, key_file = self.client_files("admin")
            self._admin_credentials = grpc.ssl_channel_credentials(
                root_certificates=self.ca_file.read_bytes(),
                private_key=key_file.read_bytes(), certificate_chain=cert_file.read_bytes())
        return self._admin_credentials
