"""What `pip install oncelog` gives a user, from the wheel this repository builds.

Goal: the SDK installs lean — the wheel's own dependencies are the client's
(grpcio, protobuf, googleapis-common-protos, crc32c, cramjam); the services' (RocksDB,
Prometheus, etcd, gRPC's health/reflection/status helpers) and Spark's come
only with the `server` and `spark` extras — and an SDK-only install works
against a cluster run from a full install (`oncelog[server]`). Nothing lands
in site-packages under a generic name: the services are `oncelog_server`,
never `services`, and they import each other relatively so that the same
files run under both names (`services.*` from this repository's root). The
wheel holds every module of the source tree, the `py.typed` marker and the
LICENSE, and tells its version (`oncelog.__version__`, `oncelog --version`).
It comes in two builds from the same sources: where a C compiler is present
the SDK's hot modules are compiled by mypyc into a platform wheel, and
`ONCELOG_COMPILE=0` builds the pure `py3-none-any` wheel; each holds what it
says (every compiled module an extension, or none at all), and neither
build, nor the editable development install, ever leaves a compiled module
in the source tree, where it would shadow its edited .py file.

Method: build the pure wheel from a copy of the sources with this
environment's (locked) setuptools (`ONCELOG_COMPILE=0 uv build
--no-build-isolation`); take the compiled wheel that scripts/compiled-venv.sh
built the same way from the current sources (it checks its stamp) rather
than compiling a second time; make two fresh virtual environments without
system site-packages, and install into one the compiled wheel alone and into
the other the pure wheel with the `server` extra. Their
dependencies are held to the versions of uv.lock (`uv export` as
constraints), so what the fresh installs run is locked too, and come from
uv's cache, which scripts/setup.sh filled with exactly those files (the
package index is asked only if the cache was emptied). The full install
starts a LocalCluster of its own (from a working directory outside this
repository, so only installed packages can be imported); the SDK-only install
produces to it and consumes back. It also checks that what needs an extra
says which one when it is missing: `import oncelog_spark` without pyspark and
pyarrow, and a service started without the `server` extra. The
relative-import rule is also checked on the source tree with ast. The
editable install in .venv must import the source tree's .py files, and
compiling in place (`setup.py build_ext --inplace`) must be refused.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oncelog.wire import VERSION

REPO = Path(__file__).resolve().parents[2]
# Installed package name -> its folder in the source tree.
SOURCES = {
    "oncelog": REPO / "sdk" / "oncelog",
    "oncelog_local": REPO / "sdk" / "oncelog_local",
    "oncelog_spark": REPO / "spark" / "oncelog_spark",
    "oncelog_server": REPO / "services",
}
# What the wheel is built from (pyproject.toml names README.md and LICENSE;
# setup.py, MANIFEST.in and build_support/ are the build backend).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE",
                "build_support", "sdk", "spark", "services")
# What build_support/oncelog_build.py compiles, as importable names, and the
# shared library of each of its two groups.
COMPILED_MODULES = ("oncelog.wire.records", "oncelog._batching", "oncelog._partitioner",
                    "oncelog._request_streams", "oncelog._sender", "oncelog._sequencing",
                    "oncelog.producer")
COMPILED_GROUPS = ("oncelog.wire._compiled__mypyc", "oncelog._compiled__mypyc")
# Importable only with an extra: the services' and Spark's dependencies.
SERVER_ONLY = ("rocksdict", "prometheus_client", "aetcd", "grpc_health", "grpc_reflection",
               "grpc_status")
SPARK_ONLY = ("pyspark", "pyarrow", "pandas")
# Failure guards for subprocesses, not expectations.
PIP_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 120.0


def run(argv: list[str], *, cwd: Path, timeout_s: float = RUN_TIMEOUT_S,
        env: dict[str, str] | None = None) -> str:
    """Runs a command and returns its stdout; fails the test with its output."""
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout_s, check=False)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited with {result.returncode}:\n"
                    f"{result.stdout}\n{result.stderr}")
    return result.stdout


def user_env() -> dict[str, str]:
    """The environment of a user's shell: nothing of this test run's import
    path or virtual environment."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        found = list(self.root.glob("lib/python3*/site-packages"))
        assert len(found) == 1, found
        return found[0]

    def run(self, code: str, *, cwd: Path) -> str:
        return run([str(self.python), "-c", textwrap.dedent(code)], cwd=cwd, env=user_env())


def uv() -> str:
    """The uv that scripts/setup.sh installed (requirements/uv.txt)."""
    path = REPO / ".uv-tool" / "bin" / "uv"
    found = str(path) if path.is_file() else shutil.which("uv")
    if found is None:
        pytest.fail(f"{path} is missing: run `bash scripts/setup.sh`, which installs it")
    return found


def uv_env() -> dict[str, str]:
    return {**user_env(), "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1"}


def make_venv(root: Path, requirement: str, constraints: Path) -> Venv:
    """A fresh venv (no system site-packages, no pip) holding `requirement`,
    every dependency at its version in uv.lock."""
    run([uv(), "venv", "--quiet", "--python", sys.executable, str(root)], cwd=root.parent,
        env=uv_env())
    venv = Venv(root)
    install = [uv(), "pip", "install", "--quiet", "--python", str(venv.python),
               "--constraint", str(constraints), requirement]
    # uv's cache holds every locked file once scripts/setup.sh has run.
    offline = subprocess.run([*install, "--offline"], cwd=root.parent, env=uv_env(),
                             capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    if offline.returncode != 0:
        run(install, cwd=root.parent, timeout_s=PIP_TIMEOUT_S, env=uv_env())
    return venv


def copy_sources(dest: Path) -> Path:
    """The build's inputs copied to `dest` (a build writes build/ and
    egg-info next to what it builds, never into the repository)."""
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pure wheel (ONCELOG_COMPILE=0), built from a copy of the sources."""
    src = copy_sources(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    run([uv(), "build", "--quiet", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", str(dist), str(src)], cwd=src, timeout_s=PIP_TIMEOUT_S,
        env={**uv_env(), "ONCELOG_COMPILE": "0"})
    wheels = list(dist.glob("oncelog-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def compiled_wheel() -> Path:
    """The compiled wheel that scripts/compiled-venv.sh built from a copy of
    the current sources (`ONCELOG_COMPILE=1 uv build --no-build-isolation`,
    as above); compiling takes about a minute, so it is not done twice."""
    check = subprocess.run(["bash", "scripts/compiled-venv.sh", "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if check.returncode != 0:
        pytest.fail(f"{check.stdout}{check.stderr}")
    wheels = list((REPO / ".venv-compiled" / "dist").glob("oncelog-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package of uv.lock at its locked version, as pip-style constraints."""
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    path.write_text(run([uv(), "export", "--quiet", "--frozen", "--all-extras", "--no-hashes",
                         "--no-emit-project", "--no-header", "--format", "requirements-txt"],
                        cwd=REPO, env=uv_env()))
    return path


@pytest.fixture(scope="module")
def sdk_venv(compiled_wheel: Path, constraints: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The compiled wheel alone."""
    return make_venv(tmp_path_factory.mktemp("sdk") / "venv", str(compiled_wheel), constraints)


@pytest.fixture(scope="module")
def server_bootstrap(wheel: Path, constraints: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A LocalCluster run by a full install (`oncelog[server]`, the pure
    wheel) in a venv of its own; its address. It stops when its stdin
    closes."""
    venv = make_venv(tmp_path_factory.mktemp("server") / "venv", f"{wheel}[server]",
                     constraints)
    workdir = tmp_path_factory.mktemp("server-cwd")
    script = textwrap.dedent("""
        import importlib.util, sys
        # Only the installed packages can be imported from here.
        assert importlib.util.find_spec("services") is None
        import oncelog.wire.records
        # The pure wheel: the .py files.
        assert oncelog.wire.records.__file__.endswith(".py"), oncelog.wire.records.__file__
        from oncelog.testing import LocalCluster
        with LocalCluster() as cluster:
            print(cluster.bootstrap, flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([str(venv.python), "-c", script], cwd=workdir, env=user_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    bootstrap = proc.stdout.readline().strip()
    if not bootstrap:
        proc.kill()
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        pytest.fail(f"the full install's LocalCluster did not start:\n{err}")
    try:
        yield bootstrap
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_services_import_each_other_relatively() -> None:
    """An absolute `services.` import inside services/ would load a second
    copy of a module under the other name in a service process (or fail
    where only `oncelog_server` is installed)."""
    offenders = []
    for path in sorted((REPO / "services").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] in ("services", "oncelog_server")]
    assert offenders == []


def check_wheel_contents(wheel: Path) -> set[str]:
    """What both builds hold: every module of the source tree under its
    installed name, py.typed, the LICENSE, the dependencies and the pytest
    plugin. Returns the wheel's file names."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"oncelog-{VERSION}.dist-info/METADATA").decode()
        entry_points = archive.read(f"oncelog-{VERSION}.dist-info/entry_points.txt").decode()
    expected = {
        f"{package}/{path.relative_to(source).as_posix()}"
        for package, source in SOURCES.items()
        for path in source.rglob("*")
        if path.is_file() and path.suffix in (".py", ".pyi", ".typed")
    }
    assert expected - names == set(), "add the missing packages to pyproject.toml's list"
    assert "oncelog/py.typed" in names
    assert f"oncelog-{VERSION}.dist-info/licenses/LICENSE" in names
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"oncelog", "oncelog_local", "oncelog_spark", "oncelog_server",
                         f"oncelog-{VERSION}.dist-info"}
    unconditional = sorted(re.split(r"[<>=!~;\[ ]", line.removeprefix("Requires-Dist: "))[0]
                           for line in metadata.splitlines()
                           if line.startswith("Requires-Dist: ") and "extra ==" not in line)
    assert unconditional == ["cramjam", "crc32c", "googleapis-common-protos", "grpcio", "protobuf"]
    assert "oncelog = oncelog.pytest_plugin" in entry_points
    return names


def test_the_pure_wheel_holds_the_source_tree_and_nothing_compiled(wheel: Path) -> None:
    names = check_wheel_contents(wheel)
    assert wheel.name == f"oncelog-{VERSION}-py3-none-any.whl"
    assert [name for name in names if not name.endswith((".py", ".pyi", ".typed"))
            and ".dist-info/" not in name] == []


def test_the_compiled_wheel_holds_every_hot_module_compiled(compiled_wheel: Path) -> None:
    names = check_wheel_contents(compiled_wheel)
    tag = compiled_wheel.name.removeprefix(f"oncelog-{VERSION}-").removesuffix(".whl")
    interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert tag.startswith(f"{interpreter}-{interpreter}-"), compiled_wheel.name
    assert "none-any" not in tag
    extensions = {name.split(".")[0] for name in names if name.endswith(".so")}
    assert extensions == {m.replace(".", "/") for m in COMPILED_MODULES + COMPILED_GROUPS}
    with zipfile.ZipFile(compiled_wheel) as archive:
        wheel_info = archive.read(f"oncelog-{VERSION}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in wheel_info


def test_the_sdk_alone_installs_lean_and_says_its_version(sdk_venv: Venv,
                                                          tmp_path: Path) -> None:
    report = json.loads(sdk_venv.run(f"""
        import importlib, importlib.util, json
        import oncelog
        from oncelog import Admin, Consumer, Producer
        try:
            import oncelog.testing
            testing = "imported"
        except ModuleNotFoundError as exc:
            testing = str(exc)
        print(json.dumps({{
            "version": oncelog.__version__,
            "missing": [m for m in {SERVER_ONLY + SPARK_ONLY!r}
                        if importlib.util.find_spec(m) is None],
            "testing": testing,
            "files": [importlib.import_module(m).__file__ for m in {COMPILED_MODULES!r}],
        }}))
    """, cwd=tmp_path))
    assert report["version"] == VERSION
    # The compiled wheel's modules are the extensions, not their .py files.
    assert all(f.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
               for f in report["files"]), report["files"]
    assert report["missing"] == list(SERVER_ONLY + SPARK_ONLY)
    assert "pip install 'oncelog[server]'" in report["testing"]
    cli = run([str(sdk_venv.root / "bin" / "oncelog"), "--version"], cwd=tmp_path,
              env=user_env())
    assert cli.strip() == f"oncelog {VERSION}"
    site = sdk_venv.site_packages
    assert not (site / "services").exists()
    assert (site / "oncelog" / "py.typed").is_file()
    record = (site / f"oncelog-{VERSION}.dist-info" / "RECORD").read_text()
    ours = {line.split(",")[0].split("/")[0] for line in record.splitlines()}
    # What else the RECORD lists is outside site-packages: the console script.
    assert {name for name in ours if not name.startswith("..")} == {
        "oncelog", "oncelog_local", "oncelog_server", "oncelog_spark",
        f"oncelog-{VERSION}.dist-info"}


def test_the_sdk_alone_produces_to_and_consumes_from_a_full_install(
    sdk_venv: Venv, server_bootstrap: str, tmp_path: Path,
) -> None:
    out = sdk_venv.run(f"""
        from oncelog import Admin, Consumer, Producer, TopicPartition
        bootstrap = {server_bootstrap!r}
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic("lean", partitions=2)
        with Producer(bootstrap=bootstrap, transactional_id="lean-tx") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            sent = [producer.send("lean", key=b"k", value=str(i).encode()) for i in range(5)]
            producer.commit_transaction()
        metas = [f.result() for f in sent]
        tp = TopicPartition("lean", metas[0].partition)
        with Consumer(bootstrap=bootstrap, group_id="lean-group") as consumer:
            consumer.assign([tp])
            consumer.seek(tp, 0)
            values = []
            while len(values) < 5:
                values += [r.value.decode() for r in consumer.poll(timeout=1.0)]
            consumer.commit()
            print(",".join(values), consumer.committed([tp])[tp])
    """, cwd=tmp_path)
    values, committed = out.split()
    assert values == "0,1,2,3,4"
    # Past the five records (and past the commit marker if it was fetched).
    assert int(committed) >= 5


def test_what_needs_an_extra_names_it(sdk_venv: Venv, tmp_path: Path) -> None:
    """The SDK alone has neither Spark nor the services' packages: importing
    oncelog_spark, or starting a service, says which extra to install."""
    report = json.loads(sdk_venv.run("""
        import json
        try:
            import oncelog_spark
            spark = "imported"
        except ModuleNotFoundError as exc:
            spark = str(exc)
        print(json.dumps({"spark": spark}))
    """, cwd=tmp_path))
    assert "pip install 'oncelog[spark]'" in report["spark"]
    for service in ("partition_store", "coordinator", "group_coordinator"):
        result = subprocess.run([str(sdk_venv.python), "-m", f"oncelog_server.{service}",
                                 "--help"], cwd=tmp_path, env=user_env(), capture_output=True,
                                text=True, timeout=RUN_TIMEOUT_S, check=False)
        assert result.returncode != 0, result.stdout
        assert "pip install 'oncelog[server]'" in result.stderr, result.stderr
        # It names the packages missing.
        assert "rocksdict" in result.stderr


def test_the_development_install_runs_the_source_tree() -> None:
    """.venv's editable install imports the .py files under sdk/, and no
    build has left a compiled module anywhere in the tree to shadow one."""
    for module in COMPILED_MODULES:
        path = Path(str(importlib.import_module(module).__file__))
        assert path.suffix == ".py" and path.is_relative_to(REPO / "sdk"), path
    compiled = [str(path.relative_to(REPO)) for folder in SOURCES.values()
                for path in folder.rglob("*")
                if path.suffix in (".so", ".pyd", ".c") or "__mypyc" in path.name]
    assert compiled == []


def test_compiling_in_place_is_refused(tmp_path: Path) -> None:
    """`setup.py build_ext --inplace` would put the extensions next to the
    .py files: the build refuses before compiling anything."""
    src = tmp_path / "src"
    src.mkdir()
    copy_sources(src)
    result = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=src,
                            env={**user_env(), "ONCELOG_COMPILE": "1"}, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert result.returncode != 0
    assert "never built in place" in result.stderr
    assert list(src.rglob("*.so")) == []


def test_the_build_compiles_with_the_locked_mypy() -> None:
    """A wheel built with build isolation asks for the mypy of uv.lock, so
    the C code it compiles does not change with the newest mypy. (The
    backend's constant is read from its source: importing it here would
    import setuptools, which puts its vendored packages on this run's path.)"""
    backend = ast.parse((REPO / "build_support" / "oncelog_build.py").read_text())
    pinned = [node.value.value for node in backend.body
              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
              and any(isinstance(t, ast.Name) and t.id == "MYPYC_REQUIREMENT"
                      for t in node.targets)]
    with (REPO / "uv.lock").open("rb") as f:
        locked = {p["version"] for p in tomllib.load(f)["package"] if p["name"] == "mypy"}
    assert [f"mypy=={v}" for v in sorted(locked)] == pinned
