"""A service process's security, from its flags (rpc/server_base.py's
add_common_arguments): TLS (tls.py), who callers are and what they may do
(guard.py), and the ACLs it decides by (acl_watcher.py). docs/security.md
describes the whole.

`ServiceSecurity.from_args` is called first thing in each service's main:
it checks the flags (a bad one ends the process with a message naming it),
reads the TLS files, and makes the process's own outgoing channels use TLS
(rpc/channels.py's configure_client_tls) before any channel exists.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ..rpc.channels import configure_client_tls
from .acl_watcher import AclWatcher, LogReader
from .authorizer import AuthorizerConfig, check_principal
from .guard import ANONYMOUS, AuthenticationConfig, SecurityGuard, subject_of
from .principals import (
    AuthenticationError,
    check_issuer_keys,
    parse_mapping_rules,
    principal_from_certificate_subject,
)
from .tls import ClientTls, TlsConfig, TlsError, TlsFiles, server_credentials

log = logging.getLogger("oncelog.security")

AUTHORIZER_CHOICES = ("none", "acl")


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's `super.users`: principals separated by semicolons."""
    users = [u.strip() for u in text.split(";") if u.strip()]
    for user in users:
        check_principal(user, what="super user")
    return frozenset(users)


def load_issuers(path: Path) -> dict[str, str]:
    """The token issuers file: `{"<issuer>": "<path to PEM public key>", ...}`
    (a relative key path is relative to the file) -> issuer -> PEM."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not document:
        raise ValueError(f"{path} must hold a JSON object mapping each token issuer to the path "
                         "of its PEM public key")
    issuers: dict[str, str] = {}
    for issuer, key_path in document.items():
        if not isinstance(key_path, str) or not key_path:
            raise ValueError(f"{path}: issuer {issuer!r} maps to {key_path!r}, not a file path")
        key_file = (path.parent / key_path) if not Path(key_path).is_absolute() else Path(key_path)
        try:
            issuers[issuer] = key_file.read_text()
        except OSError as exc:
            raise ValueError(f"{path}: the key of issuer {issuer!r}, {key_file}: "
                             f"{exc.strerror or exc}") from exc
    check_issuer_keys(issuers)
    return issuers


@dataclass(frozen=True, slots=True, kw_only=True)
class SecuritySettings:
    tls: TlsConfig | None = None
    authentication: AuthenticationConfig = field(default_factory=AuthenticationConfig)
    # None: --authorizer none (authenticated callers may do anything).
    authorizer: AuthorizerConfig | None = None
    acl_refresh_interval_ms: int = 1000
    # --token-listen: a second TLS port that asks for no client certificate.
    token_listen: str | None = None


def settings_from_args(args: argparse.Namespace) -> SecuritySettings:
    """The settings the flags give; ValueError naming the flag that is wrong."""
    cert, key = args.tls_cert_file, args.tls_key_file
    if bool(cert) != bool(key):
        raise ValueError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if args.tls_ca_file and not cert:
        raise ValueError("--tls-ca-file without --tls-cert-file: TLS is served only with a "
                         "certificate and key")
    tls = None
    if cert:
        tls = TlsConfig(cert_file=Path(cert), key_file=Path(key),
                        ca_file=Path(args.tls_ca_file) if args.tls_ca_file else None,
                        client_auth=args.tls_client_auth,
                        reload_interval_ms=args.tls_reload_interval_ms)
    try:
        rules = parse_mapping_rules(args.ssl_principal_mapping_rules or None)
    except ValueError as exc:
        raise ValueError(f"--ssl-principal-mapping-rules: {exc}") from exc
    issuers: dict[str, str] = {}
    if args.oauth_issuers:
        try:
            issuers = load_issuers(Path(args.oauth_issuers))
        except ValueError as exc:
            raise ValueError(f"--oauth-issuers: {exc}") from exc
    if args.oauth_leeway_s < 0:
        raise ValueError(f"--oauth-leeway-s is {args.oauth_leeway_s}; it must be >= 0")
    if not args.oauth_sub_claim:
        raise ValueError("--oauth-sub-claim is empty; name the claim that holds the principal")
    if tls is not None and not tls.verifies_client_certificates and not issuers:
        raise ValueError("--tls-client-auth none with no --oauth-issuers: no caller could "
                         "authenticate (no client certificate is asked for, no token trusted)")
    token_listen = args.token_listen or None
    if args.token_advertised and not token_listen:
        raise ValueError("--token-advertised without --token-listen: this service has no "
                         "token listener to advertise")
    if token_listen and tls is None:
        raise ValueError("--token-listen serves TLS: give --tls-cert-file and --tls-key-file")
    if token_listen and not issuers:
        raise ValueError("--token-listen with no --oauth-issuers: its callers present no client "
                         "certificate, and no bearer token would be trusted either")
    try:
        super_users = parse_super_users(args.super_users or "")
    except ValueError as exc:
        raise ValueError(f"--super-users: {exc}") from exc
    if args.acl_refresh_interval_ms < 1:
        raise ValueError(f"--acl-refresh-interval-ms is {args.acl_refresh_interval_ms}; it "
                         "must be >= 1")
    authorizer = None
    if args.authorizer == "acl":
        authorizer = AuthorizerConfig(
            super_users=super_users,
            allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found)
    return SecuritySettings(
        tls=tls,
        authentication=AuthenticationConfig(
            required=tls is not None or bool(issuers), mapping_rules=rules, issuers=issuers,
            audience=args.oauth_audience or None, sub_claim=args.oauth_sub_claim,
            leeway_s=args.oauth_leeway_s),
        authorizer=authorizer,
        acl_refresh_interval_ms=args.acl_refresh_interval_ms,
        token_listen=token_listen,
    )


class ServiceSecurity:
    """One process's TLS files, ACL watcher and guard."""

    def __init__(self, settings: SecuritySettings, service_name: str) -> None:
        self.settings = settings
        self.service_name = service_name
        self.tls_files = TlsFiles(settings.tls) if settings.tls is not None else None
        configure_client_tls(ClientTls(self.tls_files) if self.tls_files is not None else None)
        self.own_principal = self._own_principal()
        self.acls: AclWatcher | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, service_name: str) -> ServiceSecurity:
        """The process's security from its flags; exits naming what is wrong."""
        try:
            return cls(settings_from_args(args), service_name)
        except (ValueError, TlsError) as exc:
            raise SystemExit(f"{service_name}: {exc}") from exc

    def _own_principal(self) -> str | None:
        """The principal this service's own calls to the other services carry:
        its certificate's, `User:ANONYMOUS` in plain text without token
        issuers; None when they carry none the others accept."""
        if self.tls_files is None:
            if not self.settings.authentication.required:
                return ANONYMOUS
            log.warning("%s trusts token issuers but serves plain text: its own calls to the "
                        "other services carry neither a certificate nor a token, and are "
                        "refused as unauthenticated; give it --tls-cert-file/--tls-key-file",
                        self.service_name)
            return None
        material = self.tls_files.current()
        try:
            return principal_from_certificate_subject(
                subject_of(material.certificate_chain),
                self.settings.authentication.mapping_rules)
        except (AuthenticationError, ValueError) as exc:
            log.warning("%s: the principal mapping rules give this service's own certificate "
                        "no principal (%s); its calls to the other services will be refused",
                        self.service_name, exc)
            return None

    def watch_acls(self, reader: LogReader) -> AclWatcher | None:
        """With --authorizer acl, the process's ACL watcher reading `__acls`
        through `reader` (started with the server); None without."""
        if self.settings.authorizer is None:
            return None
        if self.acls is None:
            self.acls = AclWatcher(reader, config=self.settings.authorizer,
                                   refresh_interval_ms=self.settings.acl_refresh_interval_ms)
        return self.acls

    def server_credentials(self) -> grpc.ServerCredentials | None:
        return None if self.tls_files is None else server_credentials(self.tls_files)

    def token_server_credentials(self) -> grpc.ServerCredentials | None:
        """The token listener's: the same certificate, no client certificate asked."""
        if self.tls_files is None or self.settings.token_listen is None:
            return None
        return server_credentials(self.tls_files, client_certificates=False)

    def guard(self) -> SecurityGuard | None:
        """The interceptor, or None when there is nothing to check (plain
        text, no token issuers, no authorizer: everyone may do anything)."""
        authentication = self.settings.authentication
        if not authentication.required and self.settings.authorizer is None:
            return None
        return SecurityGuard(authentication, acls=self.acls, own_principal=self.own_principal)

    def log_startup(self) -> None:
        settings = self.settings
        if settings.tls is None:
            log.warning("%s serves PLAIN TEXT (no --tls-cert-file/--tls-key-file): anyone who "
                        "reaches its port can read and change the traffic and act as any "
                        "client; for local development only", self.service_name)
        else:
            log.info("%s serves TLS with %s (client certificates: %s; files checked for "
                     "changes every %d ms); its own calls use TLS as %s", self.service_name,
                     settings.tls.cert_file, settings.tls.client_auth,
                     settings.tls.reload_interval_ms, self.own_principal or "no principal")
        if settings.authentication.issuers:
            log.info("bearer tokens trusted from %s",
                     ", ".join(sorted(settings.authentication.issuers)))
        if settings.token_listen is not None:
            log.info("%s also serves TLS without client certificates on %s (token listener: "
                     "callers there authenticate with bearer tokens)", self.service_name,
                     settings.token_listen)
        if settings.authorizer is None:
            if settings.authentication.required:
                log.info("no authorizer (--authorizer none): every authenticated caller may "
                         "do anything")
        else:
            log.info("authorizer on: ACLs from __acls, refreshed every %d ms; super users: %s",
                     settings.acl_refresh_interval_ms,
                     ", ".join(sorted(settings.authorizer.super_users)) or "none")

    def start(self) -> None:
        if self.acls is not None:
            self.acls.start()

    async def stop(self) -> None:
        if self.acls is not None:
            await self.acls.stop()
