"""Raw gRPC over TLS to a secured LocalCluster (security=True), as a named
principal, and the certificates such tests replace.

`Principal(cluster, "alice")` holds one TLS channel per service with the
client certificate of `User:alice` (LocalCluster.client_config makes it) and
raw stubs on them; `Principal(cluster, "alice", token=...)` sends a bearer
token in every call's metadata too (the token then names the principal).
`wait_acls_applied` waits until every process of the cluster has read
`__acls` to its end, read from the processes' own metrics (the ACLs reach
each service within its refresh interval). `served_certificate` makes a TLS
handshake with Python's `ssl` and returns the certificate the server
presented; `reissue_service_certificate` writes a new certificate for a
service from the cluster's CA over its files (LocalCluster's docstring
names them).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.parser import text_string_to_metric_families

from oncelog.testing import KINDS, SECURITY_DIR, SERVICE_COMMON_NAME, LocalCluster
from oncelog.v1 import coordinator_pb2_grpc as tc_grpc
from oncelog.v1 import group_coordinator_pb2_grpc as gc_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.v1 import records_pb2
from tests.support.polling import wait_until

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]


def credentials(cluster: LocalCluster, name: str, *, token: str | None = None,
                ca_file: str | None = None) -> grpc.ChannelCredentials:
    """TLS with `User:<name>`'s client certificate (and a bearer token in
    every call's metadata, when given), verifying the server with the
    cluster's CA or `ca_file`."""
    config = cluster.client_config(name)
    tls = grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file or config["ssl_cafile"]).read_bytes(),
        private_key=Path(config["ssl_keyfile"]).read_bytes(),
        certificate_chain=Path(config["ssl_certfile"]).read_bytes())
    if token is None:
        return tls
    return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(token))


@dataclass
class Principal:
    """Raw stubs of every service of a secured cluster, as one principal."""

    cluster: LocalCluster
    name: str
    token: str | None = None
    ca_file: str | None = None
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        creds = credentials(self.cluster, self.name, token=self.token, ca_file=self.ca_file)
        self.channels = {kind: grpc.secure_channel(self.cluster.address(kind), creds,
                                                   options=CHANNEL_OPTIONS)
                         for kind in KINDS}
        self.store = ps_grpc.PartitionStoreStub(self.channels["partition_store"])
        self.txn = tc_grpc.TransactionCoordinatorStub(self.channels["coordinator"])
        self.groups = gc_grpc.GroupCoordinatorStub(self.channels["group_coordinator"])

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    def __enter__(self) -> Principal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _gauge(cluster: LocalCluster, kind: str, index: int, name: str) -> float | None:
    with urllib.request.urlopen(cluster.metrics_url(kind, index), timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def acls_end_offset(admin: Principal) -> int:
    """The end of `__acls`, asked of the store that leads it."""
    cluster = admin.cluster

    def ask() -> int:
        index = 0
        if len(cluster.processes["partition_store"]) > 1:
            state = cluster.partition_states(["__acls"]).get(("__acls", 0))
            assert state is not None and state.leader >= 0, f"__acls has no leader: {state}"
            index = state.leader
        with grpc.secure_channel(cluster.address("partition_store", index),
                                 credentials(cluster, admin.name)) as channel:
            [result] = ps_grpc.PartitionStoreStub(channel).ListOffsets(ps.ListOffsetsRequest(
                partitions=[ps.ListOffsetsPartition(topic="__acls", partition=0,
                                                    timestamp_ms=-1)],
                isolation_level=records_pb2.READ_COMMITTED), timeout=10).results
        assert result.error.code == 0, result.error
        return int(result.offset)

    found: list[int] = []

    def answered() -> bool:
        try:
            found.append(ask())
        except (AssertionError, grpc.RpcError):
            return False
        return True

    wait_until("the leader of __acls answers ListOffsets", answered)
    return found[-1]


def wait_acls_applied(admin: Principal) -> None:
    """Waits until every running service has read `__acls` up to its end as
    it is now (each service's `oncelog_acl_applied_offset`)."""
    cluster = admin.cluster
    end = acls_end_offset(admin)
    for kind in KINDS:
        for proc in cluster.processes[kind]:
            if not proc.alive():
                continue

            def applied(kind: str = kind, index: int = proc.node_id) -> bool:
                value = _gauge(cluster, kind, index, "oncelog_acl_applied_offset")
                return value is not None and value >= end

            wait_until(f"{kind} {proc.node_id} reads __acls up to offset {end}", applied)


def served_certificate(cluster: LocalCluster, address: str,
                       name: str = "admin") -> x509.Certificate:
    """The certificate a service presents to a new connection, from a TLS
    handshake of Python's own (as `User:<name>`, with the cluster's CA)."""
    config = cluster.client_config(name)
    context = ssl.create_default_context(cafile=config["ssl_cafile"])
    context.load_cert_chain(config["ssl_certfile"], config["ssl_keyfile"])
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def reissue_service_certificate(cluster: LocalCluster, kind: str, index: int) -> int:
    """A new key and certificate (a new serial, validity starting now) for
    one service, signed by the cluster's CA and written over its files the
    way a rotation does: each file replaced whole, the key first. Returns
    the new certificate's serial number."""
    directory = cluster.data_dir / SECURITY_DIR
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_COMMON_NAME)]))
        .issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    stem = directory / "services" / f"{kind}-{index}"
    for path, data in (
        (stem.with_suffix(".key"), key.private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())),
        (stem.with_suffix(".pem"), certificate.public_bytes(serialization.Encoding.PEM)),
    ):
        part = path.with_name(path.name + ".new")
        part.write_bytes(data)
        part.replace(path)
    return int(certificate.serial_number)
