"""A real Prometheus (Debian's package, installed by scripts/setup.sh) for
tests: its own process, config and storage in a temporary directory, on a
free loopback port, scraping the given targets every second.

    with PrometheusServer(tmp_path, {"oncelog-partition-store": ["127.0.0.1:9100"]}) as prom:
        prom.wait_targets_up()
        prom.query('up{job="oncelog-partition-store"}')
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from oncelog.testing import free_port

SCRAPE_INTERVAL_S = 1
# How many fresh ports start() tries when another process takes the picked
# one between the pick and Prometheus's bind.
PORT_ATTEMPTS = 5
# Failure guards only: every wait below returns as soon as its condition holds.
READY_DEADLINE_S = 60.0
STOP_DEADLINE_S = 15.0


def find_tool(name: str) -> str:
    """The path of `prometheus` or `promtool` (ONCELOG_<NAME>_BIN overrides);
    fails with what to do when it is missing."""
    override = os.environ.get(f"ONCELOG_{name.upper()}_BIN")
    path = override or shutil.which(name)
    if not path:
        raise RuntimeError(
            f"{name} not found: run `bash scripts/setup.sh` (it installs Debian's prometheus "
            f"package) or set ONCELOG_{name.upper()}_BIN"
        )
    return path


class PromQLError(Exception):
    """Prometheus refused a query (bad syntax, unknown function, ...)."""


class PrometheusServer:
    def __init__(
        self,
        work_dir: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        rule_files: Sequence[Path] = (),
        scrape_interval_s: int = SCRAPE_INTERVAL_S,
    ) -> None:
        """`targets`: scrape job name -> host:port addresses serving /metrics."""
        self.work_dir = work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = work_dir / "prometheus.log"
        self.scrape_interval_s = scrape_interval_s
        config = {
            "global": {
                "scrape_interval": f"{scrape_interval_s}s",
                "scrape_timeout": f"{scrape_interval_s}s",
                "evaluation_interval": f"{scrape_interval_s}s",
            },
            "rule_files": [str(p.resolve()) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
                for job, addresses in targets.items()
            ],
        }
        self.config_path = work_dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Starts Prometheus and waits until it is ready, on a fresh port
        when another process took the picked one before Prometheus bound it."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once()
                return
            except RuntimeError:
                with open(self.log_path, "rb") as log_file:
                    log_file.seek(log_start)
                    taken = f"127.0.0.1:{self.port}: bind: address already in use"
                    if taken not in log_file.read().decode(errors="replace") or (
                        attempt == PORT_ATTEMPTS
                    ):
                        raise
                self.port = free_port()

    def _start_once(self) -> None:
        argv = [
            find_tool("prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            # No console templates: the Debian package's paths are not needed.
            f"--web.console.templates={self.work_dir}",
            f"--web.console.libraries={self.work_dir}",
        ]
        with open(self.log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait("Prometheus ready", self._ready)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _wait(self, what: str, check: Any, deadline_s: float = READY_DEADLINE_S) -> None:
        give_up_at = time.monotonic() + deadline_s
        while not check():
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._process.returncode}:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > give_up_at:
                raise TimeoutError(f"{what}: not after {deadline_s} s\n{self.log_tail()}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            # Not listening yet, or (a socket timeout) something else holds
            # the port: start() finds out when the process exits.
            return False

    # ----------------------------------------------------------------- API

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the `data` of a success, PromQLError otherwise."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result as a list of series (a scalar or string
        result becomes one series without labels)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def wait_targets_up(self, deadline_s: float = READY_DEADLINE_S) -> None:
        """Every configured target scraped successfully at least once."""
        def all_up() -> bool:
            targets = self.targets()
            return bool(targets) and all(t["health"] == "up" for t in targets)
        self._wait("every scrape target up", all_up, deadline_s)

    def wait_scraped_after(self, moment_s: float, scrapes: int = 2,
                           deadline_s: float = READY_DEADLINE_S) -> None:
        """Waits until every target has been scraped `scrapes` times after
        `moment_s` (a time.time()), so what happened before it is in the TSDB
        with at least `scrapes` samples."""
        needed_s = moment_s + (scrapes - 1) * self.scrape_interval_s

        def scraped() -> bool:
            stamps = self.query("timestamp(up)")
            return bool(stamps) and all(float(s["value"][1]) > needed_s for s in stamps)
        self._wait(f"{scrapes} scrapes after the workload", scraped, deadline_s)

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its health and last error."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]
