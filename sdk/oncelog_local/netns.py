"""Real network partitions for LocalCluster(network="namespaces").

Every process of the cluster (stores, coordinators, group coordinators, etcd
members) runs in a network namespace of its own, and so do the test's
clients (one client namespace) and the harness's own checks (one harness
namespace). Each namespace has one veth interface, `eth0`, with an address
in a private /24 (SUBNET); the other ends of the veth pairs are ports of a
bridge that lives in a namespace of its own. Nothing is added to the
namespace the harness runs in: the subnet exists only inside these
namespaces, so runs in parallel on one machine (each with the same subnet)
cannot see each other, and no route or address of the host changes.

    network = NamespaceNetwork()                # refuses to start: NamespacesUnavailable
    host = network.add("partition_store", 0)    # "10.77.0.10"
    network.cut([("partition_store", 0)], [("etcd", 0)], one_way=True)
    network.heal()
    network.close()

Faults. A cut of A from B drops A's packets at B: a policy rule in B's
namespace, `ip rule add pref 10 from A iif eth0 blackhole`, silently
discards what arrives from A (the kernel has no netem; iptables is not
installed). Drops happen at the receiver on purpose: a blackhole or prohibit
*route* in the sender's namespace makes the sender's connect() fail at once
(EINVAL, EACCES), which no real partition does; a real one leaves
connections hanging until a timeout, and that is what the services must
survive. So a one-way cut (A's packets to B dropped, B's to A pass) breaks
A's new TCP connections to B and the data A sends on old ones, while B's
datagrams still reach A; B's connections to A hang too, because A's answers
are dropped, as with a one-way loss on a real network. The local routing
table is looked up after these rules (moved from priority 0 to 100 in every
namespace), or the rules would never see packets addressed to the namespace
itself. Cuts are rules, not interface changes, so established connections
see the loss at once and heal() restores them without a reconnect.

The harness namespace is never cut: LocalCluster's health checks, Metadata
reads and etcd probes reach every process through it (a relay: a listening
socket on 127.0.0.1 in the caller's namespace, each connection carried on
from a thread that has entered the harness namespace), so a test can watch
an isolated process.

Names carry a prefix and the owner's pid (`oncelog-<pid>-<n>-<role>`, n
numbering the owner's networks); a new
NamespaceNetwork first deletes the namespaces of owners that no longer run
(a crashed earlier run), and close() deletes its own.

    python -m oncelog_local.netns call    # internal: run_callable's child side
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import pickle
import runpy
import shutil
import socket
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oncelog_local.child import enter_network_namespace

PREFIX = "oncelog"
SUBNET = ipaddress.IPv4Network("10.77.0.0/24")
BRIDGE = "br0"
INTERFACE = "eth0"
# Policy rule priorities: cuts come before the local table (moved from 0).
CUT_RULE_PREF = 10
LOCAL_RULE_PREF = 100
# The never-cut namespace of the harness's own checks, and the clients'.
HARNESS = ("harness", 0)
CLIENT = ("client", 0)
# How long one `ip` command may take.
IP_TIMEOUT_S = 30.0
# How long the relay waits for a connection inside the namespaces.
RELAY_CONNECT_TIMEOUT_S = 5.0
RELAY_CHUNK_BYTES = 64 * 1024

Member = tuple[str, int]


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, no
    CAP_SYS_ADMIN); the message says which."""


def _run_ip(args: Sequence[str], *, namespace: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                           f"{done.stderr.strip()}")
    return done


def check_available() -> None:
    """Raises NamespacesUnavailable, saying why, where network namespaces
    cannot be made (the probe namespace it makes is deleted at once)."""
    if sys.platform != "linux":
        raise NamespacesUnavailable(
            f"network='namespaces' needs Linux network namespaces; this is {sys.platform}")
    if shutil.which("ip") is None:
        raise NamespacesUnavailable(
            "network='namespaces' needs the `ip` command (Debian's iproute2 package), "
            "which is not on PATH")
    if os.geteuid() != 0:
        raise NamespacesUnavailable(
            f"network='namespaces' makes network namespaces, veth pairs and a bridge, "
            f"which needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); this process runs as "
            f"uid {os.geteuid()}")
    probe = f"{PREFIX}-{os.getpid()}-probe"
    done = _run_ip(["netns", "add", probe], check=False)
    if done.returncode != 0:
        raise NamespacesUnavailable(
            f"network='namespaces' cannot make a network namespace here "
            f"(`ip netns add {probe}`: {done.stderr.strip()}); a container needs "
            f"CAP_SYS_ADMIN for it")
    _run_ip(["netns", "delete", probe], check=False)


def _owner_pid(name: str) -> int | None:
    """The owner's pid in one of our namespace names, None for another name."""
    parts = name.split("-", 2)
    if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
        return None
    return int(parts[1])


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    """Every named network namespace (`ip netns list`)."""
    done = _run_ip(["netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Deletes the namespaces of owners that no longer run (a harness that
    crashed or was killed before close()); returns their names."""
    stale = [name for name in list_namespaces()
             if (pid := _owner_pid(name)) is not None and not _running(pid)]
    for name in stale:
        _run_ip(["netns", "delete", name], check=False)
    return stale


class _Relay:
    """127.0.0.1:port in the caller's namespace -> one address inside the
    harness namespace. One thread accepts; each connection gets two pump
    threads (management traffic only: health checks, Metadata, probes)."""

    def __init__(self, namespace: str, target: tuple[str, int]) -> None:
        self._namespace = namespace
        self._target = target
        # Bound before the accept thread enters the namespace: the listening
        # socket stays where the harness runs.
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, name=f"netns-relay-{target[0]}:{target[1]}",
                         daemon=True).start()

    def _accept(self) -> None:
        enter_network_namespace(self._namespace)
        while not self._closed:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            try:
                outbound = socket.create_connection(self._target,
                                                    timeout=RELAY_CONNECT_TIMEOUT_S)
                outbound.settimeout(None)
            except OSError:
                inbound.close()
                continue
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(RELAY_CHUNK_BYTES):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            # Either side closing ends both directions.
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


# Numbers the networks of one owner: a run makes several clusters.
_network_numbers = itertools.count()


class NamespaceNetwork:
    """The namespaces, bridge and cuts of one cluster (module docstring).
    Members are (kind, index) pairs; CLIENT and HARNESS exist from the
    start. Thread-safe."""

    def __init__(self) -> None:
        check_available()
        remove_stale()
        self.owner_pid = os.getpid()
        self._number = next(_network_numbers)
        self._lock = threading.RLock()
        self._hosts = iter(SUBNET.hosts())
        self._members: dict[Member, tuple[str, str]] = {}  # member -> (namespace, address)
        # (receiving member, sending member): the receiver drops the sender's packets.
        self._drops: set[tuple[Member, Member]] = set()
        self._relays: dict[str, _Relay] = {}
        self._closed = False
        self.bridge_namespace = self._name("bridge")
        try:
            _run_ip(["netns", "add", self.bridge_namespace])
            _run_ip(["link", "add", BRIDGE, "type", "bridge"], namespace=self.bridge_namespace)
            _run_ip(["link", "set", BRIDGE, "up"], namespace=self.bridge_namespace)
            # The bridge itself has no address: the harness takes the first.
            self.add(*HARNESS)
            self.add(*CLIENT)
        except BaseException:
            self.close()
            raise
        # A run that ends without close() (a test that never stopped its
        # cluster) still leaves nothing; a crashed one, until the next start.
        atexit.register(self.close)

    def _name(self, role: str) -> str:
        return f"{PREFIX}-{self.owner_pid}-{self._number}-{role}"

    # ----------------------------------------------------------- members

    def add(self, kind: str, index: int) -> str:
        """Makes the member's namespace, veth pair and address; returns the
        address. Idempotent."""
        member = (kind, index)
        with self._lock:
            if self._closed:
                raise RuntimeError("this network was closed")
            if member in self._members:
                return self._members[member][1]
            try:
                host = str(next(self._hosts))
            except StopIteration:
                raise RuntimeError(f"the subnet {SUBNET} has no address left for {kind} "
                                   f"{index}") from None
            namespace = self._name(f"{kind}-{index}")
            port = f"v{len(self._members)}"
            _run_ip(["netns", "add", namespace])
            self._members[member] = (namespace, host)
            _run_ip(["link", "add", port, "type", "veth", "peer", "name", INTERFACE,
                     "netns", namespace], namespace=self.bridge_namespace)
            _run_ip(["link", "set", port, "master", BRIDGE], namespace=self.bridge_namespace)
            _run_ip(["link", "set", port, "up"], namespace=self.bridge_namespace)
            for args in (
                ["addr", "add", f"{host}/{SUBNET.prefixlen}", "dev", INTERFACE],
                ["link", "set", INTERFACE, "up"],
                ["link", "set", "lo", "up"],
                # Cut rules must come before the local table (module docstring):
                # add its new place first, so there is no moment without it.
                ["rule", "add", "pref", str(LOCAL_RULE_PREF), "lookup", "local"],
                ["rule", "del", "pref", "0"],
            ):
                _run_ip(args, namespace=namespace)
            return host

    def _member(self, member: Member) -> tuple[str, str]:
        kind, index = member
        with self._lock:
            found = self._members.get((kind, index))
        if found is None:
            raise ValueError(f"{kind} {index} is not in this network (it has "
                             f"{sorted(self._members)})")
        return found

    def namespace(self, kind: str, index: int = 0) -> str:
        return self._member((kind, index))[0]

    def host(self, kind: str, index: int = 0) -> str:
        return self._member((kind, index))[1]

    @property
    def members(self) -> list[Member]:
        with self._lock:
            return sorted(self._members)

    def child_args(self, kind: str, index: int = 0) -> list[str]:
        """oncelog_local.child's arguments that start a command in the member's namespace."""
        return ["--netns", self.namespace(kind, index)]

    # ------------------------------------------------------------ faults

    def cut(self, side_a: Iterable[Member], side_b: Iterable[Member], *,
            one_way: bool = False) -> None:
        """Drops every packet from A to B (and from B to A unless one_way).
        Cuts add up; heal() undoes them all. The harness namespace cannot be
        cut."""
        a_side = [tuple(m) for m in side_a]
        b_side = [tuple(m) for m in side_b]
        for member in (*a_side, *b_side):
            if member == HARNESS:
                raise ValueError("the harness namespace is never cut: LocalCluster "
                                 "checks every process through it")
            self._member(member)  # type: ignore[arg-type]
        overlap = set(a_side) & set(b_side)
        if overlap:
            raise ValueError(f"{sorted(overlap)} on both sides of the cut")
        pairs = [(b, a) for a in a_side for b in b_side]
        if not one_way:
            pairs += [(a, b) for a in a_side for b in b_side]
        with self._lock:
            for receiver, sender in pairs:
                self._drop(receiver, sender)  # type: ignore[arg-type]

    def isolate(self, kind: str, index: int = 0) -> None:
        """Cuts the member off from every other member, clients included
        (both ways); the harness still reaches it."""
        member = (kind, index)
        others = [m for m in self.members if m not in (member, HARNESS)]
        self.cut([member], others)

    def _drop(self, receiver: Member, sender: Member) -> None:
        if (receiver, sender) in self._drops:
            return
        namespace, _ = self._member(receiver)
        _, source = self._member(sender)
        _run_ip(["rule", "add", *self._rule(source)], namespace=namespace)
        self._drops.add((receiver, sender))

    @staticmethod
    def _rule(source: str) -> list[str]:
        return ["pref", str(CUT_RULE_PREF), "from", source, "iif", INTERFACE, "blackhole"]

    def heal(self) -> None:
        """Undoes every cut."""
        with self._lock:
            for receiver, sender in sorted(self._drops):
                namespace, _ = self._member(receiver)
                _, source = self._member(sender)
                _run_ip(["rule", "del", *self._rule(source)], namespace=namespace)
            self._drops.clear()

    @property
    def cuts(self) -> list[tuple[Member, Member]]:
        """(sender, receiver) of every one-way drop in place."""
        with self._lock:
            return sorted((sender, receiver) for receiver, sender in self._drops)

    # ------------------------------------------------------------ access

    def reach(self, address: str) -> str:
        """A 127.0.0.1 address in the caller's namespace that carries each
        connection to `address` ("host:port" inside the network) from the
        harness namespace, which no cut touches."""
        host, _, port = address.rpartition(":")
        with self._lock:
            relay = self._relays.get(address)
            if relay is None:
                relay = self._relays[address] = _Relay(self.namespace(*HARNESS),
                                                       (host, int(port)))
            return relay.address

    def close(self) -> None:
        """Deletes every namespace of this network (processes in them should
        be stopped first: a namespace lives on while a process is in it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for relay in self._relays.values():
                relay.close()
            self._relays.clear()
            names = [namespace for namespace, _ in self._members.values()]
            for name in [*names, self.bridge_namespace]:
                _run_ip(["netns", "delete", name], check=False)
            self._members.clear()
            self._drops.clear()


# ------------------------------------------------------------------ callables


def run_callable(
    spawn: Callable[[list[str], dict[str, str]], subprocess.Popen[bytes]],
    namespace: str, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], *,
    timeout_s: float | None,
) -> Any:
    """Runs fn(*args, **kwargs) in a fresh Python and returns its result
    (both pickled: fn must be importable by name, e.g. a module's top-level
    function; one of the script that runs as __main__ too, which the child
    loads without running what its `if __name__ == "__main__":` guards).
    An exception in fn is raised here again (as RuntimeError with the
    child's traceback when it does not pickle). `spawn(argv, env)` starts
    argv, with env added to the environment, in `namespace`, with stdin and
    stdout piped (LocalCluster.client_popen: it dies with us)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    script = main_file if getattr(fn, "__module__", None) == "__main__" else None
    payload = pickle.dumps(script) + pickle.dumps((fn, tuple(args), kwargs))
    argv = [sys.executable, "-m", "oncelog_local.netns", "call"]
    # The child imports fn by name: give it the modules this process sees.
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    process = spawn(argv, env)
    try:
        out, _ = process.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise TimeoutError(f"{getattr(fn, '__qualname__', fn)} did not return within "
                           f"{timeout_s} s in namespace {namespace}") from None
    try:
        status, value, text = pickle.loads(out)
    except Exception as exc:  # noqa: BLE001 - the child died before it answered
        raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} in namespace {namespace} "
                           f"exited with {process.returncode} without a result") from exc
    if status == "ok":
        return value
    if isinstance(value, BaseException):
        value.add_note(f"in namespace {namespace}:\n{text}")
        raise value
    raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} failed in namespace "
                       f"{namespace}:\n{text}")


def _call_main() -> None:
    """The child side of run_callable: a pickled call on stdin, its pickled
    outcome on stdout (its own output goes to stderr)."""
    stdin = sys.stdin.buffer
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # the callable's prints must not mix with the result
    try:
        script = pickle.load(stdin)
        if script is not None:
            # The caller's __main__ script, loaded as a module (its guarded
            # main part does not run), so that its functions unpickle.
            main = types.ModuleType("__main__")
            main.__dict__.update(runpy.run_path(script, run_name="__oncelog_script__"))
            sys.modules["__main__"] = main
        fn, args, kwargs = pickle.load(stdin)
        outcome: tuple[str, Any, str] = ("ok", fn(*args, **kwargs), "")
    except BaseException as exc:  # noqa: BLE001 - handed back to the caller
        text = traceback.format_exc()
        try:
            pickle.dumps(exc)
            outcome = ("error", exc, text)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            outcome = ("error", None, text)
    out.write(pickle.dumps(outcome))
    out.flush()
    sys.stderr.flush()
    # Not a normal exit: a client's threads left behind by the callable
    # (gRPC's, say) must not hold the answer back.
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["call"]:
        _call_main()
    else:
        sys.exit("usage: python -m oncelog_local.netns call")
