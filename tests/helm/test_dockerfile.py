"""The Dockerfile builds the image the chart expects to run.

Goal: the image is multi-stage (a builder with the project installed into a
virtual environment, a runtime stage that copies only that environment); the
runtime stage runs as the non-root uid/gid the chart's security contexts
name; its entrypoint is the interpreter and `-m` the chart's containers
start with, and every module the chart runs is part of what is installed;
the data directory, listen port and metrics port it defaults to are the
chart's; the build context (.dockerignore) holds what the builder copies and
nothing else that matters; and the builder's own steps install exactly the
locked versions of the server's dependencies and a project that starts.

Method: a small parser of the Dockerfile's instructions and the chart's
rendered StatefulSets. No image is built here (building needs a Docker
daemon and the base image from a registry); docs/helm.md says how to build.
The builder's COPY and RUN steps are carried out as written, with their
absolute paths (/src, /opt, /tmp) moved under a temporary directory, on this
machine's Python.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm

from oncelog.wire import VERSION
from tests.helm.chart import CHART_DIR, REPO, containers, render


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        found = self.all(instruction)
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]


def _stages() -> list[Stage]:
    """The Dockerfile's stages, with continuation lines joined and ARG
    defaults of the global scope substituted into FROM."""
    logical: list[str] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif instruction == "FROM":
            words = args.split()
            base = words[0]
            for name, value in global_args.items():
                base = base.replace("${" + name + "}", value)
            stage_name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(base=base, name=stage_name))
        else:
            stages[-1].instructions.append((instruction, args.strip()))
    return stages


def _chart_values() -> dict[str, Any]:
    with helm.Chart.load(CHART_DIR) as chart:
        return chart.values


def test_two_stages_and_only_the_environment_is_copied_across() -> None:
    builder, runtime = _stages()
    assert builder.name == "builder" and runtime.name == "runtime"
    assert builder.base == runtime.base and "slim" in runtime.base
    assert any("python3 -m venv /opt/oncelog" in run for run in builder.all("RUN"))
    # The services' dependencies are the server extra, from the lock.
    assert any("uv export --frozen --no-dev --extra server" in run
               for run in builder.all("RUN"))
    assert runtime.all("COPY") == ["--from=builder /opt/oncelog /opt/oncelog"]


def test_the_runtime_stage_runs_as_the_charts_non_root_user() -> None:
    _, runtime = _stages()
    user, _, group = runtime.last("USER").partition(":")
    assert int(user) != 0 and int(group) != 0
    # USER comes after every RUN, so nothing later runs as root.
    names = [name for name, _ in runtime.instructions]
    assert max(i for i, n in enumerate(names) if n == "RUN") < names.index("USER")
    security = _chart_values()["podSecurityContext"]
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (
        int(user), int(group), int(group))


def test_the_charts_commands_are_the_images_entrypoint() -> None:
    _, runtime = _stages()
    entrypoint = json.loads(runtime.last("ENTRYPOINT"))
    (cmd_module,) = json.loads(runtime.last("CMD"))
    values = _chart_values()
    assert entrypoint == [values["image"]["python"], "-m"]
    rendered = render()
    modules = []
    for _sts, container in containers(rendered):   # etcd runs its own image
        assert container["command"][:2] == entrypoint
        modules.append(container["command"][2])
    assert cmd_module in modules
    # Every module lives in a package the image installs.
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    for module in modules:
        assert module.split(".")[0] in packages, module


def test_the_image_defaults_match_the_chart() -> None:
    _, runtime = _stages()
    env = dict(
        item.split("=", 1) for args in runtime.all("ENV") for item in shlex.split(args)
    )
    values = _chart_values()
    data_dir = values["partitionStore"]["persistence"]["mountPath"]
    assert env["ONCELOG_DATA_DIR"] == data_dir
    assert json.loads(runtime.last("VOLUME")) == [data_dir]
    assert env["ONCELOG_LISTEN"] == f"0.0.0.0:{values['ports']['grpc']}"
    assert env["ONCELOG_METRICS_PORT"] == str(values["ports"]["metrics"])
    assert runtime.last("EXPOSE").split() == [
        str(values["ports"]["grpc"]), str(values["ports"]["metrics"])]
    # The root filesystem is read-only: bytecode is compiled at build time
    # and never written at run time.
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    # Only installed code is importable, whatever the working directory holds.
    assert env["PYTHONSAFEPATH"] == "1"


def test_the_build_context_holds_what_the_builder_copies() -> None:
    builder, _ = _stages()
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path: str) -> bool:
        # .dockerignore: the last matching pattern decides; "!" re-includes.
        verdict = True
        for pattern in patterns:
            negate = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                verdict = negate
        return verdict

    copied = [src for args in builder.all("COPY") for src in args.split()[:-1]]
    assert copied
    for source in copied:
        assert included(source.rstrip("/")), source
        assert (REPO / source).exists(), source
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {pyproject["project"]["readme"], "pyproject.toml", "uv.lock", "requirements/uv.txt",
              *pyproject["build-system"]["backend-path"],
              *(d.split("/")[0] for d in pyproject["tool"]["setuptools"]["package-dir"].values())}
    assert needed <= {s.rstrip("/") for s in copied}
    for unwanted in (".venv", ".git", "tests", "bench", ".venv/bin/python"):
        assert not included(unwanted), unwanted


def _locked_versions() -> dict[str, str]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def test_the_builders_steps_install_the_locked_server(tmp_path: Path) -> None:
    builder, _ = _stages()
    root = tmp_path / "image"
    for directory in ("src", "opt", "tmp"):
        (root / directory).mkdir(parents=True)
    absolute_path = re.compile(r"(?<![\w./-])/(src|opt|tmp)(?=/|\s|$)")

    def here(text: str) -> str:
        return absolute_path.sub(lambda m: f"{root}/{m.group(1)}", text)

    env = {name: value for args in builder.all("ENV")
           for name, _, value in (word.partition("=") for word in shlex.split(args))}
    # The image keeps no download cache; this test may use the machine's.
    env.pop("UV_NO_CACHE")
    workdir = Path(here(builder.last("WORKDIR")))
    for name, args in builder.instructions:
        if name == "COPY":
            *sources, target = args.split()
            for source in sources:
                destination = workdir / target
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, destination,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                else:
                    destination = destination / source if target.endswith("/") else destination
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(REPO / source, destination)
        elif name == "RUN":
            done = subprocess.run(["bash", "-ec", here(args)], cwd=workdir, text=True,
                                  capture_output=True, timeout=600,
                                  env={**os.environ, **env})
            assert done.returncode == 0, f"RUN {args}\n{done.stdout}\n{done.stderr}"
    python = root / "opt" / "oncelog" / "bin" / "python"
    installed = json.loads(subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"] if (python.parent / "pip").exists()
        else [str(root / "opt" / "uv" / "bin" / "uv"), "pip", "list", "--python", str(python),
              "--format", "json"],
        check=True, capture_output=True, text=True).stdout)
    locked = _locked_versions()
    versions = {p["name"].lower().replace("_", "-"): p["version"] for p in installed}
    # The project itself, at the source tree's version.
    assert versions.pop("oncelog") == VERSION
    for name in ("grpcio", "protobuf", "rocksdict", "aetcd", "prometheus-client"):
        assert name in versions, f"{name} is not installed by the builder"
    for name, version in versions.items():
        if name in ("pip", "setuptools"):  # the virtualenv's own, not the project's
            continue
        assert locked.get(name) == version, f"{name} {version} is not the lock's {locked.get(name)}"
    started = subprocess.run([str(python), "-m", "oncelog_server.partition_store", "--help"],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0 and "--listen" in started.stdout, started.stderr
