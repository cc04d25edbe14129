"""Checks of the keyword options users pass to Producer, Consumer and Admin.

A wrong type must fail at construction with a ValueError that names the
option and the value received (`batch_size='big'`), not later as a raw
comparison error deep in the sender thread. Kafka's clients do the same with
ConfigException. bool is refused where an int is expected: `linger_ms=True`
is a mistake, not 1 ms.
"""

from __future__ import annotations

from collections.abc import Iterable

# acks as Kafka spells it, and what each means here.
ACKS_ALL = -1
ACKS_LEADER = 1
_ACKS_VALUES: dict[object, int] = {"all": ACKS_ALL, -1: ACKS_ALL, "-1": ACKS_ALL,
                                   1: ACKS_LEADER, "1": ACKS_LEADER}


def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def int_option(name: str, value: object, *, minimum: int | None = None) -> int:
    """`value` as an int option named `name`, at least `minimum`."""
    if type(value) is bool or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {_shown(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def bool_option(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {_shown(value)}")
    return value


def choice_option(name: str, value: object, choices: Iterable[str]) -> str:
    allowed = tuple(str(c) for c in choices)   # a StrEnum's members as their text
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"{name} must be one of {', '.join(repr(c) for c in allowed)}, got {_shown(value)}"
        )
    return value


def acks_option(value: object, *, idempotent: bool) -> int:
    """Kafka's `acks`: "all" (or -1, the default) or 1; -1 or 1 back.

    The store acknowledges a write once every in-sync replica has it (its
    only mode: docs/replication.md), so 1 waits for the same as "all"; it is
    taken for Kafka users' habits and turns idempotence off by default, as in
    Kafka. 0 (fire and forget: no answer awaited, a
    lost record goes unnoticed) is refused: every record here is acknowledged,
    and retries, idempotence and transactions all rest on that answer.
    """
    if value == 0 and type(value) is not bool or value == "0":
        raise ValueError(
            "acks=0 (fire and forget) is not supported: every record is acknowledged, "
            "because retries, idempotence and transactions rest on the store's answer; "
            "use acks='all' (the default) or acks=1, and linger_ms/batch_size for throughput"
        )
    acks = _ACKS_VALUES.get(value) if type(value) is not bool else None
    if acks is None:
        raise ValueError(f"acks must be 'all', -1 or 1, got {_shown(value)}")
    if idempotent and acks != ACKS_ALL:
        raise ValueError(
            f"an idempotent producer needs acks='all' (as in Kafka), got acks={value!r}; "
            "pass enable_idempotence=False to use acks=1"
        )
    return acks


# The client id a Producer or Consumer sends when given none (Kafka's
# clients have their own, e.g. "rdkafka"): stores' quotas and logs see it.
DEFAULT_CLIENT_ID = "oncelog-python"


def client_id_option(value: object) -> str:
    """A client id: a non-empty str of at most 249 characters (the longest
    id the stores keep)."""
    if not isinstance(value, str) or not value or len(value) > 249:
        raise ValueError(f"client_id must be a non-empty str of at most 249 characters, "
                         f"got {_shown(value)}")
    return value
