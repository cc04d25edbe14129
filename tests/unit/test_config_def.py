"""The clients' options table (oncelog.config_def) is what the clients, the
CLI and the docs use.

Goal: the table lists exactly the keyword options each of Producer, Consumer
and Admin takes, with their defaults and annotations (so the two cannot
drift); every check the table declares is the one the constructor applies
(a value under a key's minimum, or of another type, is refused naming the
option); every default passes its own check; Kafka's names come from the
table and only name options whose meaning is ours; the CLI's security
flags, environment variables and --command-config properties are the
table's; and the "Client options" section of docs/configuration.md and
docs/cli.md's table of the security settings are exactly what the table
generates.

Method: `inspect.signature` of the real classes; the real constructors
against an address nothing listens on (options are checked before any
connection); the CLI's real parser and properties-file reader; the doc read
as text and compared with `markdown()`, and `python -m oncelog.config_def
--markdown` run as a user would.
"""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oncelog import Admin, Consumer, Producer, config_def
from oncelog._keywords import KAFKA_NAMES, resolve_keywords
from oncelog.cli._common import (
    SECURITY_SETTINGS,
    CliError,
    add_connection_options,
    read_command_config,
)
from oncelog.config_def import ADMIN, CONSUMER, PRODUCER, IntRange

REPO = Path(__file__).resolve().parents[2]
NOWHERE = "127.0.0.1:1"
CLASSES: dict[str, Any] = {PRODUCER: Producer, CONSUMER: Consumer, ADMIN: Admin}


def _compiled(cls: Any) -> bool:
    """Whether `cls.__init__` was compiled by mypyc (the compiled wheel's
    Producer): kafka_names() wraps it, and what it wraps is no Python
    function then."""
    init = cls.__init__
    return not inspect.isfunction(getattr(init, "__wrapped__", init))


@pytest.mark.parametrize("client", sorted(CLASSES))
def test_the_table_is_the_constructor_signature(client: str) -> None:
    parameters = inspect.signature(CLASSES[client]).parameters
    keys = {k.name: k for k in config_def.client_keys(client)}
    assert sorted(parameters) == sorted(keys), "the constructor and the table differ"
    module = vars(sys.modules[CLASSES[client].__module__])
    for name, parameter in parameters.items():
        k = keys[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        expected = inspect.Parameter.empty if k.required else k.default
        default = parameter.default
        if _compiled(CLASSES[client]) and type(default).__name__ == "_Default":
            # A compiled __init__'s signature is read from its source, with a
            # default that is not a literal as its text ("32 * 1024 * 1024").
            default = eval(default.text, module)
        assert default == expected, (name, default, k.default)
        assert type(default) is type(expected), name
        assert str(parameter.annotation) == k.type, (name, parameter.annotation, k.type)


def test_every_key_is_documented_and_named_once() -> None:
    names = [k.name for k in config_def.KEYS]
    assert len(names) == len(set(names))
    for k in (*config_def.KEYS, config_def.TOKEN_FILE):
        assert k.doc and not k.doc.endswith("."), k.name
        assert k.clients <= set(config_def.CLIENTS), k.name
    kafka = [n for k in config_def.KEYS for n in k.kafka]
    assert len(kafka) == len(set(kafka))


def _defaults(client: str) -> dict[str, Any]:
    return {k.name: NOWHERE if k.required else k.default for k in config_def.client_keys(client)}


@pytest.mark.parametrize("client", sorted(CLASSES))
def test_every_default_passes_its_own_check(client: str) -> None:
    checked = config_def.validate(client, _defaults(client))
    decided = {"acks": -1, "enable_idempotence": True}   # normalized, or derived from others
    for name, value in checked.values.items():
        assert value == decided.get(name, _defaults(client)[name]), name
    assert checked.security.protocol == config_def.PLAINTEXT


def _int_cases() -> list[tuple[str, str, int]]:
    cases = []
    for client in sorted(CLASSES):
        for k in config_def.client_keys(client):
            if isinstance(k.validator, IntRange) and k.validator.minimum is not None:
                cases.append((client, k.name, k.validator.minimum))
    return cases


@pytest.mark.parametrize(("client", "name", "minimum"), _int_cases())
def test_each_declared_minimum_is_what_the_constructor_refuses(
        client: str, name: str, minimum: int) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be >= {minimum}, got {minimum - 1}$"):
        CLASSES[client](bootstrap=NOWHERE, **{name: minimum - 1})
    if _compiled(CLASSES[client]):
        return   # mypyc hands a bool given for an int parameter over as the int
    with pytest.raises(ValueError, match=rf"^{name} must be an int, got True \(bool\)"):
        CLASSES[client](bootstrap=NOWHERE, **{name: True})


def test_a_bound_on_another_option_and_a_maximum_are_applied() -> None:
    with pytest.raises(ValueError, match="^retry_backoff_max_ms must be >= 300, got 200$"):
        Admin(bootstrap=NOWHERE, retry_backoff_ms=300, retry_backoff_max_ms=200)
    with pytest.raises(ValueError, match="^fetch_max_wait_ms must be within 0..30000, got 30001$"):
        Consumer(bootstrap=NOWHERE, fetch_max_wait_ms=30_001)


def test_the_table_disagreeing_with_a_constructor_is_a_bug_said_so() -> None:
    given = _defaults(ADMIN)
    given["linger_ms"] = 5
    with pytest.raises(RuntimeError,
                       match=r"Admin's options and the table differ: \['linger_ms'\]"):
        config_def.validate(ADMIN, given)


def test_kafka_names_are_the_tables_and_name_our_options_only() -> None:
    # The keyword names other clients use that are not ours: the table's
    # Kafka property names (and aliases) whose Python spelling differs.
    assert dict(KAFKA_NAMES) == {
        "bootstrap_servers": "bootstrap",
        "max_in_flight_requests_per_connection": "max_in_flight",
        "buffer_memory": "buffer_memory_bytes",
        "enable_2pc": "transaction_two_phase_commit_enable",
    }
    # Every Kafka name of the table reaches its option through the real
    # keyword resolution of each client that has the option.
    for k in config_def.KEYS:
        for client in k.clients:
            parameters = frozenset(inspect.signature(CLASSES[client]).parameters)
            for other in (*k.kafka, *k.aliases):
                assert resolve_keywords(client, parameters, {other: 1}) == {k.name: 1}, other


def test_the_cli_flags_and_properties_are_the_tables(tmp_path: Path) -> None:
    assert [s[0] for s in SECURITY_SETTINGS] == [
        "security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_oauth_token_file"]
    parser = argparse.ArgumentParser()
    add_connection_options(parser, defaults=True)
    flags = {o for a in parser._actions for o in a.option_strings}
    for k in config_def.cli_settings():
        assert k.flag in flags and k.env and k.kafka_name, k.name
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k.kafka_name}=v-{k.name}\n" for k in config_def.cli_settings())
                      + "sasl.mechanism=oauthbearer\n")
    assert read_command_config(str(config)) == {
        k.name: f"v-{k.name}" for k in config_def.cli_settings()}
    # A client option without a CLI flag is not a property the file takes.
    config.write_text("linger.ms=5\n")
    with pytest.raises(CliError, match="unknown property 'linger.ms'; known: security.protocol"):
        read_command_config(str(config))


def test_kafka_properties_taken_otherwise_are_refused_with_what_to_give(
        tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    for prop, refused in config_def.REFUSED_KAFKA_PROPERTIES.items():
        assert prop not in {n for k in config_def.KEYS for n in k.kafka}, prop
        instead = [config_def.key(name) for name in refused.instead]
        config.write_text(f"{prop}=x\n")
        with pytest.raises(CliError) as said:
            read_command_config(str(config))
        assert f":1: {prop} is not supported: " in str(said.value)
        assert all(k.kafka_name and k.kafka_name in str(said.value) for k in instead), prop


def test_the_spark_keys_are_the_tables() -> None:
    assert [(k.name, k.spark_alias) for k in config_def.spark_keys(CONSUMER)] == [
        ("bootstrap", "kafka.bootstrap.servers"), ("isolation_level", "kafka.isolation.level"),
        ("security_protocol", "kafka.security.protocol"), ("ssl_cafile", None),
        ("ssl_certfile", None), ("ssl_keyfile", None),
        ("sasl_mechanism", "kafka.sasl.mechanism"), ("sasl_oauth_token_file", None)]
    assert [k.name for k in config_def.spark_keys(PRODUCER)][:2] == [
        "bootstrap", "transaction_timeout_ms"]


@pytest.mark.parametrize(("doc", "begin", "end"), [
    ("configuration.md", config_def.DOC_BEGIN, config_def.DOC_END),
    ("cli.md", config_def.CLI_DOC_BEGIN, config_def.CLI_DOC_END),
])
def test_the_docs_are_the_table(doc: str, begin: str, end: str) -> None:
    regenerate = f"regenerate it: python -m oncelog.config_def --write docs/{doc}"
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    assert begin in text and end in text, f"docs/{doc} has no generated section; {regenerate}"
    assert config_def.replace_section(text) == text, \
        f"docs/{doc}'s generated section differs from oncelog.config_def; {regenerate}"


def test_the_doc_names_every_option_of_every_client() -> None:
    for client, cls in CLASSES.items():
        for name in inspect.signature(cls).parameters:
            assert f"| `{name}` |" in config_def.markdown(), (client, name)
    for k in config_def.cli_settings():
        assert f"| `{k.flag}` | `{k.env}` | `{k.kafka_name}` |" in config_def.cli_markdown()


def test_a_stale_section_is_rewritten() -> None:
    stale = f"intro\n{config_def.CLI_DOC_BEGIN}\n| old |\n{config_def.CLI_DOC_END}\nrest\n"
    assert config_def.replace_section(stale) == f"intro\n{config_def.cli_markdown()}rest\n"


def test_the_module_prints_the_section() -> None:
    printed = subprocess.run([sys.executable, "-m", "oncelog.config_def", "--markdown"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    assert printed == config_def.markdown()
