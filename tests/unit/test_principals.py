"""Principals from certificates and bearer tokens (services/common/security/principals.py).

Goal: a client certificate's subject maps to the principal Kafka's
`ssl.principal.mapping.rules` would give it — the rule syntax (RULE, the
L/U flags, DEFAULT, escapes, commas inside patterns), the first applying
rule winning, and no applying rule being an authentication failure — and a
bearer token yields `User:<sub>` only when it is a JWT signed by a trusted
issuer's key with an asymmetric algorithm of that key, for the configured
audience, within its validity (against the clock passed in); every refusal
carries SASL_AUTHENTICATION_FAILED and says what was wrong.

Method: the cases of Kafka's SslPrincipalMapperTest, run through
parse_mapping_rules and principal_from_certificate_subject; tokens made in
the test with PyJWT from RSA, EC and Ed25519 keys generated with
`cryptography`, then validated at chosen clock readings.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from oncelog.wire.errors import ErrorCode
from services.common.security.principals import (
    DEFAULT_RULES,
    AuthenticationError,
    MappingRule,
    check_issuer_keys,
    parse_mapping_rules,
    principal_from_certificate_subject,
    validate_bearer,
)

# ----------------------------------------------------------- certificates

KAFKA_RULES = ", ".join([
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
    "DEFAULT",
])


@pytest.mark.parametrize(("subject", "principal"), [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "User:duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "User:duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "User:DUKE@SME"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "User:DUKE"),
    # No RULE applies: DEFAULT keeps the whole DN.
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "User:OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_kafkas_mapping_examples(subject: str, principal: str) -> None:
    assert principal_from_certificate_subject(subject, parse_mapping_rules(KAFKA_RULES)) == (
        principal)


def test_default_rules_give_the_whole_subject() -> None:
    assert parse_mapping_rules(None) == DEFAULT_RULES
    assert principal_from_certificate_subject("CN=alice,O=Example", DEFAULT_RULES) == (
        "User:CN=alice,O=Example")


def test_a_comma_inside_a_pattern_and_escaped_commas_in_the_subject() -> None:
    rules = parse_mapping_rules("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert principal_from_certificate_subject(
        "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz", rules) == "User:Tkac\\, Adam"


# (rules text, the rules as Kafka prints them) from Kafka's testRulesSplitting.
@pytest.mark.parametrize(("text", "expected"), [
    ("", "[]"),
    ("DEFAULT", "[DEFAULT]"),
    ("RULE://", "[RULE:/]"),
    ("RULE:/.*/", "[RULE:/.*]"),
    ("RULE:/.*/L", "[RULE:/.*/L]"),
    ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
    ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"),
    ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
    ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
    ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
     "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]"),
    # Empty rules are nothing.
    (",   , , ,      , , ,   ", "[]"),
    (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
    (",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"),
    # Escapes stay in the pattern and replacement.
    ("RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//", "[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]"),
    ("RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/", "[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]"),
    # "RULE:" and "DEFAULT" inside patterns are text.
    ("RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
     "/DEFAULT/,DEFAULT",
     "[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, "
     "/DEFAULT, DEFAULT]"),
])
def test_rules_are_split_as_kafka_splits_them(text: str, expected: str) -> None:
    assert "[" + ", ".join(str(r) for r in parse_mapping_rules(text)) + "]" == expected


@pytest.mark.parametrize("text", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid principal mapping rule"):
        parse_mapping_rules(text)


@pytest.mark.parametrize(("rule", "subject", "name"), [
    # $n beyond the groups: digits drop from the end until it fits ($12 -> $1
    # then "2"); with no group at all it stays text.
    (MappingRule("^CN=(\\w+),.*$", "$12"), "CN=ab,O=x", "ab2"),
    (MappingRule("^CN=\\w+,.*$", "$1-x"), "CN=ab,O=x", "$1-x"),
    # A backslash takes the next character as it is.
    (MappingRule("^CN=(\\w+),.*$", "\\$1"), "CN=ab,O=x", "$1"),
    (MappingRule("^CN=(\\w+),.*$", "$1", to_upper=True), "CN=ab,O=x", "AB"),
])
def test_replacements_follow_java(rule: MappingRule, subject: str, name: str) -> None:
    assert rule.apply(subject) == name


@pytest.mark.parametrize(("rules", "subject", "message"), [
    ((MappingRule("^CN=(\\w+),OU=Svc$", "$1"),), "CN=bob,OU=Other",
     "no principal mapping rule applies to the certificate subject 'CN=bob,OU=Other'"),
    ((), "CN=bob", "rules: none"),
    (DEFAULT_RULES, "", "empty subject"),
    ((MappingRule("^CN=(\\w*),.*$", "$1"),), "CN=,O=x", "to an empty name"),
])
def test_a_subject_no_rule_takes_fails_authentication(rules: tuple[MappingRule, ...],
                                                      subject: str, message: str) -> None:
    with pytest.raises(AuthenticationError, match=message) as failure:
        principal_from_certificate_subject(subject, rules)
    assert failure.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_a_bad_rule_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a regular expression"):
        parse_mapping_rules("RULE:^CN=(.*$/$1/")
    with pytest.raises(ValueError, match="not both"):
        MappingRule("x", "y", to_lower=True, to_upper=True)


# ----------------------------------------------------------- bearer tokens

ISSUER = "https://issuer.example"
AUDIENCE = "oncelog"
NOW_S = 1_700_000_000


def _pem(public_key: Any) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _claims(**overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {"iss": ISSUER, "sub": "alice", "aud": AUDIENCE,
                              "exp": NOW_S + 300, "iat": NOW_S - 10}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def test_a_good_token_names_its_subject(rsa_key: rsa.RSAPrivateKey,
                                        ec_key: ec.EllipticCurvePrivateKey) -> None:
    ed_key = ed25519.Ed25519PrivateKey.generate()
    issuers = {ISSUER: _pem(rsa_key.public_key()),
               "ec-issuer": _pem(ec_key.public_key()),
               "ed-issuer": _pem(ed_key.public_key())}
    check_issuer_keys(issuers)
    signers: list[tuple[rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
                        | ed25519.Ed25519PrivateKey, str, str]] = [
        (rsa_key, "RS256", ISSUER), (rsa_key, "PS384", ISSUER),
        (ec_key, "ES256", "ec-issuer"), (ed_key, "EdDSA", "ed-issuer"),
    ]
    for key, algorithm, issuer in signers:
        token = jwt.encode(_claims(iss=issuer), key, algorithm=algorithm)
        assert validate_bearer(token, issuers, AUDIENCE, NOW_S) == "User:alice", algorithm
    # Another claim can name the principal; no audience configured: not checked.
    token = jwt.encode(_claims(aud="elsewhere", client_id="etl-job"), rsa_key,
                       algorithm="RS256")
    assert validate_bearer(token, issuers, None, NOW_S,
                           principal_claim="client_id") == "User:etl-job"
    # A token for several audiences, ours among them.
    token = jwt.encode(_claims(aud=["other", AUDIENCE]), rsa_key, algorithm="RS256")
    assert validate_bearer(token, issuers, AUDIENCE, NOW_S) == "User:alice"


def _unsigned(claims: dict[str, Any], header: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part(header)}.{part(claims)}."


TokenMaker = Callable[[rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey], str]

# (how the token is made, clock, leeway, what the refusal says)
BAD_TOKENS: list[tuple[str, TokenMaker, float, float, str]] = [
    ("expired", lambda r, e: jwt.encode(_claims(exp=NOW_S - 1), r, algorithm="RS256"),
     NOW_S, 0, "expired at 1699999999"),
    ("expired beyond the leeway",
     lambda r, e: jwt.encode(_claims(exp=NOW_S - 31), r, algorithm="RS256"),
     NOW_S, 30, "expired"),
    ("not yet valid", lambda r, e: jwt.encode(_claims(nbf=NOW_S + 60), r, algorithm="RS256"),
     NOW_S, 0, "not valid before"),
    ("no expiry", lambda r, e: jwt.encode(_claims(exp=None), r, algorithm="RS256"),
     NOW_S, 0, "no 'exp' claim"),
    ("expiry not a number",
     lambda r, e: jwt.encode(_claims(exp="tomorrow"), r, algorithm="RS256"),
     NOW_S, 0, "'exp' is 'tomorrow', not a number"),
    ("no subject", lambda r, e: jwt.encode(_claims(sub=None), r, algorithm="RS256"),
     NOW_S, 0, "no 'sub' claim"),
    ("empty subject", lambda r, e: jwt.encode(_claims(sub=""), r, algorithm="RS256"),
     NOW_S, 0, "'sub' claim is '', not a non-empty string"),
    ("untrusted issuer",
     lambda r, e: jwt.encode(_claims(iss="https://evil.example"), r, algorithm="RS256"),
     NOW_S, 0, "issuer 'https://evil.example' is not trusted"),
    ("no issuer", lambda r, e: jwt.encode(_claims(iss=None), r, algorithm="RS256"),
     NOW_S, 0, "names no issuer"),
    # Signed by another key than the issuer's.
    ("wrong key", lambda r, e: jwt.encode(
        _claims(), rsa.generate_private_key(public_exponent=65537, key_size=2048),
        algorithm="RS256"), NOW_S, 0, "signature does not verify with issuer"),
    # Claims changed after signing.
    ("tampered", lambda r, e: _tamper(jwt.encode(_claims(), r, algorithm="RS256")),
     NOW_S, 0, "signature does not verify"),
    ("wrong audience",
     lambda r, e: jwt.encode(_claims(aud="elsewhere"), r, algorithm="RS256"),
     NOW_S, 0, "not for audience 'oncelog'"),
    ("no audience", lambda r, e: jwt.encode(_claims(aud=None), r, algorithm="RS256"),
     NOW_S, 0, "no 'aud' claim"),
    # The algorithm must be one the issuer's key type verifies: an EC
    # signature for an RSA issuer, an HMAC keyed with the public key, none.
    ("algorithm of another key type",
     lambda r, e: jwt.encode(_claims(), e, algorithm="ES256"),
     NOW_S, 0, "signed with 'ES256'; issuer 'https://issuer.example'"),
    ("unsigned", lambda r, e: _unsigned(_claims(), {"alg": "none", "typ": "JWT"}),
     NOW_S, 0, "signed with 'none'"),
    ("HMAC with the public key",
     lambda r, e: _unsigned(_claims(), {"alg": "HS256", "typ": "JWT"}) + "c2ln",
     NOW_S, 0, "signed with 'HS256'"),
    ("not a JWT", lambda r, e: "not-a-token", NOW_S, 0, "is not a JWT"),
    ("empty", lambda r, e: "", NOW_S, 0, "bearer token is empty"),
]


def _tamper(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


@pytest.mark.parametrize(("make", "now_s", "leeway_s", "message"),
                         [row[1:] for row in BAD_TOKENS], ids=[row[0] for row in BAD_TOKENS])
def test_a_bad_token_is_refused_saying_why(rsa_key: rsa.RSAPrivateKey,
                                           ec_key: ec.EllipticCurvePrivateKey,
                                           make: TokenMaker, now_s: float, leeway_s: float,
                                           message: str) -> None:
    token = make(rsa_key, ec_key)
    issuers = {ISSUER: _pem(rsa_key.public_key())}
    with pytest.raises(AuthenticationError, match=message) as failure:
        validate_bearer(token, issuers, AUDIENCE, now_s, leeway_s)
    assert failure.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    # The token itself is never in the message.
    if len(token) > 20:
        assert token not in failure.value.message


def test_expiry_is_judged_by_the_clock_passed_in(rsa_key: rsa.RSAPrivateKey) -> None:
    issuers = {ISSUER: _pem(rsa_key.public_key())}
    token = jwt.encode(_claims(exp=NOW_S + 100), rsa_key, algorithm="RS256")
    assert validate_bearer(token, issuers, AUDIENCE, NOW_S + 100) == "User:alice"
    with pytest.raises(AuthenticationError, match="expired"):
        validate_bearer(token, issuers, AUDIENCE, NOW_S + 101)
    # Within the leeway it still counts.
    assert validate_bearer(token, issuers, AUDIENCE, NOW_S + 110, 10) == "User:alice"
    with pytest.raises(ValueError, match="leeway"):
        validate_bearer(token, issuers, AUDIENCE, NOW_S, -1)


def test_issuer_keys_are_checked(rsa_key: rsa.RSAPrivateKey) -> None:
    private_pem = rsa_key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()).decode()
    with pytest.raises(ValueError, match="the key of token issuer 'x': not a PEM public key"):
        check_issuer_keys({"x": private_pem})
    with pytest.raises(ValueError, match="no token issuer"):
        check_issuer_keys({})
    token = jwt.encode(_claims(), rsa_key, algorithm="RS256")
    with pytest.raises(AuthenticationError, match="has no usable key"):
        validate_bearer(token, {ISSUER: "-----BEGIN PUBLIC KEY-----\nnope\n"}, AUDIENCE, NOW_S)
