"""The Helm chart lints, renders, and renders only valid Kubernetes objects.

Goal: `helm lint --strict` finds nothing and every object of `helm template`
is valid for the newest Kubernetes that kubernetes-validate knows, in strict
mode (no unknown field anywhere), for the default values and for variations
that take every branch of the templates (1 and 3 stores, 3 coordinators,
metrics on and off, persistence and group coordinators off, an external
etcd, plain text, cert-manager with tokens and initial ACLs, a shared TLS
Secret, the stores' Kafka listener, every optional setting at once); and
the objects have the
properties the chart promises: stateful stores with volume claims,
replaceable coordinators, health probes on the gRPC port (Kubernetes' grpc
probe in plain text, the TLS exec probe otherwise), non-root read-only
containers (etcd's and the ACL Job's too), PodDisruptionBudgets.
tests/helm/test_chart_etcd.py checks etcd itself and
tests/helm/test_chart_security.py the security settings.

Method: Helm's own engine through helm-python-sdk (there is no helm binary),
kubernetes-validate's Python API for each object and its command line once,
and assertions on the parsed objects.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.partition_store.server import IN_SYNC_HEALTH_SERVICE
from tests.helm.chart import (
    COMPONENT_LABEL,
    COMPONENTS,
    KUBERNETES_VERSION,
    NAMESPACE,
    RELEASE,
    Rendered,
    containers,
    lint_findings,
    render,
    validation_errors,
)
from tests.helm.crd_schemas import CRD_SCHEMAS
from tests.helm.variants import VARIANTS


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[dict[str, Any], Rendered]:
    values = VARIANTS[request.param]
    return values, render(values)


def test_kubernetes_version_is_current() -> None:
    # The schemas the objects are validated against are for a Kubernetes
    # that is still supported, not whatever the library happened to default to.
    major, minor = (int(x) for x in KUBERNETES_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33), KUBERNETES_VERSION


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_lint_finds_nothing(name: str) -> None:
    assert lint_findings(VARIANTS[name]) == []


def test_every_object_is_valid(variant: tuple[dict[str, Any], Rendered]) -> None:
    _, rendered = variant
    assert rendered.objects
    errors = [e for obj in rendered.objects for e in validation_errors(obj)]
    assert errors == []


def test_the_validation_catches_mistakes() -> None:
    # The checks above pass only because the objects are right: a typo'd
    # field, a wrong type and a bad CRD field are all reported.
    rendered = render()
    sts = rendered.statefulset("partition-store")
    typo = yaml.safe_load(yaml.safe_dump(sts))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert any("readinesProbe" in e for e in validation_errors(typo))
    wrong_type = yaml.safe_load(yaml.safe_dump(sts))
    wrong_type["spec"]["replicas"] = "three"
    assert validation_errors(wrong_type)
    monitor = render(VARIANTS["metrics-on"]).of_kind("ServiceMonitor")[0]
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    assert any("intervall" in e for e in validation_errors(monitor))
    certificate = render(VARIANTS["secured-with-everything"]).of_kind("Certificate")[0]
    assert validation_errors(certificate) == []
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    assert any("dnsName" in e for e in validation_errors(certificate))


def test_kubernetes_validate_command_line_agrees(tmp_path: Path) -> None:
    # The same check as `kubernetes-validate --strict` on the rendered files,
    # run once over the variant with the most objects. The CRD kinds are left
    # out: the command only warns that it has no schema for them.
    rendered = render(VARIANTS["everything-set"])
    files = []
    for index, obj in enumerate(rendered.objects):
        if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
            continue
        path = tmp_path / f"{index:02d}-{obj['kind']}.yaml"
        path.write_text(yaml.safe_dump(obj))
        files.append(str(path))
    command = Path(sys.executable).parent / "kubernetes-validate"
    result = subprocess.run(
        [str(command), "--strict", "-k", KUBERNETES_VERSION, *files],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("INFO")]) == len(files), result.stdout
    assert not [line for line in lines if not line.startswith("INFO")], result.stdout


def test_objects_of_the_default_release() -> None:
    rendered = render()
    kinds = sorted({o["kind"] for o in rendered.objects})
    assert kinds == [
        "ConfigMap", "NetworkPolicy", "PodDisruptionBudget", "Service", "ServiceAccount",
        "StatefulSet",
    ]
    assert sorted(s["metadata"]["name"] for s in rendered.of_kind("StatefulSet")) == sorted(
        f"{RELEASE}-oncelog-{c}" for c in (*COMPONENTS, "etcd")
    )
    for obj in rendered.objects:
        assert obj["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("stores", [1, 3])
def test_stores_keep_their_data_on_volume_claims(stores: int) -> None:
    sts = render({"partitionStore": {"replicas": stores}}).statefulset("partition-store")
    assert sts["spec"]["replicas"] == stores
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == "/var/lib/oncelog"
    assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain", "whenScaled": "Retain",
    }


def test_without_persistence_the_store_uses_an_empty_dir() -> None:
    rendered = render({"partitionStore": {"persistence": {"enabled": False}}})
    sts = rendered.statefulset("partition-store")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert "WARNING" in rendered.notes and "emptyDir" in rendered.notes


@pytest.mark.parametrize("component", ["coordinator", "group-coordinator"])
def test_coordinators_are_replaceable(component: str) -> None:
    # No volume to wait for and no ordering between pods: a deleted pod comes
    # back at once under the same name (its node id) and replays its state.
    sts = render({"coordinator": {"replicas": 3}}).statefulset(component)
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert "volumeClaimTemplates" not in sts["spec"]
    # Nothing to reattach: scratch space, and certificates and scripts from
    # Secrets and ConfigMaps.
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert all({"emptyDir", "projected", "configMap"} & set(v) for v in volumes)
    assert [v["name"] for v in volumes if "emptyDir" in v] == ["tmp"]


def test_every_container_is_probed_on_the_grpc_port(
    variant: tuple[dict[str, Any], Rendered],
) -> None:
    values, rendered = variant
    metrics_on = values.get("metrics", {}).get("enabled", True)
    tls = values.get("security", {}).get("tls", {}).get("enabled", True)
    tokens = values.get("security", {}).get("oauth", {}).get("enabled", False)
    kafka = values.get("partitionStore", {}).get("kafka", {}).get("enabled", False)
    for sts, container in containers(rendered):
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # The Kafka listener is the stores' alone.
        store = sts["metadata"]["labels"][COMPONENT_LABEL] == "partition-store"
        assert set(ports) == {"grpc"} | ({"metrics"} if metrics_on else set()) | (
            {"token"} if tokens else set()) | ({"kafka"} if kafka and store else set())
        probes = [k for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]
        assert {"readinessProbe", "livenessProbe"} <= set(probes), sts["metadata"]["name"]
        for key in probes:
            # A store is ready once it is in sync (test_chart_upgrades.py);
            # every other probe asks for the process's overall status.
            service = IN_SYNC_HEALTH_SERVICE if store and key == "readinessProbe" else ""
            if not tls:
                # Kubernetes' grpc probe takes a number only: the grpc port's.
                assert container[key]["grpc"] == {"port": ports["grpc"], "service": service}
                continue
            # The kubelet's grpc probe has no TLS: the exec probe dials the
            # same port over TLS (test_chart_security.py runs it).
            assert set(container[key]) - {"exec"} == {
                "initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold",
                "successThreshold"}
            command = container[key]["exec"]["command"]
            assert command[1].endswith("/grpc_health_probe.py")
            assert command[command.index("--port") + 1] == str(ports["grpc"])
            asked = command[command.index("--service") + 1] if "--service" in command else ""
            assert asked == service, (sts["metadata"]["name"], key)


def test_startup_probe_allows_a_long_recovery() -> None:
    (container,) = render().statefulset("partition-store")["spec"]["template"]["spec"][
        "containers"
    ]
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600


def test_containers_run_unprivileged_on_a_read_only_root(
    variant: tuple[dict[str, Any], Rendered],
) -> None:
    _, rendered = variant
    jobs = [(job, c) for job in rendered.of_kind("Job")
            for c in (*job["spec"]["template"]["spec"].get("initContainers", []),
                      *job["spec"]["template"]["spec"]["containers"])]
    for sts, container in [*containers(rendered, etcd=True), *jobs]:
        pod = sts["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        # Writable places are volumes only: an emptyDir /tmp, the store's
        # data, etcd's data (etcd needs no /tmp).
        claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"] for v in pod.get("volumes", [])} | claims
        assert {m["name"] for m in container["volumeMounts"]} <= volumes
        if sts["metadata"]["labels"][COMPONENT_LABEL] != "etcd":
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
        # Certificates and keys are mounted read-only.
        for mount in container["volumeMounts"]:
            if mount["mountPath"].startswith("/etc/oncelog/"):
                assert mount["readOnly"] is True, mount


def test_pods_roll_when_their_configuration_changes() -> None:
    def checksums(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        rendered = render(values)
        return {
            c: rendered.statefulset(c)["spec"]["template"]["metadata"]["annotations"]
            for c in COMPONENTS
        }

    before = checksums({})
    assert checksums({}) == before
    # A new coordinator count is a new layout: every pod of every kind rolls.
    scaled = checksums({"coordinator": {"replicas": 2}})
    for component in COMPONENTS:
        assert scaled[component]["checksum/cluster-config"] != (
            before[component]["checksum/cluster-config"]
        )
    # More stores restart nothing: the new ones register in etcd, where the
    # running processes learn about them.
    assert checksums({"partitionStore": {"replicas": 5}}) == before
    # A store setting rolls the stores only.
    fsync = checksums({"partitionStore": {"config": {"fsync": True}}})
    assert fsync["partition-store"]["checksum/component-config"] != (
        before["partition-store"]["checksum/component-config"]
    )
    assert fsync["coordinator"] == before["coordinator"]


def test_disruption_budgets_and_anti_affinity() -> None:
    rendered = render()
    # One store down: with 3 copies and min.insync.replicas 2 every
    # partition still takes writes. One etcd member down: 2 of 3 are a quorum.
    for component in (*COMPONENTS, "etcd"):
        pdb = rendered.one("PodDisruptionBudget", f"{RELEASE}-oncelog-{component}")
        sts = rendered.statefulset(component)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"] == sts["spec"]["selector"]
        anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert term["podAffinityTerm"]["labelSelector"] == sts["spec"]["selector"]
    hard = render({"partitionStore": {"podAntiAffinity": "hard"}}).statefulset("partition-store")
    anti = hard["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(anti) == ["requiredDuringSchedulingIgnoredDuringExecution"]


def test_selectors_find_the_right_pods() -> None:
    rendered = render()
    pods = {
        c: rendered.statefulset(c)["spec"]["template"]["metadata"]["labels"]
        for c in (*COMPONENTS, "etcd")
    }

    def selected(selector: dict[str, str]) -> set[str]:
        return {c for c, labels in pods.items() if selector.items() <= labels.items()}

    for component in (*COMPONENTS, "etcd"):
        sts = rendered.statefulset(component)
        assert selected(sts["spec"]["selector"]["matchLabels"]) == {component}
        headless = rendered.one("Service", sts["spec"]["serviceName"])
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["publishNotReadyAddresses"] is True
        assert selected(headless["spec"]["selector"]) == {component}
    bootstrap = rendered.one("Service", f"{RELEASE}-oncelog")
    assert selected(bootstrap["spec"]["selector"]) == {"partition-store"}


def test_a_long_release_name_keeps_every_name_within_limits() -> None:
    # Helm allows 53-character release names; a StatefulSet name must leave
    # room for the controller-revision-hash label (name + 11 characters) and a
    # pod's hostname and its Service's name must be DNS labels.
    release = "r" * 53
    rendered = render(release=release)
    for obj in rendered.objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
    for sts in rendered.of_kind("StatefulSet"):
        assert len(sts["metadata"]["name"]) <= 52
        assert len(sts["spec"]["serviceName"]) <= 63
    assert [e for obj in rendered.objects for e in validation_errors(obj)] == []


def test_notes_tell_the_bootstrap_address() -> None:
    notes = render().notes
    assert f"{RELEASE}-oncelog.{NAMESPACE}.svc.cluster.local:7000" in notes
    assert "p % 1 == N" in notes
