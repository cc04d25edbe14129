"""Kafka's option names on Producer, Consumer and Admin, and a "did you mean"
for a misspelled one.

Users arrive with kafka-python's and confluent-kafka's habits:
`Producer(bootstrap_servers=...)`, or a config dict of Kafka's dotted
property names passed as `Producer(**{"bootstrap.servers": ...})`. Python
would answer both with a bare `TypeError: unexpected keyword argument`.
`kafka_names` wraps a client class's `__init__` so that

* a dotted name is read with `_` for `.` (`linger.ms` is `linger_ms`, as
  kafka-python spells Kafka's properties);
* a name Kafka's clients use for one of our options (`KAFKA_NAMES`) is
  taken as ours (`bootstrap_servers` is `bootstrap`);
* anything else unknown is a TypeError naming the keyword and, when one is
  close, the option it probably meant.

The wrapper keeps `__init__`'s own signature (`functools.wraps` sets
`__wrapped__`, which `inspect.signature` follows), so help(), the docs'
signature checks and type checkers still see our names only.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

# Kafka's (and kafka-python's) name for an option -> ours, where they differ.
# Only names whose meaning is the same here: a value given under the Kafka
# name is checked exactly as if given under ours.
KAFKA_NAMES: Mapping[str, str] = {
    "bootstrap_servers": "bootstrap",
    "max_in_flight_requests_per_connection": "max_in_flight",
    "buffer_memory": "buffer_memory_bytes",
    "enable_2pc": "transaction_two_phase_commit_enable",
}

C = TypeVar("C", bound=type)


def python_name(name: str) -> str:
    """A Kafka property name as a Python keyword: `linger.ms` -> `linger_ms`."""
    return name.replace(".", "_").replace("-", "_")


def resolve_keywords(owner: str, parameters: frozenset[str],
                     given: Mapping[str, Any]) -> dict[str, Any]:
    """`given` with every name turned into one of `parameters`; a TypeError
    naming the first that cannot be, with a suggestion when one is close."""
    resolved: dict[str, Any] = {}
    spelled: dict[str, str] = {}     # our name -> how the caller spelled it
    for name, value in given.items():
        ours = python_name(name)
        ours = KAFKA_NAMES.get(ours, ours)
        if ours not in parameters:
            raise TypeError(unknown_keyword_message(owner, name, parameters))
        if ours in resolved:
            raise TypeError(f"{owner}() got {ours!r} twice: as {spelled[ours]!r} and as {name!r}")
        resolved[ours] = value
        spelled[ours] = name
    return resolved


def unknown_keyword_message(owner: str, name: str, parameters: frozenset[str]) -> str:
    candidates = sorted(parameters | {k for k, v in KAFKA_NAMES.items() if v in parameters})
    close = difflib.get_close_matches(python_name(name), candidates, n=1, cutoff=0.6)
    hint = ""
    if close:
        suggestion = KAFKA_NAMES.get(close[0], close[0])
        hint = f"; did you mean {suggestion!r}?"
    return f"{owner}() got an unexpected keyword argument {name!r}{hint}"


def kafka_names(cls: C) -> C:
    """Class decorator: `cls.__init__` (keyword-only options) also takes
    Kafka's names for its options, and says "did you mean" for a misspelled one."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    parameters = frozenset(
        name for name, p in inspect.signature(init).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY)
    owner = cls.__name__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **options: Any) -> None:  # noqa: N807 - the wrapped name
        if options.keys() <= parameters:
            init(self, *args, **options)     # the common case: our names only
            return
        init(self, *args, **resolve_keywords(owner, parameters, options))

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
