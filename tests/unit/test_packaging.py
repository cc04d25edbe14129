"""The SDK ships as a typed package (PEP 561).

Goal: a user's type checker reads oncelog's annotations, which it does only
when the installed package holds a `py.typed` marker (and, for the generated
oncelog.v1 modules, their .pyi stubs).

Method: no build. The installed `oncelog` (importlib.resources, so wherever
pip put it, an editable install included) holds py.typed; pyproject.toml
lists it as package data (setuptools before 69 leaves undeclared data out of
a wheel); and every package-data pattern matches a file in its package's
source directory, so a misspelt pattern fails here rather than shipping
nothing.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_config() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["setuptools"]
    return config


def _source_dir(package: str, package_dir: dict[str, str]) -> Path:
    """Where a package's files are in the repository, by the longest
    `package-dir` entry it falls under ('oncelog.v1' -> sdk/oncelog/v1)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        base = ".".join(parts[:n])
        if base in package_dir:
            return ROOT / package_dir[base] / Path(*parts[n:])
    return ROOT / Path(*parts)


def test_the_installed_package_is_marked_typed() -> None:
    assert resources.files("oncelog").joinpath("py.typed").is_file()


def test_pyproject_ships_the_marker() -> None:
    package_data = _setuptools_config().get("package-data", {})
    assert "py.typed" in package_data.get("oncelog", []), package_data


def test_every_package_data_pattern_matches_a_file() -> None:
    config = _setuptools_config()
    package_dir = config.get("package-dir", {})
    unmatched = [
        (package, pattern)
        for package, patterns in config.get("package-data", {}).items()
        for pattern in patterns
        if not any(p.is_file() for p in _source_dir(package, package_dir).glob(pattern))
    ]
    assert not unmatched, f"package-data patterns that match no file: {unmatched}"
