"""The Kafka listener of a secured cluster: TLS, who a client is, what it may do.

Goal: a Kafka client is held to the same rules on the Kafka port as on the
gRPC port. On a secured cluster (TLS, principals, ACLs) the listener serves
TLS only (a plain-text client gets nowhere); a librdkafka client with a
client certificate is the certificate's principal, one without a
certificate authenticates with SASL/OAUTHBEARER and a JWT of the cluster's
issuer (an expired token is refused); and each is allowed exactly what its
ACLs allow: `alice` may write `payments` but not read it, `bob` may read it
(with his group) but not write, and nobody may touch a topic no ACL names.

Method: one LocalCluster(security=True, kafka_listener=True); ACLs made by
the admin through our SDK; confluent-kafka (librdkafka) clients configured
as their users configure them (security.protocol SSL or SASL_SSL,
sasl.mechanism OAUTHBEARER with an oauth_cb). Refusals are read from the
clients' own errors; every allowed read is checked against what was
written. The ACLs reach the stores within their refresh interval (200 ms
here), long before the first client connects (librdkafka retries a
refused delivery within its message timeout in any case).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest

from oncelog import AclBinding, Admin
from oncelog.testing import LocalCluster

TOPIC = "payments"
OTHER = "secret"
# Failure guards, not expectations.
DEADLINE_S = 30.0
REFUSED_WITHIN_S = 8.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-secure") / "cluster", security=True,
                      kafka_listener=True) as c:
        with Admin(bootstrap=c.bootstrap, **c.client_config("admin")) as admin:
            admin.create_topic(TOPIC, partitions=1)
            admin.create_topic(OTHER, partitions=1)
            allow = [("User:alice", "topic", TOPIC, "write"),
                     ("User:bob", "topic", TOPIC, "read"),
                     ("User:bob", "group", "bob-group", "read")]
            admin.create_acls([AclBinding(principal=p, resource_type=t, resource_name=n,
                                          pattern_type="literal", operation=o,
                                          permission="allow")
                               for p, t, n, o in allow])
        yield c


def certificate_config(cluster: LocalCluster, name: str) -> dict[str, Any]:
    files = cluster.client_config(name)
    return {"bootstrap.servers": cluster.kafka_bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": files["ssl_cafile"],
            "ssl.certificate.location": files["ssl_certfile"],
            "ssl.key.location": files["ssl_keyfile"]}


def token_config(cluster: LocalCluster, name: str, ttl_s: float = 300) -> dict[str, Any]:
    def oauth_cb(_config: str) -> tuple[str, float]:
        return cluster.token(name, ttl_s), time.time() + max(ttl_s, 1)

    return {"bootstrap.servers": cluster.kafka_bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb,
            "ssl.ca.location": cluster.ca_file}


def produce(config: dict[str, Any], topic: str, value: bytes, *,
            timeout_s: float = DEADLINE_S) -> ck.KafkaError | None:
    """The delivery error of one record (None: delivered)."""
    producer = ck.Producer({**config, "message.timeout.ms": int(timeout_s * 1000)})
    outcome: list[ck.KafkaError | None] = []
    producer.produce(topic, value=value, on_delivery=lambda error, _m: outcome.append(error))
    producer.flush(timeout_s + 5)
    assert outcome, "the delivery report never came"
    return outcome[0]


def read(config: dict[str, Any], topic: str, group: str,
         timeout_s: float = REFUSED_WITHIN_S) -> tuple[list[bytes], ck.KafkaError | None]:
    """What a consumer reads from the start of the topic's partition 0, and
    the first error it meets."""
    consumer = ck.Consumer({**config, "group.id": group, "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if values:
                    break
                continue
            if message.error() is not None:
                return values, message.error()
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values, None


def test_a_certificate_names_the_principal_and_its_acls_decide(cluster: LocalCluster) -> None:
    alice = certificate_config(cluster, "alice")
    assert produce({**alice, "enable.idempotence": True}, TOPIC, b"from-alice") is None
    refused = produce(alice, OTHER, b"not-allowed", timeout_s=REFUSED_WITHIN_S)
    assert refused is not None and refused.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    _values, error = read(alice, TOPIC, "alice-group")
    assert error is not None
    assert error.code() in (ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                            ck.KafkaError.GROUP_AUTHORIZATION_FAILED)


def test_a_bearer_token_names_the_principal_and_its_acls_decide(cluster: LocalCluster) -> None:
    assert produce(certificate_config(cluster, "alice"), TOPIC, b"for-bob") is None
    bob = token_config(cluster, "bob")
    values, error = read(bob, TOPIC, "bob-group", timeout_s=DEADLINE_S)
    assert error is None
    assert b"for-bob" in values
    refused = produce(bob, TOPIC, b"bob-may-not-write", timeout_s=REFUSED_WITHIN_S)
    assert refused is not None and refused.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_an_expired_token_is_refused(cluster: LocalCluster) -> None:
    expired = token_config(cluster, "alice", ttl_s=-60)
    refused = produce(expired, TOPIC, b"never", timeout_s=REFUSED_WITHIN_S)
    assert refused is not None


def test_plain_text_is_refused(cluster: LocalCluster) -> None:
    refused = produce({"bootstrap.servers": cluster.kafka_bootstrap}, TOPIC, b"never",
                      timeout_s=REFUSED_WITHIN_S)
    assert refused is not None and refused.code() == ck.KafkaError._MSG_TIMED_OUT
