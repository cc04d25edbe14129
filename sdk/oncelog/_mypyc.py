"""mypyc's class options, for the modules the compiled wheel builds
(build_support/oncelog_build.py), without mypy_extensions at run time.

mypyc reads `@mypyc_attr(...)` from the source when it compiles a class;
the decorator itself does nothing at run time. The SDK does not depend on
mypy_extensions (the pure wheel never imports it), so at run time this is
a decorator that returns the class unchanged; mypy and mypyc see
mypy_extensions' own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    def mypyc_attr(*_names: str, **_options: Any) -> Any:
        return lambda cls: cls

__all__ = ["mypyc_attr"]
