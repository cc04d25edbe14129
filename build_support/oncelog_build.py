"""The build backend: setuptools, with the SDK's hot modules compiled by mypyc.

Why: the producer's per-record path (send(), the accumulator, the record
codec) is Python run once per record; compiled with mypyc (mypy's compiler,
which turns type-annotated modules into C extensions) it costs a fraction
(docs/performance.md). The same .py files are the source of both builds, so
the compiled modules behave as the pure ones do, and the pure ones stay the
reference.

What gets built (PEP 517 hooks, delegated to setuptools.build_meta):

* a wheel, where a C compiler and Python's headers are present: the hot
  modules (HOT_MODULES) compiled, next to every .py file, in a platform
  wheel (cp311-cp311-linux_x86_64, ...); mypy, pinned here, is added to the
  build's requirements for that. Without a compiler: the pure wheel.
* `ONCELOG_COMPILE=0` (or `no`, `false`): the pure wheel (py3-none-any),
  without asking for mypy. `ONCELOG_COMPILE=1`: compiled or a failed build
  (for a release, where silently pure would be a slower package).
* an editable install (`pip install -e .`, `uv sync`): never compiled. It
  runs the .py files of the source tree, so an extension module there would
  shadow every later edit of its .py file; and setuptools builds an editable
  install's extensions in place, next to the sources.
* an sdist: the sources only.

Every build artefact of a compiled build (mypy's cache, mypyc's C files, the
objects and extensions) goes to a temporary directory outside the source
tree, and `build_ext --inplace` is refused: a compiled module in the source
tree would silently shadow its .py file (an extension wins over a .py file in
the same folder).

setup.py calls `setup_options()`; this module is the one place the rules live.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shlex
import shutil
import sysconfig
import tempfile
import warnings
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.dist import Distribution

__all__ = [
    "HOT_MODULES",
    "build_editable",
    "build_sdist",
    "build_wheel",
    "compile_decision",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
    "setup_options",
]

# The switch: auto (the default), 0/no/false, 1/yes/true.
COMPILE_ENV = "ONCELOG_COMPILE"
# The mypy whose mypyc compiles a wheel built with build isolation: the
# version uv.lock holds (tests/integration/test_packaging.py keeps the two
# equal), so the C code does not change with whatever mypy is newest.
MYPYC_REQUIREMENT = "mypy==2.4.1"

# The modules compiled, as paths from the project's root, in two groups
# (one extension each for the group's shared code): the record codec, which
# the services import too and which must not drag the client's modules into
# a service process (tests/unit/test_wire_kernel.py), and the producer's
# per-record path. Every module of a group calls the others of its group
# natively.
WIRE_MODULES = ("sdk/oncelog/wire/records.py",)
CLIENT_MODULES = (
    "sdk/oncelog/_batching.py",
    "sdk/oncelog/_partitioner.py",
    "sdk/oncelog/_request_streams.py",
    "sdk/oncelog/_sender.py",
    "sdk/oncelog/_sequencing.py",
    "sdk/oncelog/producer.py",
)
HOT_MODULES = WIRE_MODULES + CLIENT_MODULES
# The groups' shared libraries, inside the package (a top-level module
# would be one more name in site-packages).
WIRE_GROUP = "oncelog.wire._compiled"
CLIENT_GROUP = "oncelog._compiled"

# mypy's settings for mypyc, not the project's (they name this machine's
# Python version and stub packages): mypy's defaults for the build's Python;
# what the build's environment lacks (grpc, protobuf, ... with build
# isolation) taken as Any; the modules the compiled ones import checked for
# their types but not for errors, and the generated stubs (oncelog.v1) not
# at all (without grpc's stubs their overloads collapse into errors).
MYPY_CONFIG = """\
[mypy]
ignore_missing_imports = True
follow_imports = silent

[mypy-oncelog.v1.*]
ignore_errors = True
"""

# Set while setuptools builds an editable install (build_editable below).
_editable = False


def _switch() -> str:
    value = os.environ.get(COMPILE_ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("0", "no", "false", "off"):
        return "off"
    if value in ("1", "yes", "true", "on"):
        return "on"
    raise ValueError(f"{COMPILE_ENV}={value!r}: expected auto, 0 or 1")


def _missing_toolchain() -> str | None:
    """What is missing to compile C extensions here, or None."""
    cc = sysconfig.get_config_var("CC") or "cc"
    compiler = shlex.split(cc)[0] if cc.strip() else "cc"
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} from sysconfig's CC is not on PATH)"
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        return f"no Python headers ({include}/Python.h; Debian: python3-dev)"
    return None


def compile_decision(*, need_mypyc: bool = True) -> tuple[bool, str]:
    """(compile?, why) for a wheel built now. `need_mypyc` False asks before
    the build's requirements are installed (mypy is one of them)."""
    switch = _switch()
    if _editable:
        return False, "an editable install runs the source tree's .py files"
    if switch == "off":
        return False, f"{COMPILE_ENV}=0"
    missing = _missing_toolchain()
    if missing is None and need_mypyc and importlib.util.find_spec("mypyc") is None:
        missing = f"mypyc is not installed (pip install '{MYPYC_REQUIREMENT}')"
    if missing is not None:
        if switch == "on":
            raise RuntimeError(f"{COMPILE_ENV}=1 but the modules cannot be compiled: {missing}")
        warnings.warn(f"oncelog: building the pure wheel: {missing}", stacklevel=1)
        return False, missing
    return True, "compiled with mypyc"


# ---------------------------------------------------------------- PEP 517 hooks


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    requires: list[str] = _setuptools.get_requires_for_build_wheel(config_settings)
    if compile_decision(need_mypyc=False)[0]:
        requires.append(MYPYC_REQUIREMENT)
    return requires


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    global _editable
    _editable = True
    try:
        name: str = _setuptools.build_editable(wheel_directory, config_settings,
                                               metadata_directory)
    finally:
        _editable = False
    return name


# ---------------------------------------------------------------- setuptools


def _build_base() -> str:
    """A fresh directory for one compiled build, removed when it ends."""
    path = tempfile.mkdtemp(prefix="oncelog-build-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class _CompilingDistribution(Distribution):
    """A distribution with extension modules only while a wheel is being
    built (bdist_wheel, build, build_ext) and they can be compiled: its
    `has_ext_modules` makes that wheel a platform wheel, while an sdist and
    the metadata hooks never run mypyc."""

    _decision: bool | None = None

    def has_ext_modules(self) -> bool:
        if not any(command in ("bdist_wheel", "build", "build_ext")
                   for command in self.commands):
            return False
        if self._decision is None:
            self._decision = compile_decision()[0]
        return self._decision


class build_ext(_build_ext):  # noqa: N801 - setuptools' command name
    """setuptools' build_ext with mypyc's extensions, made here (mypyc runs
    mypy over the SDK first, ~20 s) rather than when setup.py is read."""

    def finalize_options(self) -> None:
        if self.inplace or self.editable_mode:
            raise RuntimeError(
                "oncelog's compiled modules are never built in place: an extension module "
                "next to its .py file would shadow every edit of it "
                "(build a wheel instead, or set ONCELOG_COMPILE=0)")
        from mypyc.build import mypycify

        build = self.get_finalized_command("build")
        target_dir = os.path.join(build.build_base, "mypyc")
        os.makedirs(target_dir, exist_ok=True)
        config = os.path.join(target_dir, "mypy.ini")
        with open(config, "w", encoding="utf-8") as f:
            f.write(MYPY_CONFIG)
        self.distribution.ext_modules = mypycify(
            [
                "--config-file", config,
                "--cache-dir", os.path.join(build.build_base, "mypy-cache"),
                *HOT_MODULES,
            ],
            separate=[(list(WIRE_MODULES), WIRE_GROUP), (list(CLIENT_MODULES), CLIENT_GROUP)],
            target_dir=target_dir,
            opt_level="3",
        )
        super().finalize_options()


def setup_options() -> dict[str, Any]:
    """setup()'s arguments beyond pyproject.toml's: none where nothing is
    compiled (ONCELOG_COMPILE=0, an editable install)."""
    if not compile_decision(need_mypyc=False)[0]:
        return {}
    return {
        "distclass": _CompilingDistribution,
        "cmdclass": {"build_ext": build_ext},
        # The whole build (setuptools' build/ included) outside the sources.
        "options": {"build": {"build_base": _build_base()}},
    }
