"""etcd for local clusters and tests: members on 127.0.0.1, each its own process.

    with EtcdCluster(data_dir, members=3) as etcd:     # starts, waits until healthy
        store = EtcdMetadataStore(etcd.endpoints, timeout_ms=2000)
        etcd.kill(0)                                    # SIGKILL
        etcd.restart(0)                                 # same ports and data dir: rejoins

Ports (client and peer per member) are picked once, free on loopback, and
kept across restarts; once the cluster has started they are written to
`etcd-cluster.json` in data_dir, so a later EtcdCluster on the same data_dir
(`oncelog cluster up` again) starts the same members on the same ports.
A port that another process takes before the very first start gets a fresh
pick (the members' data is thrown away then: it named the old ports).

Each member's data is in data_dir/etcd-<i>, its log (etcd's JSON lines,
appended across restarts) in log_dir/etcd-<i>.log (log_dir defaults to
data_dir). Settings for tests on loopback: heartbeat 50 ms and election
timeout 500 ms (a killed leader is replaced in about a second; etcd's
minimum lease TTL becomes 1 s), a 128 MiB backend quota, history compacted
to the latest 100 000 revisions, a snapshot every 10 000 writes, and no
strict reconfiguration check (wipe below).

Members die with the process that started them (oncelog_local.child arms
PR_SET_PDEATHSIG), and every signal goes to a member's own pid.

`hosts` puts each member on an address of its own instead of 127.0.0.1
(LocalCluster(network="namespaces"): each member in a network namespace,
`child_args(i)` being oncelog_local.child's arguments that enter it), all on the
same fixed ports (NAMESPACED_CLIENT_PORT, NAMESPACED_PEER_PORT); `reach`
maps a member's "host:port" to one this process can connect to (the
harness's relay) for the health probes and the member API.

`wipe(i)` deletes a stopped member's data. In a one-member cluster the next
start bootstraps an empty etcd. In a cluster of three the member is first
removed from the cluster and added again through etcd's member API (that
needs a running member, and the others' quorum): the next start joins it as
a new, empty member, which the leader then brings up to date.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from oncelog.wire.process import PortInUse
from oncelog_local.processes import (
    ChildProcess,
    PortTakenError,
    Spawner,
    free_port,
    kill_process,
    latest_output,
    log_tail,
    signal_process,
    terminate_process,
)

MEMBER_COUNTS = (1, 3)
HEARTBEAT_INTERVAL_MS = 50
ELECTION_TIMEOUT_MS = 500
QUOTA_BACKEND_BYTES = 128 * 1024 * 1024
COMPACTION_RETENTION_REVISIONS = 100_000
SNAPSHOT_COUNT = 10_000
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
# How many times the first start picks fresh ports after a member found one
# of its ports taken by another process.
START_PORT_RETRIES = 5
# How long one health probe or one member-API call may take.
PROBE_TIMEOUT_S = 1.0
# How long wipe() keeps asking the running members to replace a wiped one.
REPLACE_TIMEOUT_S = 15.0
LAYOUT_FILE = "etcd-cluster.json"
# A member alone on its address (`hosts`) takes etcd's usual ports.
NAMESPACED_CLIENT_PORT = 2379
NAMESPACED_PEER_PORT = 2380
MISSING_BINARY = ("the etcd binary was not found on PATH: install Debian's etcd-server "
                  "(apt-get install etcd-server), or run scripts/setup.sh")
# What each of a member's ports is for (PortTakenError.taken.purpose).
ETCD_CLIENT = "etcd client"
ETCD_PEER = "etcd peer"
# etcd's message when it cannot listen.
_PORT_TAKEN = "address already in use"


class EtcdNotInstalled(RuntimeError):
    pass


def _held_port(member: EtcdMember) -> PortInUse:
    """Which of a member's ports another process holds (etcd's message does
    not say): the first that cannot be bound now, else the client port."""
    for port, purpose in ((member.client_port, ETCD_CLIENT), (member.peer_port, ETCD_PEER)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((member.host, port))
            except OSError:
                return PortInUse(purpose, f"{member.host}:{port}")
    return PortInUse(ETCD_CLIENT, f"{member.host}:{member.client_port}")


@dataclass
class EtcdMember(ChildProcess):
    index: int
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def name(self) -> str:
        return f"etcd-{self.index}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class EtcdCluster:
    """etcd members on 127.0.0.1 (module docstring). Not started until
    start() (or `with`)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        members: int = 1,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        pick_port: Callable[[], int] | None = None,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        election_timeout_ms: int = ELECTION_TIMEOUT_MS,
        quota_backend_bytes: int = QUOTA_BACKEND_BYTES,
        etcd_binary: str = "etcd",
        hosts: Sequence[str] | None = None,
        child_args: Callable[[int], list[str]] | None = None,
        reach: Callable[[str], str] | None = None,
    ) -> None:
        if members not in MEMBER_COUNTS:
            raise ValueError(f"members={members}; an etcd cluster here has "
                             f"{' or '.join(map(str, MEMBER_COUNTS))} members")
        if not 0 < heartbeat_interval_ms * 5 <= election_timeout_ms:
            raise ValueError(f"election_timeout_ms {election_timeout_ms} must be at least 5 "
                             f"heartbeats ({heartbeat_interval_ms} ms each), as etcd requires")
        binary = shutil.which(etcd_binary)
        if binary is None:
            raise EtcdNotInstalled(MISSING_BINARY)
        self._binary = binary
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = Path(log_dir).resolve() if log_dir is not None else self.data_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._pick_port = pick_port or free_port
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._election_timeout_ms = election_timeout_ms
        self._quota_backend_bytes = quota_backend_bytes
        if hosts is not None and len(hosts) != members:
            raise ValueError(f"{len(hosts)} hosts for {members} members")
        self._child_args = child_args or (lambda index: [])
        self._reach = reach or (lambda address: address)
        self._layout_path = self.data_dir / LAYOUT_FILE
        layout = self._load_layout(members)
        if layout is not None:
            self._token = str(layout["token"])
            ports = [(int(m["client_port"]), int(m["peer_port"])) for m in layout["members"]]
        elif hosts is not None:
            self._token = f"oncelog-{uuid.uuid4().hex[:12]}"
            ports = [(NAMESPACED_CLIENT_PORT, NAMESPACED_PEER_PORT)] * members
        else:
            self._token = f"oncelog-{uuid.uuid4().hex[:12]}"
            ports = [(self._pick_port(), self._pick_port()) for _ in range(members)]
        self.members = [
            EtcdMember(index=i, client_port=client, peer_port=peer,
                       data_dir=self.data_dir / f"etcd-{i}",
                       log_path=self.log_dir / f"etcd-{i}.log",
                       host="127.0.0.1" if hosts is None else hosts[i])
            for i, (client, peer) in enumerate(ports)
        ]
        # Members that should be running: wait_ready checks these.
        self._expected: set[int] = set()

    def _load_layout(self, members: int) -> dict[str, Any] | None:
        if not self._layout_path.exists():
            return None
        layout = json.loads(self._layout_path.read_text())
        if len(layout["members"]) != members:
            raise ValueError(
                f"{self.data_dir} holds an etcd cluster of {len(layout['members'])} "
                f"members, not {members}; delete the directory to start over")
        return dict(layout)

    @property
    def bootstrapped(self) -> bool:
        """Whether the cluster has started once (its ports are final)."""
        return self._layout_path.exists()

    # ---------------------------------------------------------------- info

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every member's client address, "127.0.0.1:port" (running or not)."""
        return tuple(member.endpoint for member in self.members)

    @property
    def ports(self) -> tuple[int, ...]:
        return tuple(port for m in self.members for port in (m.client_port, m.peer_port))

    def _member(self, index: int) -> EtcdMember:
        if not 0 <= index < len(self.members):
            raise ValueError(f"etcd member {index} does not exist; the cluster has "
                             f"{len(self.members)}")
        return self.members[index]

    def alive(self, index: int) -> bool:
        return self._member(index).alive()

    def pid(self, index: int) -> int | None:
        return self._member(index).pid

    def log_tail(self, index: int, lines: int = 30) -> str:
        return log_tail(self._member(index).log_path, lines)

    # ----------------------------------------------------------- lifecycle

    def _argv(self, member: EtcdMember) -> list[str]:
        initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        # A member with data ignores the --initial-cluster flags. Without: a
        # new cluster, or (wiped, re-added through the member API) joining.
        joining = len(self.members) > 1 and self.bootstrapped
        return [
            self._binary,
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial_cluster,
            "--initial-cluster-state", "existing" if joining else "new",
            "--initial-cluster-token", self._token,
            "--heartbeat-interval", str(self._heartbeat_interval_ms),
            "--election-timeout", str(self._election_timeout_ms),
            "--quota-backend-bytes", str(self._quota_backend_bytes),
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", str(COMPACTION_RETENTION_REVISIONS),
            "--snapshot-count", str(SNAPSHOT_COUNT),
            # etcd refuses to remove or add a member until every member has
            # been connected for 5 s; wipe() replaces a member at once.
            "--strict-reconfig-check=false",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]

    def _spawn(self, member: EtcdMember) -> None:
        if member.alive():
            raise RuntimeError(f"etcd member {member.index} is already running "
                               f"(pid {member.pid})")
        member.log_offset = member.log_path.stat().st_size if member.log_path.exists() else 0
        argv = [sys.executable, "-m", "oncelog_local.child", str(os.getpid()),
                *self._child_args(member.index), *self._argv(member)]
        # etcd reads ETCD_* variables as flags, and complains when both are given.
        env = {key: value for key, value in os.environ.items() if not key.startswith("ETCD_")}

        def start() -> subprocess.Popen[bytes]:
            with open(member.log_path, "ab") as log_file:
                return subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env)

        member.process = Spawner.get().spawn(start)
        self._expected.add(member.index)

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts every member and waits until each is healthy. Before the
        first successful start, a member that finds a port taken makes every
        member start again on fresh ports; later a taken port is an error."""
        running = [str(m.index) for m in self.members if m.alive()]
        if running:
            raise RuntimeError(f"etcd member {', '.join(running)} already running; start() "
                               f"starts a stopped cluster (restart(i) starts one member)")
        try:
            for retry in range(START_PORT_RETRIES + 1):
                for member in self.members:
                    self._spawn(member)
                try:
                    self.wait_ready(timeout_s)
                    break
                except PortTakenError:
                    if self.bootstrapped or retry == START_PORT_RETRIES:
                        raise
                    self._kill_all()
                    for member in self.members:
                        shutil.rmtree(member.data_dir, ignore_errors=True)
                        member.client_port, member.peer_port = self._pick_port(), self._pick_port()
            if not self.bootstrapped:
                self._write_layout()
        except BaseException:
            self._kill_all()
            raise

    def _write_layout(self) -> None:
        layout = {
            "token": self._token,
            "members": [{"client_port": m.client_port, "peer_port": m.peer_port}
                        for m in self.members],
        }
        tmp = self._layout_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(layout, indent=2) + "\n")
        tmp.replace(self._layout_path)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, *,
                   members: Iterable[int] | None = None) -> None:
        """Blocks until every member that should be running (started and not
        stopped since; or those named) answers its /health with true: it is
        up and has a leader. Raises PortTakenError or RuntimeError (with the
        log's tail) when one exited, TimeoutError after timeout_s."""
        pending = sorted(self._expected if members is None
                         else {self._member(i).index for i in members})
        deadline = time.monotonic() + timeout_s
        while True:
            for index in list(pending):
                self._raise_if_exited(self.members[index])
                if self._healthy(self._reach(self.members[index].endpoint)):
                    pending.remove(index)
            if not pending:
                return
            if time.monotonic() > deadline:
                member = self.members[pending[0]]
                raise TimeoutError(
                    f"etcd member {', '.join(map(str, pending))} not healthy after "
                    f"{timeout_s}s (a member is healthy once it has a leader: a majority "
                    f"must run); see {member.log_path}:\n{self.log_tail(member.index)}")
            time.sleep(0.05)

    @staticmethod
    def _healthy(endpoint: str) -> bool:
        """Whether the member at `endpoint` (host:port) says it is healthy."""
        # No proxy: the environment's HTTP proxy must not see loopback probes.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://{endpoint}/health", timeout=PROBE_TIMEOUT_S) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _raise_if_exited(self, member: EtcdMember) -> None:
        if member.alive():
            return
        see = f"see {member.log_path}:\n{self.log_tail(member.index)}"
        output = latest_output(member.log_path, member.log_offset)
        if _PORT_TAKEN in output:
            taken = _held_port(member)
            raise PortTakenError(
                f"etcd member {member.index} cannot listen on port {taken.port} "
                f"({taken.purpose}): another process holds it; {see}",
                kind="etcd", node_id=member.index, taken=taken)
        code = member.process.returncode if member.process is not None else None
        raise RuntimeError(f"etcd member {member.index} exited with {code}; {see}")

    def kill(self, index: int) -> None:
        """SIGKILL: a crash."""
        member = self._member(index)
        self._expected.discard(index)
        kill_process(member.process)

    def _kill_all(self) -> None:
        for member in self.members:
            self.kill(member.index)

    def terminate(self, index: int, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (SIGKILL after timeout_s). Returns the exit code."""
        member = self._member(index)
        self._expected.discard(index)
        return terminate_process(member.process, timeout_s)

    def restart(self, index: int, *, wait: bool = True,
                timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts the member again (killing it first if it runs) with its
        ports and data dir: it rejoins the cluster. wait: until it is healthy,
        which needs a majority of members running."""
        member = self._member(index)
        if member.alive():
            self.kill(index)
        self._spawn(member)
        if wait:
            self.wait_ready(timeout_s, members=[index])

    def pause(self, index: int) -> None:
        """SIGSTOP: the member stops answering but keeps its sockets."""
        signal_process(self._member(index).process, signal.SIGSTOP)

    def resume(self, index: int) -> None:
        signal_process(self._member(index).process, signal.SIGCONT)

    def wipe(self, index: int) -> None:
        """Deletes the data of a member that is not running (module
        docstring: in a cluster of three it is removed and added again)."""
        member = self._member(index)
        if member.alive():
            raise RuntimeError(f"etcd member {index} (pid {member.pid}) is running; kill or "
                               f"terminate it before wiping its data")
        if len(self.members) > 1 and self.bootstrapped:
            self._replace_member(member)
        shutil.rmtree(member.data_dir, ignore_errors=True)

    def _replace_member(self, member: EtcdMember) -> None:
        """Removes the member from the cluster and adds it back with the same
        peer URL, through a running member."""
        import grpc
        from aetcd import rpc as etcd_rpc  # type: ignore[import-untyped]

        others = [m for m in self.members if m is not member and m.alive()]
        # The member just killed may have been etcd's leader: the others
        # answer a change of membership only once they have elected a new
        # one (etcd's election timeout is a second), so each is tried again
        # until REPLACE_TIMEOUT_S has passed.
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        while True:
            failures: list[str] = []  # the last round's
            for other in others:
                with grpc.insecure_channel(self._reach(other.endpoint)) as channel:
                    cluster = etcd_rpc.ClusterStub(channel)
                    try:
                        listed = cluster.MemberList(etcd_rpc.MemberListRequest(),
                                                    timeout=PROBE_TIMEOUT_S)
                        for known in listed.members:
                            if member.peer_url in known.peerURLs:
                                cluster.MemberRemove(etcd_rpc.MemberRemoveRequest(ID=known.ID),
                                                     timeout=PROBE_TIMEOUT_S)
                        cluster.MemberAdd(etcd_rpc.MemberAddRequest(peerURLs=[member.peer_url]),
                                          timeout=PROBE_TIMEOUT_S)
                        return
                    except grpc.RpcError as exc:
                        failures.append(f"through member {other.index}: {exc.code().name}")
            if not others or time.monotonic() > deadline:
                break
            time.sleep(PROBE_TIMEOUT_S / 2)
        raise RuntimeError(
            f"cannot wipe etcd member {member.index}: it must be removed from the cluster "
            f"and added again through a running member, and a majority must run "
            f"({'; '.join(failures) or 'no member is running'}); to start over instead, "
            f"stop() the cluster and delete {self.data_dir}")

    def stop(self) -> None:
        """Graceful stop of every member, one after another. The last of
        several gets a grace of two election timeouts, then SIGKILL: it has
        lost its quorum, and if it led, etcd 3.4 would spend 6 s trying to
        hand the leadership to a member that is gone. Killing it loses
        nothing: etcd fsyncs its log before it acknowledges a write."""
        running = [member for member in self.members if member.alive()]
        for member in running:
            last_of_several = member is running[-1] and len(self.members) > 1
            self.terminate(member.index,
                           2 * self._election_timeout_ms / 1000 if last_of_several
                           else STOP_TIMEOUT_S)

    def __enter__(self) -> EtcdCluster:
        if not any(m.alive() for m in self.members):
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
