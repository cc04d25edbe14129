"""The services' security settings, TLS file reloading and denial logging,
without a server.

Goal: the security flags every service takes (and their ONCELOG_*
environment forms) give the settings docs/security.md describes, and a
wrong combination is refused at start-up with a message naming the flag;
TLS files are read again only when they changed and the reload interval
passed, and a certificate and key that do not belong together (a rotation
caught halfway) leave the previous pair in use until the pair matches;
denials are logged at most once a minute per principal, operation and
resource, the next line counting the ones left out; gRPC peer strings give
the client's address; the ACL watcher follows `__acls`, keeps its ACLs
while a new leader's high watermark lags behind what it read, reads the log
again when it no longer reaches that far, and stops at a record it cannot
read without dropping the ACLs in effect.

Method: the real argument parser of the partition store; certificates made
with `cryptography` in a temporary directory; an injected clock for the
reload interval and the log window; pytest's caplog for the log lines; the
real AclWatcher over a list of `__acls` records read the way the store
client reads a partition.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import ClusterLayout
from services.common.rpc.store_client import LogEntry, ReadResult
from services.common.security.acl_records import encode_binding, encode_deletion
from services.common.security.acl_watcher import AclWatcher
from services.common.security.authorizer import (
    AclBinding,
    AuthorizerConfig,
    Decision,
    Operation,
    ResourceType,
    Rule,
)
from services.common.security.guard import DenialLog, peer_host
from services.common.security.operations import Check, Denial
from services.common.security.service_security import settings_from_args
from services.common.security.tls import TlsConfig, TlsError, TlsFiles
from services.partition_store.server import build_parser


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(key: ec.EllipticCurvePrivateKey, common_name: str = "svc") -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))


def _write_pair(directory: Path, stem: str = "svc") -> tuple[Path, Path, int]:
    key = _key()
    certificate = _certificate(key)
    cert_file, key_file = directory / f"{stem}.pem", directory / f"{stem}.key"
    key_file.write_bytes(_pem_key(key))
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file, certificate.serial_number


def _args(*argv: str) -> list[str]:
    return ["--stores", "127.0.0.1:1", "--data-dir", "/nonexistent", *argv]


def test_without_flags_nothing_is_secured() -> None:
    settings = settings_from_args(build_parser().parse_args(_args()))
    assert settings.tls is None
    assert settings.authorizer is None
    assert not settings.authentication.required
    assert settings.acl_refresh_interval_ms == 1000


def test_the_flags_give_the_settings(tmp_path: Path) -> None:
    cert_file, key_file, _ = _write_pair(tmp_path)
    issuer_key = _key().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "issuer.pem").write_bytes(issuer_key)
    (tmp_path / "issuers.json").write_text(json.dumps({"https://idp": "issuer.pem"}))
    settings = settings_from_args(build_parser().parse_args(_args(
        "--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file),
        "--tls-ca-file", str(cert_file), "--tls-client-auth", "required",
        "--ssl-principal-mapping-rules", "RULE:^CN=([^,]+)$/$1/L,DEFAULT",
        "--oauth-issuers", str(tmp_path / "issuers.json"), "--oauth-audience", "oncelog",
        "--authorizer", "acl", "--super-users", "User:admin; User:svc",
        "--allow-everyone-if-no-acl-found", "--acl-refresh-interval-ms", "250",
    )))
    assert settings.tls is not None and settings.tls.client_auth == "required"
    assert settings.authentication.required
    assert settings.authentication.issuers == {"https://idp": issuer_key.decode()}
    assert settings.authentication.audience == "oncelog"
    assert [str(r) for r in settings.authentication.mapping_rules] == [
        "RULE:^CN=([^,]+)$/$1/L", "DEFAULT"]
    assert settings.authorizer is not None
    assert settings.authorizer.super_users == {"User:admin", "User:svc"}
    assert settings.authorizer.allow_everyone_if_no_acl_found
    assert settings.acl_refresh_interval_ms == 250


def test_the_environment_sets_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCELOG_AUTHORIZER", "acl")
    monkeypatch.setenv("ONCELOG_SUPER_USERS", "User:ops")
    monkeypatch.setenv("ONCELOG_ACL_REFRESH_INTERVAL_MS", "300")
    settings = settings_from_args(build_parser().parse_args(_args()))
    assert settings.authorizer is not None and settings.authorizer.super_users == {"User:ops"}
    assert settings.acl_refresh_interval_ms == 300


@pytest.mark.parametrize(("flags", "message"), [
    (["--tls-cert-file", "CERT"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-key-file", "KEY"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-ca-file", "CERT"], "--tls-ca-file without --tls-cert-file"),
    (["--tls-cert-file", "CERT", "--tls-key-file", "KEY"],
     "--tls-client-auth requested verifies client certificates and needs the CA"),
    (["--tls-cert-file", "CERT", "--tls-key-file", "KEY", "--tls-client-auth", "none"],
     "--tls-client-auth none with no --oauth-issuers"),
    (["--ssl-principal-mapping-rules", "RULE:^CN=(/x/,DEFAULT"],
     "--ssl-principal-mapping-rules: "),
    (["--super-users", "admin"], "--super-users: super user 'admin' has no ':'"),
    (["--oauth-issuers", "MISSING"], "--oauth-issuers: cannot read"),
    (["--oauth-leeway-s", "-1"], "--oauth-leeway-s is -1.0"),
    (["--acl-refresh-interval-ms", "0"], "--acl-refresh-interval-ms is 0"),
    (["--token-listen", "127.0.0.1:7001"], "--token-listen serves TLS"),
    (["--tls-cert-file", "CERT", "--tls-key-file", "KEY", "--tls-client-auth", "required",
      "--tls-ca-file", "CERT", "--token-listen", "127.0.0.1:7001"],
     "--token-listen with no --oauth-issuers"),
    (["--token-advertised", "a:1"], "--token-advertised without --token-listen"),
])
def test_wrong_flags_are_refused_naming_the_flag(tmp_path: Path, flags: list[str],
                                                 message: str) -> None:
    cert_file, key_file, _ = _write_pair(tmp_path)
    replaced = [{"CERT": str(cert_file), "KEY": str(key_file),
                 "MISSING": str(tmp_path / "missing.json")}.get(f, f) for f in flags]
    with pytest.raises(ValueError) as info:
        settings_from_args(build_parser().parse_args(_args(*replaced)))
    assert str(info.value).startswith(message), info.value


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_tls_files_are_read_again_when_they_change_after_the_interval(tmp_path: Path) -> None:
    cert_file, key_file, serial = _write_pair(tmp_path)
    clock = Clock()
    files = TlsFiles(TlsConfig(cert_file=cert_file, key_file=key_file, client_auth="none",
                               reload_interval_ms=5000), clock_s=clock)
    first = files.current()
    assert (first.serial_number, first.generation) == (serial, 1)
    _, _, new_serial = _write_pair(tmp_path)
    clock.now_s += 4.9
    assert files.current().serial_number == serial  # checked at most every 5 s
    clock.now_s += 0.2
    changed = files.current()
    assert (changed.serial_number, changed.generation) == (new_serial, 2)
    clock.now_s += 10
    assert files.current() is changed  # unchanged files: the same material


def test_a_key_that_does_not_match_keeps_the_previous_pair(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert_file, key_file, serial = _write_pair(tmp_path)
    clock = Clock()
    files = TlsFiles(TlsConfig(cert_file=cert_file, key_file=key_file, client_auth="none",
                               reload_interval_ms=0), clock_s=clock)
    # A rotation halfway: the new key is there, the new certificate not yet.
    new_key = _key()
    key_file.write_bytes(_pem_key(new_key))
    with caplog.at_level(logging.WARNING, logger="oncelog.tls"):
        assert files.current().serial_number == serial
    assert "does not belong to the certificate" in caplog.text
    certificate = _certificate(new_key)
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    clock.now_s += 1
    assert files.current().serial_number == certificate.serial_number


def test_unusable_files_are_refused_at_start(tmp_path: Path) -> None:
    cert_file, key_file, _ = _write_pair(tmp_path)
    _, other_key, _ = _write_pair(tmp_path, "other")
    with pytest.raises(TlsError, match="does not belong to the certificate"):
        TlsFiles(TlsConfig(cert_file=cert_file, key_file=other_key, client_auth="none"))
    with pytest.raises(TlsError, match="cannot read the TLS key file"):
        TlsFiles(TlsConfig(cert_file=cert_file, key_file=tmp_path / "nope", client_auth="none"))


def _denial(principal: str, topic: str) -> Denial:
    check = Check(Operation.WRITE, ResourceType.TOPIC, topic)
    return Denial(check, Decision(False, Rule.NOT_ALLOWED), principal)


def test_denials_are_logged_once_a_minute_per_principal_and_resource(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = DenialLog(clock_s=clock)
    method = "/oncelog.v1.PartitionStore/Produce"
    with caplog.at_level(logging.WARNING, logger="oncelog.security"):
        for _ in range(3):
            log.denied(_denial("User:alice", "pay"), host="10.0.0.1", method=method)
        log.denied(_denial("User:bob", "pay"), host="10.0.0.1", method=method)
        log.denied(_denial("User:alice", "other"), host="10.0.0.1", method=method)
        clock.now_s += 61
        log.denied(_denial("User:alice", "pay"), host="10.0.0.1", method=method)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert lines[0].startswith("authorization denied: User:alice is not allowed Write on "
                               "topic 'pay' (host 10.0.0.1, "
                               "/oncelog.v1.PartitionStore/Produce, denied (not_allowed))")
    assert "User:bob" in lines[1] and "'other'" in lines[2]
    assert lines[3].endswith("(2 more since the last line, not logged)")


def test_peer_hosts() -> None:
    assert peer_host("ipv4:10.0.0.7:5123") == "10.0.0.7"
    assert peer_host("ipv6:[::1]:5123") == "::1"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"



class ListLog:
    """`__acls` as a list of (key, value) records with a high watermark, read
    as StoreClient.read reads a partition."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.high_watermark = 0

    def append(self, entry: tuple[bytes | None, bytes | None]) -> None:
        self.records.append(entry)
        self.high_watermark = len(self.records)

    async def read(self, topic: str, partition: int, from_offset: int, *,
                   max_bytes: int = 1 << 20) -> ReadResult:
        assert (topic, partition) == ("__acls", 0)
        if from_offset > len(self.records):
            raise ServiceError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {from_offset}")
        entries = [LogEntry(o, k, v, 0) for o, (k, v) in enumerate(self.records)
                   if from_offset <= o < self.high_watermark]
        return ReadResult(entries, max(from_offset, self.high_watermark), self.high_watermark)


def _binding(name: str) -> AclBinding:
    return AclBinding.of(principal=f"User:{name}", resource_type="topic", resource_name="t",
                         operation="write")


def test_the_acl_watcher_follows_the_log_and_keeps_its_acls_through_a_lagging_leader() -> None:
    async def scenario() -> None:
        log = ListLog()
        watcher = AclWatcher(log, config=AuthorizerConfig(), refresh_interval_ms=100)
        assert not watcher.loaded and watcher.applied_offset == -1
        await watcher.refresh()
        assert watcher.loaded and watcher.authorizer.bindings == frozenset()
        log.append(encode_binding(_binding("a")))
        log.append(encode_binding(_binding("b")))
        log.append(encode_deletion(_binding("a")))
        await watcher.refresh()
        assert watcher.authorizer.bindings == {_binding("b")}
        assert watcher.applied_offset == 3
        # A new leader whose high watermark lags: nothing new, nothing lost.
        log.high_watermark = 1
        assert (await watcher.refresh()).bindings == {_binding("b")}
        assert watcher.applied_offset == 3
        log.high_watermark = 3
        # A log that no longer reaches our offset (a wiped single copy): read again.
        log.records = [encode_binding(_binding("c"))]
        log.high_watermark = 1
        assert (await watcher.refresh()).bindings == {_binding("c")}
        assert watcher.applied_offset == 1
        # A record that cannot be read stops the reader; the ACLs stay.
        log.append((b"A[]", b"torn"))
        with pytest.raises(ServiceError) as info:
            await watcher.refresh()
        assert info.value.code is ErrorCode.CORRUPT_MESSAGE
        assert watcher.authorizer.bindings == {_binding("c")}

    asyncio.run(scenario())


def test_token_listener_addresses_come_one_per_process() -> None:
    with pytest.raises(ValueError, match="--token-stores names 1 addresses for 2 processes"):
        ClusterLayout(stores=("a:1", "b:1"), token_stores=("a:2",))
    layout = ClusterLayout(stores=("a:1",), coordinators=("c:1",), token_coordinators=("c:2",))
    assert layout.coordinator_addresses(token=True) == ("c:2",)
    assert layout.coordinator_addresses(token=False) == ("c:1",)
    # A kind without token listeners is named by its main addresses.
    assert layout.group_coordinator_addresses(token=True) == ()
