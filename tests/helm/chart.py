"""Rendering the Helm chart for the tests, and what they check it with.

The chart is linted and rendered by Helm's own engine through
helm-python-sdk (no helm binary); built-in kinds are validated with
kubernetes-validate in strict mode against the newest Kubernetes version it
ships; the custom resources (the Prometheus Operator's kinds, cert-manager's
Certificate), for which it has no schema, get the structural check in
crd_schemas.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

from tests.helm.crd_schemas import CRD_SCHEMAS

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "oncelog"
RELEASE = "demo"
NAMESPACE = "data"
# The StatefulSets of oncelog's own services (the image built from the
# Dockerfile); the chart's etcd, when it runs one, is "etcd".
COMPONENTS = ("partition-store", "coordinator", "group-coordinator")
COMPONENT_LABEL = "app.kubernetes.io/component"
# The newest Kubernetes whose schemas the installed kubernetes-validate ships.
KUBERNETES_VERSION: str = kubernetes_validate.latest_version()
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"

Manifest = dict[str, Any]

# The services' security flags (the security contract; server_base.py's
# add_common_arguments), which the chart sets from its `security` values
# rather than through a component's `config`.
SECURITY_FLAGS = frozenset({
    "tls-cert-file", "tls-key-file", "tls-ca-file", "tls-client-auth", "tls-reload-interval-ms",
    "ssl-principal-mapping-rules", "oauth-issuers", "oauth-audience", "oauth-sub-claim",
    "oauth-leeway-s", "authorizer", "super-users", "allow-everyone-if-no-acl-found",
    "acl-refresh-interval-ms", "token-listen", "token-stores", "token-coordinators",
    "token-group-coordinators",
})


@dataclass(frozen=True, slots=True)
class Rendered:
    """Every object of one `helm template`, and NOTES.txt."""

    objects: list[Manifest]
    notes: str
    sources: dict[str, str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Manifest]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str) -> Manifest:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        if len(found) != 1:
            names = [o["metadata"]["name"] for o in self.of_kind(kind)]
            raise AssertionError(f"expected one {kind} named {name!r}, found {names}")
        return found[0]

    def statefulset(self, component: str) -> Manifest:
        """The StatefulSet of a component ("partition-store", "coordinator", ...)."""
        return self.one("StatefulSet", f"{RELEASE}-oncelog-{component}")


def render(
    values: Mapping[str, Any] | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    release: str = RELEASE,
) -> Rendered:
    """`helm template` with these values; raises helm's error on bad values."""
    with helm.Chart.load(chart_dir) as chart:
        out = chart.render(dict(values or {}), name=release, namespace=NAMESPACE)
    objects: list[Manifest] = []
    notes = ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return Rendered(objects=objects, notes=notes, sources=dict(out))


def lint_findings(
    values: Mapping[str, Any] | None = None, *, chart_dir: Path = CHART_DIR
) -> list[str]:
    """`helm lint --strict` findings of warning level and above, as text."""
    report = helm.lint(
        os.fspath(chart_dir), dict(values or {}), strict=True, namespace=NAMESPACE,
        kube_version="v" + KUBERNETES_VERSION,
    )
    # Severity 1 is "info" (e.g. "icon is recommended"); 2 warning, 3 error.
    messages = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return messages + list(report.get("errors") or [])


def validation_errors(obj: Manifest) -> list[str]:
    """Why obj is not a valid object of its kind ([] when it is)."""
    kind = obj.get("kind", "?")
    where = f"{kind}/{obj.get('metadata', {}).get('name', '?')}"
    schema = CRD_SCHEMAS.get((obj.get("apiVersion", ""), kind))
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{where}: {'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{where}: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{where}: no schema: {exc.message}"]
    return []


def containers(
    rendered: Rendered, *, etcd: bool = False
) -> Iterator[tuple[Manifest, Manifest]]:
    """(StatefulSet, container) for every container of oncelog's services,
    and of etcd's members too when `etcd`."""
    for sts in rendered.of_kind("StatefulSet"):
        component = sts["metadata"]["labels"][COMPONENT_LABEL]
        if component in COMPONENTS or (etcd and component == "etcd"):
            for container in sts["spec"]["template"]["spec"]["containers"]:
                yield sts, container


def pod_environment(rendered: Rendered, sts: Manifest, ordinal: int) -> dict[str, str]:
    """The environment the container of pod <sts>-<ordinal> starts with, as
    Kubernetes builds it: envFrom ConfigMaps first, then env entries (which
    win), with the pod-index label resolved to the ordinal and the pod's
    name to <sts>-<ordinal>."""
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config_map = rendered.one("ConfigMap", source["configMapRef"]["name"])
        env.update(config_map.get("data") or {})
    downward = {
        f"metadata.labels['{POD_INDEX_LABEL}']": str(ordinal),
        "metadata.name": f"{sts['metadata']['name']}-{ordinal}",
    }
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        field_path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        if field_path not in downward:
            raise AssertionError(f"{entry['name']}: unexpected fieldRef {field_path}")
        env[entry["name"]] = downward[field_path]
    return env


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Values layers merged as `helm -f a -f b` does (maps merge, the rest is replaced)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = deep_merge(merged[key], value)
            else:
                merged[key] = value
    return merged
