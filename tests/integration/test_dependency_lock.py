"""The repository's environment is locked, and the lock cannot drift.

Goal: every version the tests run with comes from uv.lock (scripts/setup.sh
installs nothing else), and a change to pyproject.toml's dependencies that
is not followed by a new lock stops the test command with the command that
fixes it, instead of silently running other versions.

Method: the real scripts on copies of the repository's project files in a
temporary directory (the repository itself is never modified): the check
that setup.sh runs (scripts/lib/uv.sh's check_lock) passes on the files as
committed, fails naming `bash scripts/update-deps.sh` once a bound in the
copied pyproject.toml changes, and passes again after that script re-locks
(from uv's cache where it can, else from the package index, as a developer's
re-lock does).
The installed .venv is compared with the lock, package by package, and the
setuptools that builds the project and pyspark at set-up time with the
lock's.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What `uv lock` reads: the project's metadata (its version is dynamic, read
# from the SDK's sources through the build backend in build_support/) and
# the scripts under test.
PROJECT_FILES = ("pyproject.toml", "uv.lock", "README.md", "LICENSE", "requirements",
                 "scripts", "sdk", "services", "spark", "setup.py", "MANIFEST.in",
                 "build_support")
# Failure guard for the subprocesses, not an expectation.
TIMEOUT_S = 300.0


def bash(script: str, *, cwd: Path, offline: bool = True) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    if offline:
        env["UV_OFFLINE"] = "1"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A copy of the project's files, sharing the repository's uv tool."""
    if not (REPO / ".uv-tool" / "bin" / "uv").is_file():
        pytest.fail("the uv tool is missing: run `bash scripts/setup.sh`, which installs it")
    for name in PROJECT_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                          "node_modules"))
        else:
            shutil.copy2(source, tmp_path / name)
    (tmp_path / ".uv-tool").symlink_to(REPO / ".uv-tool")
    return tmp_path


def locked_versions() -> dict[str, set[str]]:
    """Each locked package's versions (more than one where the lock forks
    by Python version, as numpy's does)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    versions: dict[str, set[str]] = {}
    for package in lock["package"]:
        if "version" in package and package["name"] != "oncelog":
            versions.setdefault(normalized(package["name"]), set()).add(package["version"])
    return versions


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_committed_lock_matches_pyproject(project: Path) -> None:
    result = bash(". scripts/lib/uv.sh && check_lock", cwd=project)
    assert result.returncode == 0, result.stderr


def test_a_bound_changed_without_a_new_lock_fails_with_the_fix(project: Path) -> None:
    pyproject = project / "pyproject.toml"
    text = pyproject.read_text()
    assert '"pytest-timeout>=2.4"' in text
    pyproject.write_text(text.replace('"pytest-timeout>=2.4"', '"pytest-timeout>=2.3"'))

    refused = bash(". scripts/lib/uv.sh && check_lock", cwd=project)
    assert refused.returncode != 0
    assert "run 'bash scripts/update-deps.sh'" in refused.stderr

    relocked = bash("bash scripts/update-deps.sh", cwd=project)
    if relocked.returncode != 0:
        # Re-locking reads the package index's pages for every Python the lock
        # covers; uv's cache may not hold them all, so this step may go online
        # (as a developer's re-lock does).
        relocked = bash("bash scripts/update-deps.sh", cwd=project, offline=False)
    assert relocked.returncode == 0, relocked.stderr
    assert "now run: bash scripts/test.sh" in relocked.stdout
    accepted = bash(". scripts/lib/uv.sh && check_lock", cwd=project)
    assert accepted.returncode == 0, accepted.stderr
    # The new lock records the new bound; the versions it holds are kept.
    assert 'specifier = ">=2.3"' in (project / "uv.lock").read_text()
    new = tomllib.loads((project / "uv.lock").read_text())
    kept: dict[str, set[str]] = {}
    for package in new["package"]:
        if package["name"] != "oncelog":
            kept.setdefault(normalized(package["name"]), set()).add(package["version"])
    assert kept == locked_versions()


def test_the_environment_is_exactly_the_lock() -> None:
    """What the tests run with: every installed distribution at its locked
    version, and nothing the lock does not name."""
    locked = locked_versions()
    installed = {normalized(dist.metadata["Name"]): dist.version
                 for dist in importlib.metadata.distributions()
                 if dist.metadata["Name"] is not None}
    installed.pop("oncelog", None)
    off_lock = {name: version for name, version in installed.items()
                if version not in locked.get(name, set())}
    assert off_lock == {}


def test_builds_use_the_locked_setuptools() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    constraints = pyproject["tool"]["uv"]["build-constraint-dependencies"]
    assert constraints == [f"setuptools=={version}"
                           for version in sorted(locked_versions()["setuptools"])]
