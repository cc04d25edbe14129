"""Error codes and the exception class for each: `oncelog.wire.errors`, under
the name users import (`from oncelog import errors`). See that module."""

from __future__ import annotations

from oncelog.wire.errors import *  # noqa: F403 - this module is that one, renamed


def __getattr__(name: str) -> type[OncelogError]:  # noqa: F405
    # Makes mypy accept the generated class names (errors.ProducerFencedError).
    raise AttributeError(name)
