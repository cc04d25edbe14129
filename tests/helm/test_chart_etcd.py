"""etcd, the partition stores' metadata store, as the chart runs it or
points the stores at it.

Goal: by default the chart runs a 3-member etcd — a StatefulSet whose
members find each other through an initial cluster that names every member
by its StatefulSet DNS name, each advertising that name, with its data on a
volume claim, behind a headless Service that publishes members before they
are ready, with a PodDisruptionBudget that keeps a quorum and a
NetworkPolicy that admits the partition stores alone to the client port and
the members alone to the peer port — and every store is given exactly those
members as --etcd-endpoints (the coordinators none); with
etcd.external.endpoints the chart runs no etcd and the stores get those
endpoints. Every ETCD_* setting the chart writes is a real etcd flag, and
members started from the rendered environment form a cluster.

Method: render with helm-python-sdk; each pod's environment through the
store's own argument parser; the NetworkPolicy's rules evaluated against the
labels of the rendered pod templates; the variable names against `etcd
--help`, and three members started from the rendered environment, with the
DNS names and ports mapped to free loopback ports, using Debian's etcd (3.4;
scripts/setup.sh installs it; the chart's image runs 3.5, which reads the
same settings).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import free_port
from tests.helm.chart import (
    COMPONENT_LABEL,
    COMPONENTS,
    NAMESPACE,
    RELEASE,
    Manifest,
    Rendered,
    pod_environment,
    render,
)

ETCD_STS = f"{RELEASE}-oncelog-etcd"
ETCD_HEADLESS = f"{ETCD_STS}-headless"
EXTERNAL = ["etcd-0.infra.example:2379", "etcd-1.infra.example:2379"]


def _member_host(ordinal: int) -> str:
    return f"{ETCD_STS}-{ordinal}.{ETCD_HEADLESS}.{NAMESPACE}.svc.cluster.local"


def _etcd_objects(rendered: Rendered) -> list[Manifest]:
    return [o for o in rendered.objects
            if o["metadata"].get("labels", {}).get(COMPONENT_LABEL) == "etcd"]


def _member_env(rendered: Rendered, ordinal: int) -> dict[str, str]:
    """The environment etcd member <ordinal> starts with: the pod name where
    the downward API puts it, $(VAR) references expanded as Kubernetes does."""
    sts = rendered.statefulset("etcd")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "valueFrom" in entry:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, entry
            env[entry["name"]] = f"{sts['metadata']['name']}-{ordinal}"
        else:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)],
                                        str(entry["value"]))
    return env


def _initial_cluster(env: dict[str, str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in env["ETCD_INITIAL_CLUSTER"].split(","))


def _store_endpoints(rendered: Rendered, ordinal: int,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], bool]:
    """--etcd-endpoints as store <ordinal>'s own parser reads them, and
    whether it then runs replicated."""
    from services.common.metadata.cluster import split_addresses
    from services.partition_store.server import build_parser, config_from_args

    env = pod_environment(rendered, rendered.statefulset("partition-store"), ordinal)
    with monkeypatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        args = build_parser().parse_args([])
        config = config_from_args(args)
    return list(split_addresses(args.etcd_endpoints)), config.replicated


def test_by_default_the_chart_runs_three_members_that_name_each_other() -> None:
    rendered = render()
    sts = rendered.statefulset("etcd")
    assert sts["spec"]["replicas"] == 3
    # The first quorum needs the members up together.
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == ETCD_HEADLESS
    headless = rendered.one("Service", ETCD_HEADLESS)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"client": 2379, "peer": 2380, "metrics": 2381}
    assert {p["name"]: p["targetPort"] for p in headless["spec"]["ports"]} == {
        name: name for name in ports}
    expected = {f"{ETCD_STS}-{i}": f"http://{_member_host(i)}:2380" for i in range(3)}
    for ordinal in range(3):
        env = _member_env(rendered, ordinal)
        assert env["ETCD_NAME"] == f"{ETCD_STS}-{ordinal}"
        assert _initial_cluster(env) == expected
        # Its own entry of the initial cluster is what it advertises.
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == expected[env["ETCD_NAME"]]
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{_member_host(ordinal)}:2379"
        assert env["ETCD_INITIAL_CLUSTER_STATE"] == "new"
        assert env["ETCD_LISTEN_CLIENT_URLS"] == "http://0.0.0.0:2379"
        assert env["ETCD_LISTEN_PEER_URLS"] == "http://0.0.0.0:2380"
        assert env["ETCD_LISTEN_METRICS_URLS"] == "http://0.0.0.0:2381"
    # The data directory is on the member's volume claim.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert claim["metadata"]["name"] == "data"
    assert _member_env(rendered, 0)["ETCD_DATA_DIR"].startswith(mounts["data"] + "/")
    assert "volumes" not in pod
    # Probed on /health, which the metrics listener serves.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
        assert container[probe]["httpGet"]["path"].startswith("/health")
    pdb = rendered.one("PodDisruptionBudget", ETCD_STS)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]


@pytest.mark.parametrize("members", [1, 3, 5])
def test_the_initial_cluster_has_every_member(members: int) -> None:
    rendered = render({"etcd": {"replicas": members}})
    assert rendered.statefulset("etcd")["spec"]["replicas"] == members
    cluster = _initial_cluster(_member_env(rendered, 0))
    assert sorted(cluster) == sorted(f"{ETCD_STS}-{i}" for i in range(members))


@pytest.mark.parametrize("stores", [1, 3])
def test_every_store_is_given_every_member(
    stores: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render({"partitionStore": {"replicas": stores}})
    # The address each member advertises to clients, without the scheme.
    members = [_member_env(rendered, i)["ETCD_ADVERTISE_CLIENT_URLS"].removeprefix("http://")
               for i in range(3)]
    assert members == [f"{_member_host(i)}:2379" for i in range(3)]
    for ordinal in range(stores):
        assert _store_endpoints(rendered, ordinal, monkeypatch) == (members, True)
    # The stores are etcd's only clients.
    for component in COMPONENTS[1:]:
        env = pod_environment(rendered, rendered.statefulset(component), 0)
        assert "ONCELOG_ETCD_ENDPOINTS" not in env, component


def test_with_external_endpoints_the_chart_runs_no_etcd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render({"etcd": {"external": {"endpoints": EXTERNAL}}})
    assert _etcd_objects(rendered) == []
    assert ETCD_STS not in {p["metadata"]["name"] for p in rendered.of_kind("NetworkPolicy")}
    for ordinal in range(3):
        assert _store_endpoints(rendered, ordinal, monkeypatch) == (EXTERNAL, True)
    assert ",".join(EXTERNAL) in rendered.notes


def test_the_stores_roll_when_their_etcd_changes() -> None:
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        sts = render(values).statefulset("partition-store")
        return dict(sts["spec"]["template"]["metadata"]["annotations"])

    own = annotations({})
    external = annotations({"etcd": {"external": {"endpoints": EXTERNAL}}})
    assert external["checksum/component-config"] != own["checksum/component-config"]


# ------------------------------------------------------------ NetworkPolicy


def _admits(policy: Manifest, source: dict[str, str], port: int) -> bool:
    """Whether the policy lets a pod of the release's namespace with labels
    `source` reach `port` of the pods it selects (peers other than a
    podSelector — namespaceSelector, ipBlock — match nothing here)."""
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if set(peer) == {"podSelector"} and (
                    peer["podSelector"]["matchLabels"].items() <= source.items()):
                return True
    return False


def _pod_labels(rendered: Rendered) -> dict[str, dict[str, str]]:
    return {sts["metadata"]["labels"][COMPONENT_LABEL]: sts["spec"]["template"]["metadata"][
        "labels"] for sts in rendered.of_kind("StatefulSet")}


def test_the_network_policy_lets_only_the_stores_use_etcd() -> None:
    rendered = render()
    policy = rendered.one("NetworkPolicy", ETCD_STS)
    pods = _pod_labels(rendered)
    selected = {c for c, labels in pods.items()
                if policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()}
    assert selected == {"etcd"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    client, peer, metrics = 2379, 2380, 2381
    stranger = {"app.kubernetes.io/name": "something-else"}
    reach = {
        who: {port for port in (client, peer, metrics) if _admits(policy, labels, port)}
        for who, labels in {**pods, "stranger": stranger}.items()
    }
    assert reach == {
        "partition-store": {client, metrics},
        "coordinator": {metrics},
        "group-coordinator": {metrics},
        "etcd": {peer, metrics},
        "stranger": {metrics},
    }
    # A store of another release is not one of ours.
    other_release = {**pods["partition-store"], "app.kubernetes.io/instance": "other"}
    assert not _admits(policy, other_release, client)


def test_the_metrics_port_can_be_restricted_and_the_policy_turned_off() -> None:
    monitoring = [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    rendered = render({"etcd": {"networkPolicy": {"metricsFrom": monitoring}}})
    policy = rendered.one("NetworkPolicy", ETCD_STS)
    (metrics_rule,) = [r for r in policy["spec"]["ingress"]
                       if [p["port"] for p in r["ports"]] == [2381]]
    assert metrics_rule["from"] == monitoring
    assert not _admits(policy, {"app.kubernetes.io/name": "something-else"}, 2381)
    off = render({"etcd": {"networkPolicy": {"enabled": False}}})
    assert ETCD_STS not in {p["metadata"]["name"] for p in off.of_kind("NetworkPolicy")}


# -------------------------------------------------------- etcd reads them


ETCD = shutil.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason="no etcd binary (scripts/setup.sh)")


def _etcd_flags() -> set[str]:
    assert ETCD is not None
    result = subprocess.run([ETCD, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"^\s+--([a-z0-9-]+)", result.stdout + result.stderr, re.MULTILINE))


@needs_etcd
def test_every_etcd_setting_is_an_etcd_flag() -> None:
    # etcd only warns about an ETCD_* variable it does not know, so a typo
    # would pass unnoticed on a cluster.
    flags = _etcd_flags()
    assert {"name", "initial-cluster", "listen-metrics-urls"} <= flags
    env = _member_env(render(), 0)
    unknown = [name for name in env
               if name.startswith("ETCD_") and name[5:].lower().replace("_", "-") not in flags]
    assert unknown == []


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return b'"health":"true"' in resp.read()
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def members_from_the_chart(tmp_path: Path) -> Iterator[list[int]]:
    """Three etcd processes started with the environment the chart gives its
    members: every member's DNS name and port mapped to a loopback port of
    its own, the listen addresses to loopback, the data directory to
    tmp_path. Yields each member's metrics port."""
    assert ETCD is not None
    rendered = render()
    ports = {(i, role): free_port() for i in range(3) for role in (2379, 2380, 2381)}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            env = _member_env(rendered, i)
            for (member, port), loopback in ports.items():
                for key, value in env.items():
                    env[key] = value.replace(f"{_member_host(member)}:{port}",
                                             f"127.0.0.1:{loopback}")
            for port in (2379, 2380, 2381):
                for key, value in env.items():
                    env[key] = value.replace(f"0.0.0.0:{port}", f"127.0.0.1:{ports[(i, port)]}")
            env["ETCD_DATA_DIR"] = str(tmp_path / f"member-{i}")
            assert ".svc." not in "".join(env.values()), env
            log = (tmp_path / f"member-{i}.log").open("wb")
            processes.append(subprocess.Popen(
                [ETCD], env={"PATH": os.environ.get("PATH", ""), **env},
                stdout=log, stderr=subprocess.STDOUT))
        yield [ports[(i, 2381)] for i in range(3)]
    finally:
        # SIGKILL: their data is thrown away (a graceful stop of members
        # whose peers are stopping too takes seconds).
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()


@needs_etcd
def test_members_started_from_the_rendered_environment_form_a_cluster(
    members_from_the_chart: list[int], tmp_path: Path,
) -> None:
    # /health without ?serializable needs a quorum read: the members found
    # each other through the initial cluster and elected a leader.
    deadline = time.monotonic() + 60   # a failure guard; it takes a few seconds
    waiting = set(members_from_the_chart)
    while waiting and time.monotonic() < deadline:
        waiting = {p for p in waiting if not _healthy(f"http://127.0.0.1:{p}/health")}
        time.sleep(0.2)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("member-*.log")))
    assert not waiting, f"members on metrics ports {sorted(waiting)} never healthy:\n{logs}"
    for port in members_from_the_chart:
        assert _healthy(f"http://127.0.0.1:{port}/health?serializable=true")
