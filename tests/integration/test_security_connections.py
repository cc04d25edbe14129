"""Connections to a secured cluster that must fail, fail clearly and change
nothing; and certificates rotated under a running cluster.

Goal: a plain-text client at a TLS port, a client that trusts another CA, a
client certificate from another CA, an expired or malformed bearer token:
each call fails (UNAVAILABLE at the handshake; UNAUTHENTICATED with
SASL_AUTHENTICATION_FAILED and a message saying what was wrong for a
token) and nothing is written. A bearer token names the principal of the
call. An ACL deleted while its principal stays connected stops that
principal's next calls on the same connection once the services have read
the change. Certificate rotation: new certificate and key files (a new
serial from the same CA) put over a running store's and coordinator's files
are served to new connections within the reload interval, while a producer
writing over an open connection the whole time sees no failed request, a
new connection works, and a transaction commits through the coordinator
whose certificate changed (its markers go out on channels made with its new
certificate).

Method: one LocalCluster(security=True) for the module; raw stubs over TLS
channels (tests/support/tls.py), Python's `ssl` for the certificate a server
presents; the foreign CA is made here with `cryptography`. Waits are bounded
polls; no assertion depends on timing.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.wire.status import error_from_rpc
from tests.support.polling import wait_until
from tests.support.tls import (
    Principal,
    reissue_service_certificate,
    served_certificate,
    wait_acls_applied,
)

TOPIC = "conn"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("conn") / "cluster", security=True,
                      transaction_state_partitions=1, consumer_offsets_partitions=1) as c, \
            Principal(c, "admin") as admin:
        reply = admin.store.CreateTopics(ps.CreateTopicsRequest(
            topics=[ps.TopicSpec(name=TOPIC, partitions=1)]))
        assert reply.results[0].error.code == 0
        yield c


def _produce_request() -> ps.ProduceRequest:
    batch = encode_batch([(b"k", b"v", None, int(time.time() * 1000))])
    return ps.ProduceRequest(batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=batch)],
                             timeout_ms=10_000)


def _end_offset(cluster: LocalCluster) -> int:
    with Principal(cluster, "admin") as admin:
        [result] = admin.store.ListOffsets(ps.ListOffsetsRequest(partitions=[
            ps.ListOffsetsPartition(topic=TOPIC, partition=0, timestamp_ms=-1)])).results
    assert result.error.code == 0
    return int(result.offset)


def _grant_write(cluster: LocalCluster, principal: str) -> None:
    with Principal(cluster, "admin") as admin:
        reply = admin.store.CreateAcls(ps.CreateAclsRequest(creations=[ps.AclBinding(
            principal=principal, host="*", resource_type="topic", resource_name=TOPIC,
            pattern_type="literal", operation="write", permission="allow")]))
        assert reply.results[0].code == 0
        wait_acls_applied(admin)


def _failure(channel: grpc.Channel) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        ps_grpc.PartitionStoreStub(channel).Produce(_produce_request(), timeout=10)
    return info.value


def _foreign_ca(directory: Path) -> tuple[bytes, bytes, bytes]:
    """Another CA, and a client certificate and key it signed for CN=admin:
    (CA PEM, certificate PEM, key PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone else's CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_plain_text_and_foreign_certificates_fail_at_the_handshake(
        cluster: LocalCluster, tmp_path: Path) -> None:
    before = _end_offset(cluster)
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        assert _failure(channel).code() == grpc.StatusCode.UNAVAILABLE
    foreign_ca, foreign_cert, foreign_key = _foreign_ca(tmp_path)
    admin = cluster.client_config("admin")
    # The client trusts another CA: it refuses the cluster's certificate.
    wrong_ca = grpc.ssl_channel_credentials(
        root_certificates=foreign_ca, private_key=Path(admin["ssl_keyfile"]).read_bytes(),
        certificate_chain=Path(admin["ssl_certfile"]).read_bytes())
    with grpc.secure_channel(cluster.bootstrap, wrong_ca) as channel:
        assert _failure(channel).code() == grpc.StatusCode.UNAVAILABLE
    # A certificate for CN=admin from another CA: the cluster refuses it.
    forged = grpc.ssl_channel_credentials(
        root_certificates=Path(cluster.ca_file).read_bytes(), private_key=foreign_key,
        certificate_chain=foreign_cert)
    with grpc.secure_channel(cluster.bootstrap, forged) as channel:
        assert _failure(channel).code() == grpc.StatusCode.UNAVAILABLE
    # No client certificate at all.
    anonymous = grpc.ssl_channel_credentials(root_certificates=Path(cluster.ca_file).read_bytes())
    with grpc.secure_channel(cluster.bootstrap, anonymous) as channel:
        assert _failure(channel).code() == grpc.StatusCode.UNAVAILABLE
    assert _end_offset(cluster) == before


def _unauthenticated(principal: Principal) -> str:
    with pytest.raises(grpc.RpcError) as info:
        principal.store.Produce(_produce_request(), timeout=10)
    error = error_from_rpc(info.value)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, error
    assert ErrorCode.from_wire(error.code) is ErrorCode.SASL_AUTHENTICATION_FAILED
    return str(error.message)


def test_bad_tokens_are_unauthenticated_and_change_nothing(cluster: LocalCluster) -> None:
    _grant_write(cluster, "User:tok-expired")
    before = _end_offset(cluster)
    expired = cluster.token("tok-expired", ttl_s=-120)
    with Principal(cluster, "carrier", token=expired) as principal:
        assert "expired" in _unauthenticated(principal)
    with Principal(cluster, "carrier", token="not-a-jwt") as principal:
        assert "not a JWT" in _unauthenticated(principal)
    assert _end_offset(cluster) == before


def test_a_bearer_token_names_the_principal(cluster: LocalCluster) -> None:
    before = _end_offset(cluster)
    with Principal(cluster, "carrier", token=cluster.token("tok-bob")) as principal:
        with pytest.raises(grpc.RpcError) as info:
            principal.store.Produce(_produce_request(), timeout=10)
        error = error_from_rpc(info.value)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error.message == "User:tok-bob is not allowed Write on topic 'conn'"
        assert _end_offset(cluster) == before
        _grant_write(cluster, "User:tok-bob")
        [result] = principal.store.Produce(_produce_request(), timeout=10).results
        assert result.error.code == 0
    assert _end_offset(cluster) == before + 1


def test_a_revoked_acl_stops_a_connected_principal(cluster: LocalCluster) -> None:
    _grant_write(cluster, "User:revoked")
    with Principal(cluster, "revoked") as principal:
        [result] = principal.store.Produce(_produce_request(), timeout=10).results
        assert result.error.code == 0
        with Principal(cluster, "admin") as admin:
            deleted = admin.store.DeleteAcls(ps.DeleteAclsRequest(
                filters=[ps.AclBindingFilter(principal="User:revoked")]))
            assert [b.operation for b in deleted.results[0].matching] == ["write"]
            wait_acls_applied(admin)
        before = _end_offset(cluster)
        with pytest.raises(grpc.RpcError) as info:
            principal.store.Produce(_produce_request(), timeout=10)
        error = error_from_rpc(info.value)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ErrorCode.from_wire(error.code) is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert _end_offset(cluster) == before


class _Writer:
    """Produces one record at a time over one open connection, on a thread,
    recording every failed request."""

    def __init__(self, cluster: LocalCluster) -> None:
        self._principal = Principal(cluster, "admin")
        self.written = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rotation-writer")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                [result] = self._principal.store.Produce(_produce_request(), timeout=10).results
                if result.error.code:
                    self.failures.append(str(result.error))
                else:
                    self.written += 1
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code()}: {exc.details()}")
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._principal.close()


def _commit_a_transaction(cluster: LocalCluster, txn_id: str) -> None:
    with Principal(cluster, "admin") as admin:
        init = admin.txn.InitProducerId(tc.InitProducerIdRequest(
            transactional_id=txn_id, transaction_timeout_ms=60_000))
        assert init.error.code == 0
        batch = encode_batch([(b"k", b"txn", None, int(time.time() * 1000))],
                             producer_id=init.producer_id, producer_epoch=init.producer_epoch,
                             base_sequence=0, transactional=True)
        [result] = admin.store.Produce(ps.ProduceRequest(
            batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=batch)],
            timeout_ms=10_000, transactional_id=txn_id, add_partitions_to_txn=True)).results
        assert result.error.code == 0
        ended = admin.txn.EndTxn(tc.EndTxnRequest(
            transactional_id=txn_id, producer_id=init.producer_id,
            producer_epoch=init.producer_epoch, commit=True))
        assert ended.error.code == 0

        def committed() -> bool:
            [txn] = admin.txn.DescribeTransactions(
                tc.DescribeTransactionsRequest(transactional_ids=[txn_id])).transactions
            return txn.state == "CompleteCommit"

        wait_until(f"{txn_id} commits", committed)


def test_rotated_certificates_reach_new_connections_and_no_request_fails(
        cluster: LocalCluster) -> None:
    store, coordinator = cluster.bootstrap, cluster.address("coordinator")
    old_store_serial = served_certificate(cluster, store).serial_number
    writer = _Writer(cluster)
    try:
        wait_until("the writer writes", lambda: writer.written >= 5)
        new_serial = reissue_service_certificate(cluster, "partition_store", 0)
        assert new_serial != old_store_serial
        wait_until("the store serves its new certificate",
                   lambda: served_certificate(cluster, store).serial_number == new_serial)
        written = writer.written
        wait_until("the writer writes on", lambda: writer.written >= written + 5)
        # A new connection, with the new certificate, works.
        with Principal(cluster, "admin") as fresh:
            [result] = fresh.store.Produce(_produce_request(), timeout=10).results
            assert result.error.code == 0

        new_coordinator_serial = reissue_service_certificate(cluster, "coordinator", 0)
        wait_until("the coordinator serves its new certificate",
                   lambda: served_certificate(cluster, coordinator).serial_number
                   == new_coordinator_serial)
        _commit_a_transaction(cluster, "after-rotation")
    finally:
        writer.stop()
    assert writer.failures == []
    assert writer.written > 10
