"""The record-batch codec: `oncelog.wire.records`, under the name users import.
See that module."""

from __future__ import annotations

from oncelog.wire.records import *  # noqa: F403 - this module is that one, renamed
