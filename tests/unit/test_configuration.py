"""Configuration of the services by flags and environment variables.

Goal: every flag of the partition store and the transaction coordinator is
documented in docs/configuration.md (the one place), every flag can be set
as ONCELOG_<NAME> in the environment with the flag winning, and a bad value
in the environment gets a clear error naming it instead of a traceback or a
silent default.

Method: the services' own argument parsers, built under a patched
environment; the doc read as text.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from services.coordinator.server import build_parser as coordinator_parser
from services.partition_store.server import build_parser as store_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "partition_store": store_parser, "coordinator": coordinator_parser,
}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"]


@pytest.mark.parametrize("service", sorted(PARSERS))
def test_every_flag_is_documented(service: str) -> None:
    doc = DOC.read_text()
    assert [f for f in _flags(PARSERS[service]()) if f"`{f}`" not in doc] == []


def test_environment_sets_defaults_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCELOG_SNAPSHOT_INTERVAL_MS", "1234")
    monkeypatch.setenv("ONCELOG_FSYNC", "yes")
    monkeypatch.setenv("ONCELOG_LOG_FORMAT", "JSON")
    monkeypatch.setenv("ONCELOG_SHUTDOWN_GRACE_MS", "250")
    args = store_parser().parse_args(["--data-dir", "x"])
    assert (args.snapshot_interval_ms, args.fsync, args.log_format, args.shutdown_grace_ms) \
        == (1234, True, "json", 250)
    args = store_parser().parse_args(["--data-dir", "x", "--snapshot-interval-ms", "99"])
    assert args.snapshot_interval_ms == 99
    monkeypatch.setenv("ONCELOG_MAX_TRANSACTION_TIMEOUT_MS", "60000")
    assert coordinator_parser().parse_args([]).max_transaction_timeout_ms == 60000


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("ONCELOG_SNAPSHOT_INTERVAL_MS", "soon", "invalid int value: 'soon'"),
    ("ONCELOG_FSYNC", "maybe", "ONCELOG_FSYNC='maybe'"),
    ("ONCELOG_LOG_FORMAT", "xml", "ONCELOG_LOG_FORMAT='xml'"),
    ("ONCELOG_LOG_LEVEL", "LOUD", "ONCELOG_LOG_LEVEL='LOUD'"),
])
def test_a_bad_environment_value_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        name: str, value: str, expected: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        store_parser().parse_args(["--data-dir", "x"])
    assert expected in f"{exc.value.code} {capsys.readouterr().err}"
