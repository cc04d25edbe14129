"""Security from the clients' side, on a TLS + ACL cluster.

Goal: the SDK's clients connect to a secured cluster with kafka-python's
options and act as the principal their certificate (or bearer token) names,
with exactly what the ACLs allow:
* Producer, Consumer and Admin with `client_config(name)` produce, consume
  in a group and run transactions; a bearer token from
  `sasl_oauth_token_provider` names the principal (the provider is asked
  once while its token is fresh);
* a client with a bearer token and no certificate (`token_config(name)`)
  does the same through the token listeners, whose Metadata and
  FindCoordinator answers name the token listeners (the main ports'
  answers name the main ports); at a main port it is told that it needs a
  certificate, and a certificate is not asked for at a token listener;
* a wrong CA, a plain-text client at the TLS port, an expired token, a
  client without a certificate at a server that requires one: each a typed
  AuthenticationFailedError that says what is wrong — at once, not after
  the client's time budget (60 s here) — and nothing written; an ACL
  revoked under a connected producer refuses its next record, and nothing
  more is written;
* the Admin's ACL round trip: create (again: no change), describe with
  filters (principal, literal, prefixed, `match`, operation), delete by
  filter and by binding; a principal without Alter/Describe on the cluster
  is refused with ClusterAuthorizationFailedError; a cluster without an
  authorizer answers SecurityDisabledError;
* the whole exactly-once pipeline: the transactional copier
  (examples/copier.py, two processes, one kill -9'd and restarted, every
  third transaction aborted on purpose) as `User:copier`, holding only Read
  on its input topic and group, Write on its output topic and Write on its
  transactional ids (prefixed), copies every record exactly once, in order
  per key; the same principal may not write its input topic. Without the
  transactional-id ACL, the copier stops with
  TransactionalIdAuthorizationFailedError naming its transactional id and
  writes nothing.

Method: one LocalCluster(security=True) for the module (a second, plain one
for SecurityDisabledError; for the certificate a server requires, a gRPC
server of the test's own that requires client certificates, with a CA made
by the test). ACL changes are waited for until every service
reports them applied (tests/support/secure_clients.py). The copier runs as
real processes (tests/support/copier.py's CopierFleet); examples/copier.py
has no security flags, so each process starts through a few lines that
give its Producer and Consumer the principal's `client_config` (the same
keyword arguments an application passes) before running the script
unchanged. The output is read back as the super user.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import ipaddress
import itertools
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from oncelog import (
    AclBinding,
    AclFilter,
    Admin,
    Consumer,
    Producer,
    TopicPartition,
    errors,
)
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as coord_pb
from oncelog.v1 import coordinator_pb2_grpc as coord_grpc
from oncelog.v1 import partition_store_pb2 as ps_pb
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from tests.support.copier import COPIER, KEYS, CopierFleet
from tests.support.secure_clients import (
    admin_of,
    allow,
    end_offsets,
    grant,
    read_committed,
    revoke,
)

PARTITIONS = 2
COPIER_PARTITIONS = 4
COPIER_RECORDS = 3000
# Every call here may take this long before it gives up: an error that
# comes back at once proves the client did not wait it out.
PATIENT_MS = 60_000
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("secured") / "cluster", security=True,
                      consumer_offsets_partitions=2,
                      extra_args={"group_coordinator": ["--min-session-timeout-ms", "500"]}
                      ) as c:
        yield c


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def create_topics(cluster: LocalCluster, *names: str, partitions: int = PARTITIONS) -> None:
    with admin_of(cluster) as admin:
        for name in names:
            admin.create_topic(name, partitions=partitions)


class Tokens:
    """A token provider (kafka-python's interface) that counts its calls."""

    def __init__(self, token: str) -> None:
        self._token = token
        self.calls = 0

    def token(self) -> str:
        self.calls += 1
        return self._token


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey,
                 issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
                 ) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(name if issuer is None else issuer[0])
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=1)))
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                        critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(key if issuer is None else issuer[1], hashes.SHA256())


def foreign_ca(path: Path) -> Path:
    """A CA certificate that signed nothing of the cluster's."""
    cert = _certificate("somebody else's CA", ec.generate_private_key(ec.SECP256R1()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


# ------------------------------------------------------------ the clients

def transact_consume_and_commit(cluster: LocalCluster, bootstrap: str, config: Any, *,
                                topic: str, group: str, txn_id: str,
                                earlier: list[bytes]) -> None:
    """As the principal of `config`, at `bootstrap`: a transaction of ten
    records committed and one of five aborted, then the topic read in
    `group` and its offsets committed. The group reads `earlier` (what the
    topic held before) and the ten, and its offsets end past the last marker."""
    with Producer(bootstrap=bootstrap, transactional_id=txn_id, **config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, key=b"k", value=f"committed-{i}".encode())
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, key=b"k", value=f"aborted-{i}".encode())
        producer.abort_transaction()
    expected = sorted(earlier + [f"committed-{i}".encode() for i in range(10)])
    seen: list[bytes] = []
    with Consumer(bootstrap=bootstrap, group_id=group, **config) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(seen) < len(expected):
            assert time.monotonic() < deadline, f"read only {seen}"
            seen += [r.value for r in consumer.poll(timeout=0.5)]
        consumer.commit()
    assert sorted(seen) == expected
    with admin_of(cluster) as admin:
        committed = admin.list_group_offsets(group)
    assert sum(o.offset for o in committed.values()) == sum(
        end_offsets(cluster, topic, PARTITIONS, "read_committed").values())


def test_certificate_principals_produce_consume_and_transact(cluster: LocalCluster) -> None:
    topic, group, txn_id = unique("alice-pay"), unique("alice-g"), unique("alice-tx")
    create_topics(cluster, topic)
    grant(cluster, [*allow("User:alice", "topic", topic, "write", "read"),
                    *allow("User:alice", "group", group, "read"),
                    *allow("User:alice", "transactional_id", txn_id, "write")])
    alice = cluster.client_config("alice")

    with Producer(bootstrap=cluster.bootstrap, **alice) as producer:
        plain = [producer.send(topic, value=f"plain-{i}".encode()) for i in range(5)]
        assert all(f.result(timeout=60).offset >= 0 for f in plain)
    transact_consume_and_commit(cluster, cluster.bootstrap, alice, topic=topic, group=group,
                                txn_id=txn_id,
                                earlier=[f"plain-{i}".encode() for i in range(5)])


def test_a_bearer_token_names_the_principal(cluster: LocalCluster) -> None:
    topic = unique("token-pay")
    create_topics(cluster, topic)
    grant(cluster, allow("User:token-writer", "topic", topic, "write"))
    # The connection carries a certificate of a principal with no ACLs (the
    # cluster verifies client certificates); the token says who calls.
    carrier = cluster.client_config("token-carrier")
    provider = Tokens(cluster.token("token-writer"))
    with Producer(bootstrap=cluster.bootstrap, security_protocol="SASL_SSL",
                  ssl_cafile=carrier["ssl_cafile"], ssl_certfile=carrier["ssl_certfile"],
                  ssl_keyfile=carrier["ssl_keyfile"], sasl_mechanism="OAUTHBEARER",
                  sasl_oauth_token_provider=provider, enable_idempotence=False,
                  acks=1) as producer:
        for i in range(20):
            producer.send(topic, value=f"v{i}".encode()).result(timeout=60)
    assert provider.calls == 1, "a fresh token is kept, not asked for at every call"
    with Producer(bootstrap=cluster.bootstrap, **carrier, enable_idempotence=False,
                  acks=1) as producer, \
            pytest.raises(errors.TopicAuthorizationFailedError, match=topic):
        producer.send(topic, value=b"x").result(timeout=60)
    assert sum(end_offsets(cluster, topic, PARTITIONS).values()) == 20


def test_a_client_with_only_a_token_works_through_the_token_listener(
    cluster: LocalCluster
) -> None:
    """No client certificate, a bearer token alone: at the token listener
    the client produces in a transaction and consumes in a group, reaching
    the coordinators through the token-listener addresses it is told. At
    the main port, which requires a certificate, it is told so at once."""
    topic, group, txn_id = unique("bob-pay"), unique("bob-g"), unique("bob-tx")
    create_topics(cluster, topic)
    grant(cluster, [*allow("User:bob", "topic", topic, "write", "read"),
                    *allow("User:bob", "group", group, "read"),
                    *allow("User:bob", "transactional_id", txn_id, "write")])
    bob = cluster.token_config("bob")
    assert "ssl_certfile" not in bob
    transact_consume_and_commit(cluster, cluster.token_bootstrap, bob, topic=topic, group=group,
                                txn_id=txn_id, earlier=[])

    with Admin(bootstrap=cluster.bootstrap, default_api_timeout_ms=PATIENT_MS, **bob) as admin, \
            pytest.raises(errors.AuthenticationFailedError, match="token listener"):
        admin.list_topics()


def test_a_certificate_is_not_asked_for_at_the_token_listener(cluster: LocalCluster) -> None:
    """The token listener asks for no client certificate, so a client that
    has only one presents nothing there and is refused as unauthenticated:
    the listener admits no one anonymously."""
    topic = unique("cert-at-token")
    create_topics(cluster, topic)
    with Admin(bootstrap=cluster.token_bootstrap, default_api_timeout_ms=PATIENT_MS,
               **cluster.client_config("admin")) as admin, \
            pytest.raises(errors.AuthenticationFailedError, match="neither a verified client"):
        admin.describe_topic(topic)


def test_each_listener_answers_with_its_own_addresses(cluster: LocalCluster) -> None:
    """Metadata and FindCoordinator name the token listeners to a caller at a
    token listener and the main ports to a caller with a certificate, as a
    Kafka broker answers with the addresses of the listener a request came
    in on."""
    ca = Path(cluster.ca_file).read_bytes()
    token_metadata: tuple[tuple[str, str | bytes], ...] = (
        ("authorization", f"Bearer {cluster.token('admin')}"),)
    admin_files = cluster.client_config("admin")
    with_certificate = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=Path(admin_files["ssl_keyfile"]).read_bytes(),
        certificate_chain=Path(admin_files["ssl_certfile"]).read_bytes())
    cases = [
        (cluster.token_bootstrap, grpc.ssl_channel_credentials(root_certificates=ca),
         token_metadata, "token_address"),
        (cluster.bootstrap, with_certificate, (), "address"),
    ]
    stores, coordinators, groups = (cluster.processes[kind] for kind in (
        "partition_store", "coordinator", "group_coordinator"))
    for store_address, credentials, metadata, field in cases:
        with grpc.secure_channel(store_address, credentials) as channel:
            answer = ps_grpc.PartitionStoreStub(channel).Metadata(
                ps_pb.MetadataRequest(), metadata=metadata, timeout=30)
        assert [n.address for n in answer.stores] == [getattr(p, field) for p in stores]
        assert [n.address for n in answer.coordinators] == [
            getattr(p, field) for p in coordinators]
        assert [n.address for n in answer.group_coordinators] == [
            getattr(p, field) for p in groups]
        coordinator_address = (coordinators[0].token_address if field == "token_address"
                               else coordinators[0].address)
        with grpc.secure_channel(coordinator_address, credentials) as channel:
            stub = coord_grpc.TransactionCoordinatorStub(channel)
            for kind, processes in ((coord_pb.TRANSACTION, coordinators),
                                    (coord_pb.GROUP, groups)):
                found = stub.FindCoordinator(coord_pb.FindCoordinatorRequest(
                    key="some-id", type=kind), metadata=metadata, timeout=30)
                assert found.address == getattr(processes[found.node_id], field)


@dataclass(frozen=True)
class BadConnection:
    name: str
    says: str


BAD_CONNECTIONS = [
    BadConnection("wrong CA", "TLS handshake failed: the server's certificate is not trusted"),
    BadConnection("plain text", "serves TLS, and this client connects in plain text"),
    BadConnection("expired token", "expired"),
]


def bad_options(case: BadConnection, cluster: LocalCluster, tmp_path: Path) -> dict[str, Any]:
    admin_files = cluster.client_config("admin")
    if case.name == "wrong CA":
        return {**admin_files, "ssl_cafile": str(foreign_ca(tmp_path / "other-ca.pem"))}
    if case.name == "plain text":
        return {}
    return {**admin_files, "security_protocol": "SASL_SSL",
            "sasl_oauth_token_provider": Tokens(cluster.token("admin", ttl_s=-120))}


@pytest.mark.parametrize("case", BAD_CONNECTIONS, ids=lambda c: c.name)
def test_a_bad_connection_fails_at_once_with_what_is_wrong_and_writes_nothing(
    cluster: LocalCluster, tmp_path: Path, case: BadConnection
) -> None:
    topic = unique("guarded")
    create_topics(cluster, topic)
    before = end_offsets(cluster, topic, PARTITIONS)
    options = bad_options(case, cluster, tmp_path)

    with Producer(bootstrap=cluster.bootstrap, max_block_ms=PATIENT_MS,
                  delivery_timeout_ms=PATIENT_MS, request_timeout_ms=PATIENT_MS,
                  **options) as producer:
        future = producer.send(topic, value=b"must not land", partition=0)
        with pytest.raises(errors.AuthenticationFailedError, match=case.says):
            future.result(timeout=PATIENT_MS / 1000 / 2)
    with Admin(bootstrap=cluster.bootstrap, default_api_timeout_ms=PATIENT_MS,
               request_timeout_ms=PATIENT_MS, **options) as admin, \
            pytest.raises(errors.AuthenticationFailedError, match=case.says):
        admin.create_topic(unique("never"), partitions=1)
    with Consumer(bootstrap=cluster.bootstrap, default_api_timeout_ms=PATIENT_MS,
                  request_timeout_ms=PATIENT_MS, **options) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(errors.AuthenticationFailedError, match=case.says):
            consumer.poll(timeout=PATIENT_MS / 1000 / 2)

    assert end_offsets(cluster, topic, PARTITIONS) == before
    with admin_of(cluster) as admin:
        assert not [t for t in admin.list_topics() if t.startswith("never-")]


def test_a_client_without_a_certificate_where_one_is_required_is_told_so(
    tmp_path: Path
) -> None:
    """A server that requires client certificates closes the connection of
    a client without one right after the handshake; the client says so at
    once instead of retrying until its budget runs out."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca = _certificate("test CA", ca_key)
    server_cert = _certificate("server", server_key, issuer=(ca.subject, ca_key))
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pem = serialization.Encoding.PEM
    credentials = grpc.ssl_server_credentials(
        [(server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()),
          server_cert.public_bytes(pem))],
        root_certificates=ca.public_bytes(pem), require_client_auth=True)
    # No service at all: the handshake is the transport's, before any call.
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        with Admin(bootstrap=f"127.0.0.1:{port}", default_api_timeout_ms=PATIENT_MS,
                   security_protocol="SASL_SSL", ssl_cafile=str(ca_file),
                   sasl_oauth_token_provider=Tokens("a-token")) as admin, \
                pytest.raises(errors.AuthenticationFailedError,
                              match="requires a client certificate signed by the cluster's CA"):
            admin.list_topics()
    finally:
        server.stop(None)


def test_a_revoked_acl_refuses_the_next_record_of_a_connected_producer(
    cluster: LocalCluster
) -> None:
    topic = unique("revoked")
    create_topics(cluster, topic)
    bindings = allow("User:revokee", "topic", topic, "write")
    grant(cluster, bindings)
    with Producer(bootstrap=cluster.bootstrap, **cluster.client_config("revokee"),
                  enable_idempotence=False, acks=1) as producer:
        producer.send(topic, value=b"before", partition=0).result(timeout=60)
        assert revoke(cluster, bindings) == bindings
        with pytest.raises(errors.TopicAuthorizationFailedError, match=topic):
            producer.send(topic, value=b"after", partition=0).result(timeout=60)
    assert end_offsets(cluster, topic, PARTITIONS)[TopicPartition(topic, 0)] == 1


# ------------------------------------------------------------ the Admin's ACLs

def test_the_admin_creates_describes_and_deletes_acls(cluster: LocalCluster) -> None:
    n = next(_ids)
    alice, bob = f"User:rt{n}-alice", f"User:rt{n}-bob"
    pay, prefix, group = f"rt{n}-payments", f"rt{n}-", f"rt{n}-ledger"
    literal_read = AclBinding(principal=alice, resource_type="topic", resource_name=pay,
                              operation="read")
    prefixed_write = AclBinding(principal=alice, resource_type="topic", resource_name=prefix,
                                pattern_type="prefixed", operation="write")
    group_read = AclBinding(principal=alice, resource_type="group", resource_name=group,
                            operation="read")
    bob_denied = AclBinding(principal=bob, resource_type="topic", resource_name=pay,
                            operation="read", permission="deny", host="10.0.0.7")
    mine = [literal_read, prefixed_write, group_read, bob_denied]

    with admin_of(cluster) as admin:
        admin.create_acls(mine)
        admin.create_acls([literal_read])  # again: nothing changes

        def described(**fields: Any) -> list[AclBinding]:
            return [b for b in admin.describe_acls(AclFilter(**fields))
                    if b.principal in (alice, bob)]

        assert sorted(described(), key=str) == sorted(mine, key=str)
        assert set(described(principal=alice)) == {literal_read, prefixed_write, group_read}
        assert described(resource_type="topic", resource_name=pay,
                         pattern_type="literal") == sorted([literal_read, bob_denied],
                                                           key=lambda b: b.principal)
        assert described(resource_type="topic", resource_name=prefix,
                         pattern_type="prefixed") == [prefixed_write]
        # `match`: every binding that applies to a topic of that name.
        assert set(described(resource_type="topic", resource_name=pay,
                             pattern_type="match")) == {literal_read, prefixed_write,
                                                        bob_denied}
        assert described(operation="write") == [prefixed_write]
        assert described(permission="deny", host="10.0.0.7") == [bob_denied]
        assert admin.describe_acls(literal_read) == [literal_read]

        # Who may not administer ACLs is told so, and changes nothing.
        grant(cluster, allow(alice, "topic", pay, "describe"))
        with Admin(bootstrap=cluster.bootstrap,
                   **cluster.client_config(alice.removeprefix("User:"))) as as_alice:
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                as_alice.create_acls([AclBinding(principal=alice, resource_type="cluster",
                                                 resource_name="oncelog-cluster",
                                                 operation="alter")])
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                as_alice.describe_acls()
        assert not described(resource_type="cluster")

        assert admin.delete_acls([AclFilter(principal=bob)]) == [bob_denied]
        assert admin.delete_acls([group_read, AclFilter(principal=alice, operation="write")]
                                 ) == [group_read, prefixed_write]
        assert admin.delete_acls([AclFilter(principal=bob)]) == []
        assert set(described()) == {literal_read, AclBinding(
            principal=alice, resource_type="topic", resource_name=pay, operation="describe")}
        admin.delete_acls([AclFilter(principal=alice)])
        assert described() == []


def test_acls_on_a_cluster_without_an_authorizer_are_refused(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "plain", group_coordinators=0) as plain, \
            Admin(bootstrap=plain.bootstrap) as admin:
        with pytest.raises(errors.SecurityDisabledError):
            admin.describe_acls()
        binding = AclBinding(principal="User:alice", resource_type="topic",
                             resource_name="payments", operation="read")
        with pytest.raises(errors.SecurityDisabledError, match="without an authorizer"):
            admin.create_acls([binding])


# ------------------------------------------------------------ the copier

# Starts examples/copier.py unchanged, with its Producer and Consumer given
# the principal's keyword arguments (the script has no security flags).
@dataclass
class SecureCopierFleet(CopierFleet):
    """Copier processes that connect as the principal whose client
    properties file (Kafka's --command-config) is `command_config`."""

    command_config: Path | None = None

    def start(self, instance: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.log_dir / f"copier-{instance}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[instance] = subprocess.Popen(
            [sys.executable, str(COPIER), "--command-config", str(self.command_config),
             "--bootstrap", self.bootstrap,
             "--input", self.input_topic, "--output", self.output_topic,
             "--group", self.group, "--instance", str(instance),
             "--transactional-id-prefix", f"{self.group}-tx", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()


def copier_acls(principal: str, names: tuple[str, str, str]) -> list[AclBinding]:
    """Exactly what a copier needs: Read on its input and its group, Write
    on its output and on its transactional ids (each implies Describe)."""
    source, sink, group = names
    return [*allow(principal, "topic", source, "read"),
            *allow(principal, "group", group, "read"),
            *allow(principal, "topic", sink, "write"),
            *allow(principal, "transactional_id", f"{group}-tx", "write",
                   pattern_type="prefixed")]


def command_config(cluster: LocalCluster, name: str, directory: Path) -> Path:
    """A client properties file for `name`'s certificate (what an operator
    hands a copier with --command-config)."""
    config = cluster.client_config(name)
    path = directory / f"{name}.properties"
    path.write_text(f"security.protocol={config['security_protocol']}\n"
                    f"ssl.cafile={config['ssl_cafile']}\n"
                    f"ssl.certfile={config['ssl_certfile']}\n"
                    f"ssl.keyfile={config['ssl_keyfile']}\n")
    return path


def copier_setup(cluster: LocalCluster, tmp_path: Path, records: int
                 ) -> tuple[tuple[str, str, str], SecureCopierFleet]:
    n = next(_ids)
    names = (f"copy-in-{n}", f"copy-out-{n}", f"copier-{n}")
    create_topics(cluster, names[0], names[1], partitions=COPIER_PARTITIONS)
    per_key: Counter[str] = Counter()
    with Producer(bootstrap=cluster.bootstrap, **cluster.client_config("admin")) as producer:
        for i in range(records):
            key = f"k{i % KEYS}"
            producer.send(names[0], key=key.encode(), value=f"{key}:{per_key[key]}".encode())
            per_key[key] += 1
        producer.flush()
    fleet = SecureCopierFleet(
        bootstrap=cluster.bootstrap, input_topic=names[0], output_topic=names[1],
        group=names[2], log_dir=tmp_path / "copiers",
        extra_args=["--session-timeout-ms", "3000", "--max-poll-records", "200"],
        command_config=command_config(cluster, "copier", tmp_path),
    )
    return names, fleet


def wait_copied(cluster: LocalCluster, fleet: SecureCopierFleet, timeout_s: float) -> None:
    """Until the group's committed offsets reach the input's end."""
    want = end_offsets(cluster, fleet.input_topic, COPIER_PARTITIONS, "read_committed")
    deadline = time.monotonic() + timeout_s
    with admin_of(cluster) as admin:
        while True:
            fleet.restart_exited()
            got = {tp: o.offset for tp, o in admin.list_group_offsets(fleet.group).items()}
            if got == want:
                return
            assert time.monotonic() < deadline, (
                f"copiers did not finish: committed {got}, want {want}\n{fleet.log_tail()}")
            time.sleep(0.5)


def assert_copied_exactly_once(cluster: LocalCluster, names: tuple[str, str, str]) -> int:
    """Every input record is in the output once (read_committed), upper-cased,
    in input order per key; the number of records checked."""
    inputs = read_committed(cluster, names[0], COPIER_PARTITIONS)
    outputs = read_committed(cluster, names[1], COPIER_PARTITIONS)
    sources = Counter(dict(r.headers or ()).get("src") for r in outputs)
    want = {f"{r.topic}:{r.partition}:{r.offset}".encode(): r for r in inputs}
    assert not [s for s, count in sources.items() if count > 1], "copied more than once"
    assert set(sources) == set(want), "records lost or made up"
    per_key: dict[bytes, list[tuple[int, int, int]]] = defaultdict(list)
    for r in outputs:
        source = want[dict(r.headers or ()).get("src") or b""]
        assert (r.key, r.value) == (source.key, (source.value or b"").upper())
        per_key[r.key or b""].append((r.partition, r.offset,
                                      int((r.value or b"").decode().rsplit(":", 1)[1])))
    for key, items in per_key.items():
        order = [count for _p, _o, count in sorted(items)]
        assert order == sorted(order), f"key {key!r} out of order"
    return len(outputs)


def test_the_copier_is_exactly_once_as_a_least_privilege_principal(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    names, fleet = copier_setup(cluster, tmp_path, COPIER_RECORDS)
    needed = copier_acls("User:copier", names)
    grant(cluster, needed)
    with admin_of(cluster) as admin:
        assert sorted(admin.describe_acls(AclFilter(principal="User:copier")), key=str) == \
            sorted(needed, key=str), "the copier holds these ACLs and nothing else"

    fleet.extra_args += ["--abort-every", "3"]
    fleet.start(0)
    fleet.start(1)
    try:
        with admin_of(cluster) as admin:
            deadline = time.monotonic() + 120
            while not admin.list_group_offsets(fleet.group):
                assert time.monotonic() < deadline, fleet.log_tail()
                time.sleep(0.2)
        fleet.kill(0)  # mid-stream: its successor fences it by transactional id
        fleet.start(0)
        wait_copied(cluster, fleet, timeout_s=240)
    finally:
        fleet.stop_all()
    assert assert_copied_exactly_once(cluster, names) == COPIER_RECORDS
    logs = fleet.log_tail(200)
    assert "AuthorizationFailed" not in logs and "AuthenticationFailed" not in logs, logs

    # Least privilege: the same principal may not write its input.
    with Producer(bootstrap=cluster.bootstrap, **cluster.client_config("copier"),
                  enable_idempotence=False, acks=1) as producer, \
            pytest.raises(errors.TopicAuthorizationFailedError, match=names[0]):
        producer.send(names[0], value=b"x").result(timeout=60)
    revoke(cluster, needed)


def test_a_copier_without_its_transactional_id_acl_stops_with_the_named_error(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    names, fleet = copier_setup(cluster, tmp_path, 200)
    needed = copier_acls("User:copier", names)
    missing = needed[-1]
    assert missing.resource_type == "transactional_id"
    grant(cluster, needed[:-1])
    fleet.start(0)
    try:
        assert fleet.procs[0].wait(timeout=120) != 0
    finally:
        fleet.stop_all()
    log = fleet.log_tail(200)
    assert "TransactionalIdAuthorizationFailedError" in log, log
    assert f"{names[2]}-tx-0" in log, log
    assert sum(end_offsets(cluster, names[1], COPIER_PARTITIONS).values()) == 0
    with admin_of(cluster) as admin:
        assert admin.list_group_offsets(names[2]) == {}
    revoke(cluster, needed[:-1])



def test_a_producer_made_before_its_acl_says_to_make_a_new_one(cluster: LocalCluster) -> None:
    """A producer whose producer id is refused is fatal, as in Kafka, and its
    message says what to do; after the ACL lands a new producer works."""
    name = unique("late")
    topic = unique("late-topic")
    create_topics(cluster, topic, partitions=1)
    config = cluster.client_config(name)
    # It may see the topic, not yet write it (nor IdempotentWrite the cluster).
    grant(cluster, allow(f"User:{name}", "topic", topic, "describe"))
    with Producer(bootstrap=cluster.bootstrap, max_block_ms=PATIENT_MS, **config) as early:
        with pytest.raises(errors.ClusterAuthorizationFailedError) as refused:
            early.send(topic, value=b"too early").result()
        message = str(refused.value)
        assert "create a new one" in message and "within about a second" in message, message
        grant(cluster, allow(f"User:{name}", "topic", topic, "write"))
        # Still refused: the refusal ended this producer.
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            early.send(topic, value=b"after the acl").result()
    with Producer(bootstrap=cluster.bootstrap, **config) as late:
        late.send(topic, value=b"made after the acl").result()
    assert [r.value for r in read_committed(cluster, topic, 1)] == [b"made after the acl"]
