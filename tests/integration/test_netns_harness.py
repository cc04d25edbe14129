"""The network-namespace harness (oncelog_local.netns) drops exactly the packets
each fault names, undoes them, cleans up, and refuses to start where it
cannot work.

Goal: every kind of cut the partition tests use means what they assume —
isolate one process (from every other process and the clients, while the
harness still reaches it), a majority/minority split, a one-way loss (A's
packets to B dropped, B's to A delivered), a leader cut from etcd but not
from its followers and clients, a leader cut from its followers but not
from etcd, clients cut from the leader only — and heal() restores every
path, established TCP connections included.

Method: a NamespaceNetwork of five members, each with a UDP socket bound to
its address (opened from a thread that entered its namespace). Every member
sends a datagram to every other; which arrive is the reachability matrix,
compared with the one the fault must give. Datagrams show one direction at
a time, which TCP cannot. Delivery is awaited up to a generous deadline;
a drop is a datagram still missing once every delivered one has arrived
and a further moment has passed (a dropped datagram never arrives late).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from oncelog_local import netns as _netns
from oncelog_local.child import enter_network_namespace
from oncelog_local.netns import CLIENT, HARNESS, NamespaceNetwork, NamespacesUnavailable

T = TypeVar("T")
Member = tuple[str, int]

STORES = [("partition_store", i) for i in range(3)]
ETCD = ("etcd", 0)
MEMBERS: list[Member] = [*STORES, ETCD, CLIENT]
PORT = 7400
# Delivered datagrams arrive in well under a millisecond on the bridge; this
# bounds how long a loaded machine may take.
DELIVERY_DEADLINE_S = 10.0
# After the last expected datagram, how long to keep listening for ones
# that must not come.
QUIET_S = 0.3
RESEND_INTERVAL_S = 0.1


def _in_namespace(namespace: str, fn: Callable[[], T]) -> T:
    """fn() in a thread that entered `namespace` (sockets it opens live there)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            enter_network_namespace(namespace)
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


@pytest.fixture()
def network() -> Iterator[NamespaceNetwork]:
    net = NamespaceNetwork()
    try:
        for member in MEMBERS:
            net.add(*member)
        yield net
    finally:
        net.close()


@pytest.fixture()
def sockets(network: NamespaceNetwork) -> Iterator[dict[Member, socket.socket]]:
    opened = {m: _in_namespace(network.namespace(*m), lambda: socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM)) for m in MEMBERS}
    for member, sock in opened.items():
        sock.bind((network.host(*member), PORT))
        sock.settimeout(0.01)
    yield opened
    for sock in opened.values():
        sock.close()


def _reachable(network: NamespaceNetwork, sockets: dict[Member, socket.socket],
               expected: set[tuple[Member, Member]]) -> set[tuple[Member, Member]]:
    """(sender, receiver) of every pair whose datagram arrived. Pairs not
    heard from yet are sent again every RESEND_INTERVAL_S: a heal is
    followed by a new neighbour (ARP) resolution, as on a real network, and
    what is sent before it completes is lost. Stops once every expected
    pair arrived and QUIET_S more passed, or after DELIVERY_DEADLINE_S."""
    index = {m: i for i, m in enumerate(MEMBERS)}
    arrived: set[tuple[Member, Member]] = set()
    started = time.monotonic()
    complete_at: float | None = None
    while True:
        now = time.monotonic()
        if complete_at is None and expected <= arrived:
            complete_at = now
        if (complete_at is not None and now - complete_at >= QUIET_S) or (
                now - started >= DELIVERY_DEADLINE_S):
            return arrived
        for sender, sock in sockets.items():
            for receiver in MEMBERS:
                if receiver != sender and (sender, receiver) not in arrived:
                    sock.sendto(bytes([index[sender], index[receiver]]),
                                (network.host(*receiver), PORT))
        until = time.monotonic() + RESEND_INTERVAL_S
        while time.monotonic() < until:
            for receiver, sock in sockets.items():
                try:
                    data, _ = sock.recvfrom(16)
                except TimeoutError:
                    continue
                arrived.add((MEMBERS[data[0]], receiver))


def _check(network: NamespaceNetwork, sockets: dict[Member, socket.socket],
           expected: set[tuple[Member, Member]]) -> None:
    arrived = _reachable(network, sockets, expected)
    assert arrived == expected, (f"dropped but should pass: {sorted(expected - arrived)}; "
                                 f"passed but should be dropped: {sorted(arrived - expected)}")


def _all_pairs() -> set[tuple[Member, Member]]:
    return {(a, b) for a in MEMBERS for b in MEMBERS if a != b}


def _without(*drops: tuple[list[Member], list[Member]]) -> set[tuple[Member, Member]]:
    """Every pair except A -> B for each (A side, B side) given."""
    dropped = {(a, b) for side_a, side_b in drops for a in side_a for b in side_b}
    return _all_pairs() - dropped


def test_without_cuts_every_member_reaches_every_other(
        network: NamespaceNetwork, sockets: dict[Member, socket.socket]) -> None:
    _check(network, sockets, _all_pairs())


def test_isolate_cuts_one_process_off_both_ways_and_heal_restores_it(
        network: NamespaceNetwork, sockets: dict[Member, socket.socket]) -> None:
    leader = STORES[0]
    others = [m for m in MEMBERS if m != leader]
    network.isolate(*leader)
    _check(network, sockets, _without(([leader], others), (others, [leader])))
    network.heal()
    _check(network, sockets, _all_pairs())


def test_a_majority_minority_split(network: NamespaceNetwork,
                                   sockets: dict[Member, socket.socket]) -> None:
    minority = [STORES[0], ETCD]
    majority = [m for m in MEMBERS if m not in minority]
    network.cut(minority, majority)
    _check(network, sockets, _without((minority, majority), (majority, minority)))


def test_a_one_way_cut_drops_one_direction_only(
        network: NamespaceNetwork, sockets: dict[Member, socket.socket]) -> None:
    network.cut([STORES[1]], [STORES[2]], one_way=True)
    _check(network, sockets, _without(([STORES[1]], [STORES[2]])))


def test_a_leader_cut_from_etcd_only(network: NamespaceNetwork,
                                     sockets: dict[Member, socket.socket]) -> None:
    network.cut([STORES[0]], [ETCD])
    _check(network, sockets, _without(([STORES[0]], [ETCD]), ([ETCD], [STORES[0]])))


def test_a_leader_cut_from_its_followers_only(
        network: NamespaceNetwork, sockets: dict[Member, socket.socket]) -> None:
    followers = STORES[1:]
    network.cut([STORES[0]], followers)
    _check(network, sockets, _without(([STORES[0]], followers), (followers, [STORES[0]])))


def test_clients_cut_from_the_leader_only(network: NamespaceNetwork,
                                          sockets: dict[Member, socket.socket]) -> None:
    network.cut([CLIENT], [STORES[0]])
    _check(network, sockets, _without(([CLIENT], [STORES[0]]), ([STORES[0]], [CLIENT])))


def test_cuts_add_up_and_one_heal_undoes_them_all(
        network: NamespaceNetwork, sockets: dict[Member, socket.socket]) -> None:
    network.cut([STORES[0]], [ETCD])
    network.cut([STORES[0]], [ETCD])  # the same cut again changes nothing
    network.cut([CLIENT], [STORES[1]], one_way=True)
    _check(network, sockets, _without(
        ([STORES[0]], [ETCD]), ([ETCD], [STORES[0]]), ([CLIENT], [STORES[1]])))
    network.heal()
    assert network.cuts == []
    _check(network, sockets, _all_pairs())


def test_an_established_connection_stalls_during_a_cut_and_resumes_after_heal(
        network: NamespaceNetwork) -> None:
    server = _in_namespace(network.namespace(*ETCD), lambda: socket.create_server(
        (network.host(*ETCD), PORT)))
    client = _in_namespace(network.namespace(*STORES[0]), lambda: socket.create_connection(
        (network.host(*ETCD), PORT), timeout=DELIVERY_DEADLINE_S))
    accepted, _ = server.accept()
    accepted.settimeout(QUIET_S)
    try:
        network.cut([STORES[0]], [ETCD])
        client.sendall(b"during")
        with pytest.raises(TimeoutError):
            accepted.recv(16)
        # A new connection hangs too (a real partition: no error at once).
        with pytest.raises(TimeoutError):
            _in_namespace(network.namespace(*STORES[0]), lambda: socket.create_connection(
                (network.host(*ETCD), PORT), timeout=QUIET_S))
        network.heal()
        # TCP retransmits what was lost: the same connection goes on.
        accepted.settimeout(DELIVERY_DEADLINE_S)
        assert accepted.recv(16) == b"during"
    finally:
        for sock in (client, accepted, server):
            sock.close()


def test_the_harness_reaches_an_isolated_process(network: NamespaceNetwork) -> None:
    server = _in_namespace(network.namespace(*ETCD), lambda: socket.create_server(
        (network.host(*ETCD), PORT)))
    threading.Thread(target=lambda: server.accept()[0].sendall(b"hello"), daemon=True).start()
    network.isolate(*ETCD)
    host, port = network.reach(f"{network.host(*ETCD)}:{PORT}").split(":")
    with socket.create_connection((host, int(port)), timeout=DELIVERY_DEADLINE_S) as conn:
        assert conn.recv(16) == b"hello"
    server.close()
    with pytest.raises(ValueError, match="harness"):
        network.cut([HARNESS], [ETCD])


def test_a_cut_names_only_members_of_the_network(network: NamespaceNetwork) -> None:
    with pytest.raises(ValueError, match="not in this network"):
        network.cut([("partition_store", 7)], [ETCD])
    with pytest.raises(ValueError, match="both sides"):
        network.cut([ETCD], [ETCD, CLIENT])


def test_close_deletes_every_namespace_and_a_new_network_removes_stale_ones() -> None:
    # A crashed run's namespaces: owned by a pid that no longer runs.
    finished = subprocess.Popen(["true"])
    finished.wait()
    stale = f"{_netns.PREFIX}-{finished.pid}-0-bridge"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        before = set(_netns.list_namespaces())
        net = NamespaceNetwork()
        assert stale not in _netns.list_namespaces()
        made = set(_netns.list_namespaces()) - before
        # The bridge, the harness and the clients, named after their owner.
        assert len(made) == 3
        assert all(name.startswith(f"{_netns.PREFIX}-{os.getpid()}-") for name in made)
        net.close()
        assert not made & set(_netns.list_namespaces())
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)


def test_it_refuses_to_start_where_it_cannot_make_namespaces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 1000)
    with pytest.raises(NamespacesUnavailable, match="needs root"):
        NamespaceNetwork()
    monkeypatch.setattr(_netns.shutil, "which", lambda name: None)
    with pytest.raises(NamespacesUnavailable, match="`ip` command"):
        NamespaceNetwork()


def _bound_port(host: str) -> int:
    """Binds a socket to `host`: possible only in the namespace that has it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _fail(message: str) -> None:
    raise LookupError(message)


def test_a_callable_runs_in_the_client_namespace(network: NamespaceNetwork) -> None:
    def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "oncelog_local.child", str(os.getpid()),
             *network.child_args(*CLIENT), *argv],
            env={**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    client_host = network.host(*CLIENT)
    with pytest.raises(OSError):
        _bound_port(client_host)  # not here
    assert _netns.run_callable(spawn, network.namespace(*CLIENT), _bound_port,
                               [client_host], {}, timeout_s=120) > 0
    with pytest.raises(LookupError, match="from the child") as failed:
        _netns.run_callable(spawn, network.namespace(*CLIENT), _fail, ["from the child"], {},
                            timeout_s=120)
    assert "in namespace" in "".join(failed.value.__notes__)
