"""Who is calling: a principal (`User:<name>`) from a client certificate's
subject or from a bearer token.

**Certificates (mTLS).** The subject's distinguished name, in RFC 2253 form
(most specific attribute first: "CN=alice,OU=payments,O=Example"), is
mapped by Kafka's `ssl.principal.mapping.rules` (SslPrincipalMapper): a
comma-separated list of rules tried in order, the first that applies wins.

    RULE:pattern/replacement/       the whole DN must match `pattern` (a
    RULE:pattern/replacement/L      regular expression); the name is the DN
    RULE:pattern/replacement/U      with every match replaced by
                                    `replacement` ($1, $2: groups), then
                                    lower-cased (L) or upper-cased (U)
    DEFAULT                         the name is the whole DN

`/` and `\\` inside a pattern or replacement are escaped with `\\`. With no
rules configured the rule list is `DEFAULT`; a DN no rule applies to is an
authentication failure. For example
`RULE:^CN=([^,]+),OU=ServiceUsers.*$/$1/L,DEFAULT` makes
"CN=Alice,OU=ServiceUsers,O=Example" `User:alice` and any other DN
`User:<the DN>`.

**Bearer tokens (OAUTHBEARER-style).** A JWT in the call's metadata, signed
by one of the configured issuers (issuer -> public key in PEM): the token's
`iss` picks the key; the signature must verify with an asymmetric algorithm
of that key's type (RSA: RS*/PS*, EC: ES*, Ed25519/Ed448: EdDSA — never
`none` or an HMAC, so a public key cannot be used as a shared secret);
`exp` is required and enforced against the caller's clock (`now_s`, with
`leeway_s`), as is `nbf` when present; `aud` must include the configured
audience when one is configured. The principal is `User:<sub>` (or another
claim, Kafka's `sasl.oauthbearer.sub.claim.name`).

Every failure raises `AuthenticationError`, a ServiceError carrying
SASL_AUTHENTICATION_FAILED, whose message says what was wrong (never the
token itself).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from oncelog.wire.errors import ErrorCode

from ..kernel.errors import ServiceError

USER_TYPE = "User"


class AuthenticationError(ServiceError):
    """A caller that could not be authenticated (SASL_AUTHENTICATION_FAILED)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.SASL_AUTHENTICATION_FAILED, message)


# ----------------------------------------------------------- certificates

# Kafka's SslPrincipalMapper.RULE_PATTERN, RULE_SPLITTER and RULE_PARSER.
_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


@dataclass(frozen=True, slots=True)
class MappingRule:
    """One rule of `ssl.principal.mapping.rules`; `pattern` None: DEFAULT."""

    pattern: str | None = None
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def __post_init__(self) -> None:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"mapping rule pattern {self.pattern!r} is not a regular "
                                 f"expression: {exc}") from exc
        if self.to_lower and self.to_upper:
            raise ValueError("a mapping rule lower-cases (L) or upper-cases (U), not both")

    @property
    def is_default(self) -> bool:
        return self.pattern is None

    def apply(self, distinguished_name: str) -> str | None:
        """The name this rule maps the DN to, or None when it does not apply."""
        if self.pattern is None:
            return distinguished_name
        compiled = _compiled(self.pattern)
        if compiled.fullmatch(distinguished_name) is None:
            return None
        # Java's String.replaceAll: every match of the pattern in the DN is
        # replaced (for a pattern that matched the whole DN, that is one
        # match, plus an empty one at the end for patterns that allow it).
        result = compiled.sub(lambda m: _expand(self.replacement, m), distinguished_name)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        flag = "/L" if self.to_lower else "/U" if self.to_upper else ""
        return f"RULE:{self.pattern}/{self.replacement}{flag}"


DEFAULT_RULES: tuple[MappingRule, ...] = (MappingRule(),)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _expand(replacement: str, match: re.Match[str]) -> str:
    """A Java replacement string for one match: `$n` is group n (a number
    above the group count drops digits from its end until it fits, or stays
    literal text, as SslPrincipalMapper arranges), `\\x` is x."""
    groups = match.re.groups
    out: list[str] = []
    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
            continue
        if ch == "$":
            ref = _BACK_REFERENCE.match(replacement, i)
            if ref is not None:
                digits = ref.group(1)
                number = int(digits)
                while number > groups and number >= 10:
                    number //= 10
                    digits = digits[:-1]
                if number <= groups:
                    out.append(match.group(number) or "")
                    i += 1 + len(digits)
                    continue
            out.append("$")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_mapping_rules(text: str | None) -> tuple[MappingRule, ...]:
    """Parses `ssl.principal.mapping.rules` ("RULE:.../.../L, DEFAULT");
    None is `DEFAULT`. Raises ValueError naming a rule it cannot read."""
    if text is None:
        return DEFAULT_RULES
    rules: list[MappingRule] = []
    for found in _RULE_SPLITTER.finditer(text.strip()):
        rule = found.group(1)
        parsed = _RULE_PARSER.match(rule)
        if parsed is None or parsed.end() != len(rule):
            end = 0 if parsed is None else parsed.end()
            raise ValueError(f"invalid principal mapping rule {rule!r}: cannot read "
                             f"{rule[end:]!r}")
        if parsed.group(1) is not None:
            rules.append(MappingRule())
        elif parsed.group(2) is not None:
            flag = parsed.group(6)
            rules.append(MappingRule(parsed.group(2), parsed.group(4) or "",
                                     to_lower=flag == "L", to_upper=flag == "U"))
        # An empty rule (",," or trailing space) is nothing, as in Kafka.
    return tuple(rules)


def principal_from_certificate_subject(subject_rfc2253: str,
                                       rules: Sequence[MappingRule]) -> str:
    """`User:<name>` for a client certificate's subject DN, by the first rule
    that applies; AuthenticationError when none does (or the name is empty)."""
    if not subject_rfc2253:
        raise AuthenticationError("the client certificate has an empty subject")
    for rule in rules:
        name = rule.apply(subject_rfc2253)
        if name is None:
            continue
        if not name:
            raise AuthenticationError(
                f"principal mapping rule {rule} maps the certificate subject "
                f"{subject_rfc2253!r} to an empty name")
        return f"{USER_TYPE}:{name}"
    shown = ", ".join(str(r) for r in rules) or "none"
    raise AuthenticationError(
        f"no principal mapping rule applies to the certificate subject {subject_rfc2253!r} "
        f"(rules: {shown})")


# ----------------------------------------------------------- bearer tokens

_ALGORITHMS_BY_KEY: tuple[tuple[type, tuple[str, ...]], ...] = (
    (rsa.RSAPublicKey, ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")),
    (ec.EllipticCurvePublicKey, ("ES256", "ES384", "ES512")),
    (ed25519.Ed25519PublicKey, ("EdDSA",)),
    (ed448.Ed448PublicKey, ("EdDSA",)),
)


@functools.lru_cache(maxsize=64)
def _public_key(pem: str) -> tuple[Any, tuple[str, ...]]:
    """A parsed public key and the JWT algorithms it verifies; ValueError
    for anything else (a private key, an HMAC secret, a certificate)."""
    try:
        key = load_pem_public_key(pem.encode())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM public key: {exc}") from exc
    for key_type, algorithms in _ALGORITHMS_BY_KEY:
        if isinstance(key, key_type):
            return key, algorithms
    raise ValueError(f"a {type(key).__name__} cannot verify JWT signatures here; "
                     "use an RSA, EC or Ed25519/Ed448 public key")


def check_issuer_keys(issuers: Mapping[str, str]) -> None:
    """Raises ValueError naming the first issuer whose key cannot verify
    tokens (for checking configuration at startup)."""
    if not issuers:
        raise ValueError("no token issuer is configured")
    for issuer, pem in issuers.items():
        try:
            _public_key(pem)
        except ValueError as exc:
            raise ValueError(f"the key of token issuer {issuer!r}: {exc}") from exc


def _numeric_claim(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthenticationError(f"bearer token claim {name!r} is {value!r}, not a number "
                                  "of seconds since the epoch")
    return float(value)


def validate_bearer(token: str, issuers: Mapping[str, str], audience: str | None,
                    now_s: float, leeway_s: float = 0.0, *,
                    principal_claim: str = "sub") -> str:
    """The principal (`User:<claim>`) of a valid bearer token; raises
    AuthenticationError saying what is wrong with an invalid one.

    `issuers` maps each trusted issuer (the token's `iss`) to its public key
    in PEM; `audience`, when not None, must be in the token's `aud`; `now_s`
    is the caller's clock (seconds since the epoch), `leeway_s` the clock
    skew tolerated on `exp` and `nbf`."""
    if leeway_s < 0:
        raise ValueError(f"leeway is {leeway_s} s; it must be >= 0")
    if not token:
        raise AuthenticationError("the bearer token is empty")
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise AuthenticationError(f"the bearer token is not a JWT: {exc}") from exc
    issuer = unverified.get("iss")
    if not isinstance(issuer, str) or not issuer:
        raise AuthenticationError("the bearer token names no issuer (claim 'iss')")
    pem = issuers.get(issuer)
    if pem is None:
        trusted = ", ".join(repr(i) for i in sorted(issuers)) or "none"
        raise AuthenticationError(
            f"the bearer token's issuer {issuer!r} is not trusted (trusted: {trusted})")
    try:
        key, algorithms = _public_key(pem)
    except ValueError as exc:
        raise AuthenticationError(f"issuer {issuer!r} has no usable key: {exc}") from exc
    algorithm = header.get("alg")
    if algorithm not in algorithms:
        raise AuthenticationError(
            f"the bearer token is signed with {algorithm!r}; issuer {issuer!r}'s key "
            f"verifies {', '.join(algorithms)}")
    try:
        # Time claims are checked below against the caller's clock, not here.
        claims = jwt.decode(
            token, key=key, algorithms=list(algorithms), issuer=issuer,
            audience=audience,
            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                     "verify_aud": audience is not None,
                     "require": ["exp", "iss", principal_claim]},
        )
    except jwt.InvalidSignatureError as exc:
        raise AuthenticationError(
            f"the bearer token's signature does not verify with issuer {issuer!r}'s key"
        ) from exc
    except jwt.MissingRequiredClaimError as exc:
        raise AuthenticationError(f"the bearer token has no {exc.claim!r} claim") from exc
    except jwt.InvalidAudienceError as exc:
        raise AuthenticationError(
            f"the bearer token is not for audience {audience!r} "
            f"(its 'aud' is {unverified.get('aud')!r})") from exc
    except jwt.PyJWTError as exc:
        raise AuthenticationError(f"the bearer token is invalid: {exc}") from exc
    expires_s = _numeric_claim(claims, "exp")
    if expires_s is not None and now_s > expires_s + leeway_s:
        raise AuthenticationError(
            f"the bearer token expired at {expires_s:.0f} (now {now_s:.0f}, "
            f"leeway {leeway_s:g} s)")
    not_before_s = _numeric_claim(claims, "nbf")
    if not_before_s is not None and now_s + leeway_s < not_before_s:
        raise AuthenticationError(
            f"the bearer token is not valid before {not_before_s:.0f} (now {now_s:.0f}, "
            f"leeway {leeway_s:g} s)")
    subject = claims.get(principal_claim)
    if not isinstance(subject, str) or not subject:
        raise AuthenticationError(
            f"the bearer token's {principal_claim!r} claim is {subject!r}, not a non-empty "
            "string")
    return f"{USER_TYPE}:{subject}"
