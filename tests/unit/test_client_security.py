"""The clients' security options, token cache and ACL values, without a cluster.

Goal: every mistake in the security options of Producer, Consumer and Admin
(kafka-python's names) fails at construction with a ValueError naming the
option — an unknown protocol, a certificate without its key, a file that is
missing or not PEM, TLS files or a token provider that the protocol would
not use, SASL_SSL without a token provider; a bearer token that is a JWT is
kept until 80 % of its lifetime has passed and then asked for again, one
that is not (or has expired) is asked for at every use; the failures of a
TLS handshake and of a token provider read as what they are; AclBinding
and AclFilter take Kafka's spellings, keep the wire's, and refuse a binding
that cannot mean anything with a message saying why.

Method: clients constructed against an address nothing listens on (options
are checked before any connection), PEM files written to tmp_path, a token
provider of the test's own and a hand-driven clock for the cache, and the
status texts gRPC gives for handshake and plugin failures (as seen from
grpcio 1.85) fed to the diagnosis.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from oncelog import AclBinding, AclFilter, Admin, Consumer, Producer
from oncelog._security import (
    BearerToken,
    TokenFileProvider,
    jwt_expiry_s,
    security_options,
    tls_failure,
)

NOWHERE = "127.0.0.1:1"
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_bytes(PEM)
    return path


class Tokens:
    """A token provider that hands out the tokens it is given, in turn."""

    def __init__(self, *tokens: str) -> None:
        self.tokens = list(tokens)
        self.calls = 0

    def token(self) -> str:
        self.calls += 1
        return self.tokens[min(self.calls, len(self.tokens)) - 1]


def jwt(claims: dict[str, Any]) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'ES256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


@pytest.mark.parametrize("client", [Producer, Consumer, Admin])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"security_protocol": "TLS"},
         r"^security_protocol must be one of 'PLAINTEXT', 'SSL', 'SASL_SSL', got 'TLS'"),
        ({"security_protocol": "SASL_PLAINTEXT"}, "a bearer token travels only over TLS"),
        ({"security_protocol": 1}, "^security_protocol must be one of"),
        ({"security_protocol": "SSL", "ssl_certfile": "PEM"},
         "^ssl_certfile is set without ssl_keyfile"),
        ({"security_protocol": "SSL", "ssl_keyfile": "PEM"},
         "^ssl_keyfile is set without ssl_certfile"),
        ({"ssl_cafile": "PEM"}, "^ssl_cafile is set, but security_protocol is 'PLAINTEXT'"),
        ({"security_protocol": "SSL", "ssl_cafile": "MISSING"}, "^ssl_cafile: no such file"),
        ({"security_protocol": "SSL", "ssl_cafile": "NOT_PEM"},
         "^ssl_cafile: .* is not a PEM file .* JKS and PKCS#12"),
        ({"security_protocol": "SASL_SSL"}, "^security_protocol='SASL_SSL' needs "
                                            "sasl_oauth_token_provider"),
        ({"security_protocol": "SSL", "sasl_oauth_token_provider": Tokens("t")},
         "^sasl_oauth_token_provider is set, but security_protocol is 'SSL'"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
          "sasl_oauth_token_provider": Tokens("t")}, "^sasl_mechanism must be 'OAUTHBEARER'"),
        ({"security_protocol": "SASL_SSL", "sasl_oauth_token_provider": "a token"},
         "^sasl_oauth_token_provider must have a token\\(\\) method"),
    ],
)
def test_a_bad_security_option_is_named_at_construction(
    client: Any, options: dict[str, Any], message: str, pem: Path, tmp_path: Path
) -> None:
    not_pem = tmp_path / "truststore.jks"
    not_pem.write_bytes(b"\xfe\xed\xfe\xed binary")
    files = {"PEM": str(pem), "MISSING": str(tmp_path / "nope.pem"), "NOT_PEM": str(not_pem)}
    resolved = {k: files.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ValueError, match=message):
        client(bootstrap=NOWHERE, **resolved)


def test_good_security_options_are_accepted_in_any_case(pem: Path) -> None:
    with Admin(bootstrap=NOWHERE, security_protocol="ssl", ssl_cafile=pem,
               ssl_certfile=str(pem), ssl_keyfile=str(pem)):
        pass
    with Producer(bootstrap=NOWHERE, security_protocol="SASL_SSL", sasl_mechanism="oauthbearer",
                  sasl_oauth_token_provider=Tokens("t")):
        pass
    config = security_options(security_protocol="SSL")
    assert config.tls and config.channel_credentials() is not None
    assert security_options().channel_credentials() is None


def test_a_jwt_is_kept_for_80_percent_of_its_lifetime() -> None:
    now = [1_000.0]
    first, second = jwt({"sub": "alice", "exp": 1_100}), jwt({"sub": "alice", "exp": 1_300})
    provider = Tokens(first, second)
    cache = BearerToken(provider, clock=lambda: now[0])
    assert cache.current() == first
    now[0] = 1_079.0
    assert cache.current() == first and provider.calls == 1
    now[0] = 1_080.0
    assert cache.current() == second and provider.calls == 2
    now[0] = 1_250.0
    assert cache.current() == second and provider.calls == 2


@pytest.mark.parametrize("token", ["opaque-token", jwt({"sub": "a"}), jwt({"exp": 900})])
def test_a_token_without_a_future_expiry_is_asked_for_every_time(token: str) -> None:
    provider = Tokens(token)
    cache = BearerToken(provider, clock=lambda: 1_000.0)
    for _ in range(3):
        assert cache.current() == token
    assert provider.calls == 3


def test_a_provider_must_return_a_token() -> None:
    with pytest.raises(ValueError, match=r"token\(\) must return a non-empty str, got ''"):
        BearerToken(Tokens("")).current()


def test_jwt_expiry_reads_exp_only() -> None:
    assert jwt_expiry_s(jwt({"exp": 1234})) == 1234.0
    assert jwt_expiry_s(jwt({"exp": "soon"})) is None
    assert jwt_expiry_s(jwt({"exp": True})) is None
    assert jwt_expiry_s("a.b") is None
    assert jwt_expiry_s("a.!!!.c") is None


def test_a_token_file_is_read_at_each_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    provider = TokenFileProvider(path)
    with pytest.raises(ValueError, match="cannot read the token file"):
        provider.token()
    path.write_text("first\n")
    assert provider.token() == "first"
    path.write_text("second")
    assert provider.token() == "second"
    path.write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        provider.token()


@pytest.mark.parametrize(
    ("details", "said"),
    [
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls "
         "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
         "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer",
         "the server's certificate is not trusted"),
        ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls "
         "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
         "routines:OPENSSL_internal:WRONG_VERSION_NUMBER", "does not speak TLS"),
        ("Getting metadata from plugin failed with error: the token file '/t' is empty",
         r"sasl_oauth_token_provider.token\(\) failed: the token file '/t' is empty"),
    ],
)
def test_handshake_and_token_failures_are_named(details: str, said: str) -> None:
    found = tls_failure(details, security_options(security_protocol="SSL"))
    assert found is not None
    assert re.search(said, found), found


def test_other_transport_failures_are_not_tls_failures() -> None:
    for details in ("failed to connect to all addresses; last error: UNAVAILABLE: "
                    "ipv4:127.0.0.1:1: Connection refused", "Socket closed", ""):
        assert tls_failure(details, None) is None


# ------------------------------------------------------------------ ACL values

def test_acl_bindings_take_kafkas_spellings_and_keep_the_wires() -> None:
    binding = AclBinding(principal="User:copier", resource_type="TransactionalId",
                         resource_name="copier-tx", pattern_type="PREFIXED",
                         operation="Write", permission="ALLOW")
    assert (binding.resource_type, binding.pattern_type, binding.operation,
            binding.permission, binding.host) == (
        "transactional_id", "prefixed", "write", "allow", "*")
    assert str(binding) == ("ALLOW User:copier Write on transactional_id prefixed "
                            "'copier-tx' from host *")
    cluster = AclBinding(principal="User:ops", resource_type="cluster",
                         resource_name="oncelog-cluster", operation="ClusterAction")
    assert cluster.operation == "cluster_action"
    assert AclBinding(principal="User:a", resource_type="topic", resource_name="t",
                      operation="read") == AclBinding(
        principal="User:a", resource_type="TOPIC", resource_name="t", operation="READ",
        pattern_type="literal", permission="allow", host="*")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"principal": "alice"}, "principal must be 'Type:name'"),
        ({"principal": "User:"}, "has an empty name"),
        ({"resource_type": "queue"}, "resource_type must be one of topic, group, "
                                     "transactional_id, cluster"),
        ({"operation": "cluster_action"}, "operation ClusterAction does not apply to a topic; "
                                          "a topic has All, Read, Write"),
        ({"operation": "fly"}, "operation must be one of"),
        ({"pattern_type": "match"}, "pattern_type must be one of literal, prefixed"),
        ({"permission": "maybe"}, "permission must be one of allow, deny"),
        ({"resource_name": ""}, "resource_name must be a non-empty str"),
        ({"host": ""}, "host must be a non-empty str"),
        ({"resource_type": "cluster", "resource_name": "prod", "operation": "alter"},
         "the cluster resource is the literal name 'oncelog-cluster'"),
    ],
)
def test_a_binding_that_cannot_mean_anything_is_refused(
    fields: dict[str, str], message: str
) -> None:
    base = {"principal": "User:a", "resource_type": "topic", "resource_name": "t",
            "operation": "read"}
    with pytest.raises(ValueError, match=message):
        AclBinding(**{**base, **fields})


def test_filters() -> None:
    assert AclFilter().pattern_type == "any"
    f = AclFilter(resource_type="Group", resource_name="g", pattern_type="MATCH",
                  operation="Read")
    assert (f.resource_type, f.pattern_type, f.operation) == ("group", "match", "read")
    with pytest.raises(ValueError, match="does not apply to a group, so the filter would "
                                         "match nothing"):
        AclFilter(resource_type="group", operation="write")
    binding = AclBinding(principal="User:a", resource_type="topic", resource_name="t",
                         operation="read", permission="deny")
    exact = AclFilter.of(binding)
    assert (exact.principal, exact.pattern_type, exact.permission, exact.host) == (
        "User:a", "literal", "deny", "*")
