"""Kafka's option names and "did you mean" on the SDK's client constructors.

Goal: users who bring kafka-python's or confluent-kafka's habits
(`bootstrap_servers=`, a dict of dotted Kafka property names) get a working
client, and a misspelled option gets a TypeError that names it and the option
it was probably meant to be, instead of Python's bare "unexpected keyword".

Method: the real Producer, Consumer and Admin classes, built against an
address nothing listens on (construction connects lazily), and their options
read back from the objects; `inspect.signature` checked to still show our
names only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from oncelog import Admin, Consumer, Producer
from oncelog._keywords import KAFKA_NAMES

NOWHERE = "127.0.0.1:1"


def options(**given: Any) -> dict[str, Any]:
    """Keywords as a user's untyped code passes them (a type checker would
    refuse the names these tests use on purpose)."""
    return given


@pytest.mark.parametrize("cls", [Producer, Consumer, Admin])
def test_bootstrap_servers_and_dotted_names_are_taken(cls: Callable[..., Any]) -> None:
    for options in ({"bootstrap_servers": NOWHERE}, {"bootstrap.servers": NOWHERE,
                                                     "request.timeout.ms": 1234}):
        client = cls(**options)
        try:
            assert tuple(client._client.bootstrap) == (NOWHERE,)
        finally:
            client.close()


def test_a_kafka_name_is_checked_as_ours() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Producer(**options(bootstrap=NOWHERE, max_in_flight_requests_per_connection="five"))


@pytest.mark.parametrize(("given", "suggested"), [
    ("lingr_ms", "linger_ms"),
    ("transactionl_id", "transactional_id"),
    ("bootstrap_server", "bootstrap"),
    ("batch.sise", "batch_size"),
])
def test_a_misspelled_option_says_did_you_mean(given: str, suggested: str) -> None:
    with pytest.raises(TypeError) as refused:
        Producer(**options(bootstrap=NOWHERE), **options(**{given: 1}))
    message = str(refused.value)
    assert f"unexpected keyword argument {given!r}" in message
    assert f"did you mean {suggested!r}?" in message


def test_nothing_close_gets_no_guess() -> None:
    with pytest.raises(TypeError) as refused:
        Consumer(**options(bootstrap=NOWHERE, zzzzzz=1))
    assert "did you mean" not in str(refused.value)


def test_the_same_option_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="'bootstrap' twice"):
        Producer(**options(bootstrap=NOWHERE, bootstrap_servers=NOWHERE))


@pytest.mark.parametrize("cls", [Producer, Consumer, Admin])
def test_the_signature_shows_our_names_only(cls: type) -> None:
    names = set(inspect.signature(cls).parameters)
    assert "bootstrap" in names
    assert not names & set(KAFKA_NAMES)


def test_every_kafka_name_maps_to_an_option_of_some_client() -> None:
    options = set().union(*(inspect.signature(c).parameters for c in (Producer, Consumer, Admin)))
    assert set(KAFKA_NAMES.values()) <= options
