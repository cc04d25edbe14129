"""Child processes of a local cluster: free ports, one spawning thread,
signals, their logs, the one error for a port another process holds, and
the record of each service process (ServiceProcess).

Shared by LocalCluster (cluster.py, and its port book, ports.py) and its
etcd members (etcd.py), so that neither imports the other's process helpers.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.wire.process import PortInUse


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a child's log ("" when there is none yet)."""
    if not log_path.exists():
        return ""
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def latest_output(log_path: Path, log_offset: int) -> str:
    """What a child wrote to its log since its latest start began at
    `log_offset` (the log is appended to across restarts)."""
    with open(log_path, "rb") as log_file:
        log_file.seek(log_offset)
        return log_file.read().decode(errors="replace")


def free_port() -> int:
    """A loopback port that was free a moment ago (another process may take
    it before it is bound: LocalCluster.start copes with that)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortTakenError(RuntimeError):
    """A process of a local cluster (a service, or an etcd member: kind
    "etcd") exited because another process holds a port it was given; `taken`
    says which (its number and purpose)."""

    def __init__(self, message: str, *, kind: str, node_id: int, taken: PortInUse) -> None:
        super().__init__(message)
        self.kind = kind
        self.node_id = node_id
        self.taken = taken


class Spawner:
    """Starts every child from one thread that lives as long as the process.

    The children arm PR_SET_PDEATHSIG (see oncelog_local.child), which fires when
    the *thread* that spawned them ends; spawning from a short-lived thread
    (a test's chaos thread, say) would kill the child when that thread ends.
    """

    _lock = threading.Lock()
    _instance: Spawner | None = None

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]],
                                          queue.Queue[object]]] = queue.Queue()
        threading.Thread(target=self._run, name="oncelog-spawner", daemon=True).start()

    @classmethod
    def get(cls) -> Spawner:
        with cls._lock:
            if cls._instance is None:
                cls._instance = Spawner()
            return cls._instance

    def _run(self) -> None:
        while True:
            start, reply = self._requests.get()
            try:
                reply.put(start())
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put(exc)

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        reply: queue.Queue[object] = queue.Queue()
        self._requests.put((start, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]


def kill_process(process: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a child if it runs (SIGCONT first: a paused one must die too), and reap it."""
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def terminate_process(process: subprocess.Popen[bytes] | None, timeout_s: float) -> int:
    """SIGTERM a child if it runs and wait, SIGKILL after timeout_s; its exit
    code (0 for one never started)."""
    if process is None:
        return 0
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


def signal_process(process: subprocess.Popen[bytes] | None, signum: signal.Signals) -> None:
    """Sends a signal to a child that runs (SIGSTOP, SIGCONT)."""
    if process is not None and process.poll() is None:
        process.send_signal(signum)


@dataclass(kw_only=True)
class ChildProcess:
    """A process this module starts, again after each stop (a service, an
    etcd member)."""

    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # Where the output of the latest start begins in its log (the log is
    # appended to across restarts).
    log_offset: int = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class ServiceProcess(ChildProcess):
    """One service of a local cluster: where it listens, its data and log,
    and the command line it starts with (kept across restarts)."""

    kind: str
    node_id: int
    address: str
    metrics_port: int
    data_dir: Path
    log_path: Path
    argv: list[str]
    # The token listener's port on a secured cluster (0: none).
    token_port: int = 0
    # A store's Kafka listener's port (LocalCluster(kafka_listener=True); 0: none).
    kafka_port: int = 0
    # Where its listeners listen (its own address with network="namespaces").
    host: str = "127.0.0.1"

    @property
    def token_address(self) -> str:
        return f"{self.host}:{self.token_port}"

    @property
    def kafka_address(self) -> str:
        return f"{self.host}:{self.kafka_port}"
