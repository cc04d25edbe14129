"""The chart's security: TLS from Secrets, principals, the authorizer, the
initial ACLs, the TLS health probe and the NetworkPolicies.

Goal: by default every pod mounts its component's kubernetes.io/tls Secret
(cert-manager's keys tls.crt, tls.key, ca.crt) whole and read-only, and the
services are given the contract's flags (--tls-cert-file, --tls-key-file,
--tls-ca-file, --tls-client-auth, the authorizer, the super users, ...)
pointing into it, with nothing that would restart a pod when the Secret's
files are renewed; cert-manager Certificates, when asked for, are valid for
cert-manager's schema, name every address a peer or client dials (each
pod's advertised name, the headless Services, the bootstrap Service) and
carry a subject that the configured mapping rules turn into a super user;
the initial ACLs become a post-install/post-upgrade Job whose commands are
`oncelog acls add` in Kafka's vocabulary and mean exactly the bindings of
values (the chart accepts an operation for a resource type exactly when the
authorizer does); inconsistent settings fail the install naming them; plain
text is possible and the release notes warn about it; the NetworkPolicies
admit the release's pods and labelled clients to the gRPC port (and the
same sources to the stores' Kafka port, when it is on), the monitoring
namespace to the metrics port, and no one else; and the exec
probe, which replaces Kubernetes' plain-text grpc probe under TLS, really
checks health over mutual TLS.

Method: Helm's own engine through helm-python-sdk and assertions on the
parsed objects; each pod's environment rebuilt as Kubernetes builds it and,
once the services have the security flags, given to their own parser; the
ACL arguments read back into the authorizer's own AclBinding; the
NetworkPolicies evaluated against the labels of the rendered pods; the
rendered probe command run (with paths mapped to this machine) against a
gRPC server with grpc's own health service and a CA made here with
`cryptography`, requiring client certificates; and the rendered probe and
Job commands run as they are (addresses and file paths mapped to this
machine) against a real secured cluster, LocalCluster(security=True).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from oncelog.testing import free_port
from oncelog.wire.placement import store_of_coordinator, store_of_group_coordinator
from services.common.rpc.server_base import add_common_arguments, env_name, token_advertised
from services.common.security.authorizer import (
    VALID_OPERATIONS,
    AclBinding,
    Operation,
    ResourceType,
)
from services.common.security.principals import (
    parse_mapping_rules,
    principal_from_certificate_subject,
)
from tests.helm.chart import (
    CHART_DIR,
    COMPONENT_LABEL,
    COMPONENTS,
    NAMESPACE,
    RELEASE,
    SECURITY_FLAGS,
    Manifest,
    Rendered,
    deep_merge,
    pod_environment,
    render,
    validation_errors,
)
from tests.helm.variants import SECURED_WITH_EVERYTHING, VARIANTS

TLS_DIR = "/etc/oncelog/tls"
PROBE_SCRIPT = CHART_DIR / "files" / "grpc_health_probe.py"
BOOTSTRAP_HOST = f"{RELEASE}-oncelog.{NAMESPACE}.svc.cluster.local"
CERT_MANAGER: dict[str, Any] = {"security": {"tls": {"certManager": {
    "enabled": True, "issuerRef": {"name": "oncelog-ca"}}}}}


def _pod(sts: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def _container(sts: Manifest) -> dict[str, Any]:
    (container,) = _pod(sts)["containers"]
    return dict(container)


def _volume(sts: Manifest, name: str) -> dict[str, Any]:
    (volume,) = [v for v in _pod(sts)["volumes"] if v["name"] == name]
    return dict(volume)


def _projected_files(volume: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """path in the volume -> (source kind, object name, key)."""
    files = {}
    for source in volume["projected"]["sources"]:
        ((kind, ref),) = source.items()
        for item in ref["items"]:
            files[item["path"]] = (kind, ref["name"], item["key"])
    return files


def _super_users(env: Mapping[str, str]) -> set[str]:
    return set(env["ONCELOG_SUPER_USERS"].split(";"))


# ------------------------------------------------------------------- TLS


def test_tls_is_on_by_default_with_each_components_secret_mounted() -> None:
    rendered = render()
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        container = _container(sts)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}
        # cert-manager's keys of the component's own Secret, the key readable
        # by the pods' group only (0440).
        volume = _volume(sts, "tls")
        assert volume["projected"]["defaultMode"] == 0o440
        secret = f"{sts['metadata']['name']}-tls"
        assert _projected_files(volume) == {
            "tls.crt": ("secret", secret, "tls.crt"),
            "tls.key": ("secret", secret, "tls.key"),
            "ca.crt": ("secret", secret, "ca.crt"),
        }
        env = pod_environment(rendered, sts, 0)
        assert env["ONCELOG_TLS_CERT_FILE"] == f"{TLS_DIR}/tls.crt"
        assert env["ONCELOG_TLS_KEY_FILE"] == f"{TLS_DIR}/tls.key"
        assert env["ONCELOG_TLS_CA_FILE"] == f"{TLS_DIR}/ca.crt"
        assert env["ONCELOG_TLS_CLIENT_AUTH"] == "required"
        assert env["ONCELOG_TLS_RELOAD_INTERVAL_MS"] == "10000"
        # Authentication and authorization are on too.
        assert env["ONCELOG_AUTHORIZER"] == "acl"
        assert _super_users(env) == {"User:oncelog-service", "User:admin"}
        assert env["ONCELOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
        assert env["ONCELOG_ACL_REFRESH_INTERVAL_MS"] == "1000"
        assert env["ONCELOG_SSL_PRINCIPAL_MAPPING_RULES"] == "RULE:^CN=([^,]+)$/$1/,DEFAULT"
        # No bearer tokens unless asked for.
        assert not [k for k in env if k.startswith("ONCELOG_OAUTH")]


def test_renewed_certificates_need_no_restart() -> None:
    # Kubernetes rewrites a mounted Secret in place, except under a subPath
    # mount; nothing about the Secret is hashed into the pod template, so a
    # renewal rolls no pod (the services re-read the files).
    rendered = render(VARIANTS["secured-with-everything"])
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        assert not [m for m in _container(sts)["volumeMounts"] if "subPath" in m]
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert set(annotations) == {
            "checksum/cluster-config", "checksum/component-config", "checksum/oauth-issuers"}
    for job in rendered.of_kind("Job"):
        pod = _pod(job)
        for container in [*pod["initContainers"], *pod["containers"]]:
            assert not [m for m in container["volumeMounts"] if "subPath" in m]


def test_one_shared_secret_per_component_secrets_and_a_ca_bundle_of_its_own() -> None:
    shared = render({"security": {"tls": {"secretName": "oncelog-tls"}}})
    for component in COMPONENTS:
        files = _projected_files(_volume(shared.statefulset(component), "tls"))
        assert {kind_name for kind_name, _, _ in files.values()} == {"secret"}
        assert {name for _, name, _ in files.values()} == {"oncelog-tls"}
    own = render({"security": {"tls": {
        "secretName": "oncelog-tls",
        "secretNames": {"coordinator": "txn-tls"},
        "ca": {"configMapName": "oncelog-ca-bundle", "key": "bundle.pem"},
    }}})
    coordinator = _projected_files(_volume(own.statefulset("coordinator"), "tls"))
    assert coordinator == {
        "tls.crt": ("secret", "txn-tls", "tls.crt"),
        "tls.key": ("secret", "txn-tls", "tls.key"),
        "ca.crt": ("configMap", "oncelog-ca-bundle", "bundle.pem"),
    }
    store = _projected_files(_volume(own.statefulset("partition-store"), "tls"))
    assert store["tls.crt"] == ("secret", "oncelog-tls", "tls.crt")
    from_secret = render({"security": {"tls": {"ca": {"secretName": "ca", "key": "ca.pem"}}}})
    files = _projected_files(_volume(from_secret.statefulset("group-coordinator"), "tls"))
    assert files["ca.crt"] == ("secret", "ca", "ca.pem")


def _common_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    return {option.removeprefix("--") for action in parser._actions
            for option in action.option_strings}


def test_the_security_flags_are_the_services() -> None:
    # The chart writes ONCELOG_<FLAG> for these; a flag renamed in
    # server_base.py would otherwise be silently ignored by every pod.
    assert _common_flags() >= SECURITY_FLAGS


@pytest.mark.parametrize("variant", ["defaults", "secured-with-everything"])
def test_the_services_parse_the_security_settings(
    variant: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each ONCELOG_* security variable the chart writes is the flag of the
    # contract, and the services' own parser reads the value the chart means.
    rendered = render(VARIANTS[variant])
    integers = {"tls-reload-interval-ms", "acl-refresh-interval-ms", "oauth-leeway-s"}
    for component in COMPONENTS:
        env = pod_environment(rendered, rendered.statefulset(component), 0)
        written = {flag for flag in SECURITY_FLAGS if env_name(flag) in env}
        assert {"tls-cert-file", "authorizer"} <= written
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            parser = argparse.ArgumentParser()
            add_common_arguments(parser)
            args, _ = parser.parse_known_args([])
        for flag in written:
            value = env[env_name(flag)]
            parsed = getattr(args, flag.replace("-", "_"))
            if flag in integers:
                assert parsed == int(value), flag
            elif isinstance(parsed, bool):
                assert parsed == (value == "true"), flag
            else:
                assert str(parsed) == value, flag


# ---------------------------------------------------------- cert-manager


def _dns_matches(pattern: str, name: str) -> bool:
    """RFC 6125: a wildcard is a whole left-most label and stands for one label."""
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _go_duration_s(text: str) -> float:
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    assert "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def _principal_of(common_name: str, env: Mapping[str, str]) -> str:
    """The principal the services derive from a certificate with this
    subject: a real certificate's RFC 4514 subject through the mapping rules
    the pods are given."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return principal_from_certificate_subject(
        subject.rfc4514_string(), parse_mapping_rules(env["ONCELOG_SSL_PRINCIPAL_MAPPING_RULES"]))


def _dialled_names(rendered: Rendered, component: str) -> set[str]:
    """The names the component's certificate must carry: each pod's
    advertised name (peers dial it, the probe verifies it), and for the
    stores the bootstrap Service."""
    env = pod_environment(rendered, rendered.statefulset(component), 0)
    key = {"partition-store": "ONCELOG_STORES", "coordinator": "ONCELOG_COORDINATORS",
           "group-coordinator": "ONCELOG_GROUP_COORDINATORS"}[component]
    names = {address.rsplit(":", 1)[0] for address in env[key].split(",")}
    if component == "partition-store":
        names.add(BOOTSTRAP_HOST)
    return names


@pytest.mark.parametrize("variant", ["per-component", "shared", "everything"])
def test_cert_manager_certificates_are_valid_and_name_every_dialled_address(
    variant: str,
) -> None:
    values: dict[str, Any] = {
        "per-component": CERT_MANAGER,
        "shared": {"security": {"tls": {
            "secretName": "oncelog-tls", **CERT_MANAGER["security"]["tls"]}}},
        "everything": SECURED_WITH_EVERYTHING,
    }[variant]
    rendered = render(values)
    certificates = {c["metadata"]["name"]: c for c in rendered.of_kind("Certificate")}
    assert [e for c in certificates.values() for e in validation_errors(c)] == []
    env = pod_environment(rendered, rendered.statefulset("partition-store"), 0)
    mounted = set()
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        (secret,) = {name for kind, name, _ in _projected_files(_volume(sts, "tls")).values()
                     if kind == "secret"}
        mounted.add(secret)
        spec = certificates[secret]["spec"]
        assert spec["secretName"] == secret
        for name in _dialled_names(rendered, component):
            assert any(_dns_matches(p, name) for p in spec["dnsNames"]), (component, name)
        # Server and client: the services present it to each other.
        assert {"server auth", "client auth", "digital signature"} <= set(spec["usages"])
        # Its subject is a super user's principal (the services' own).
        assert _principal_of(spec["commonName"], env) in _super_users(env)
        # cert-manager's limits: at least an hour, renewed 5 minutes or more
        # before the end; a new key at every renewal.
        duration, renew = _go_duration_s(spec["duration"]), _go_duration_s(spec["renewBefore"])
        assert duration >= 3600 and 300 <= renew < duration
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        assert spec["issuerRef"]["name"]
    # Exactly one Certificate per Secret the pods mount, plus the admin's.
    admin = certificates.pop(f"{RELEASE}-oncelog-admin-tls")
    assert set(certificates) == mounted
    assert len(mounted) == (1 if variant == "shared" else 3)
    assert admin["spec"]["usages"] in (["digital signature", "client auth"],
                                       ["digital signature", "key encipherment", "client auth"])
    assert "dnsNames" not in admin["spec"]
    assert _principal_of(admin["spec"]["commonName"], env) in _super_users(env)


def test_the_dns_name_matcher() -> None:
    # The matcher the coverage test relies on: one label per wildcard.
    assert _dns_matches("*.svc.ns.svc", "pod-0.svc.ns.svc")
    assert not _dns_matches("*.svc.ns.svc", "a.pod-0.svc.ns.svc")
    assert not _dns_matches("*.svc.ns.svc", "svc.ns.svc")
    assert _dns_matches("svc.ns", "svc.ns") and not _dns_matches("svc.ns", "svc.ns.svc")


def test_without_cert_manager_no_certificate_is_rendered() -> None:
    assert render().of_kind("Certificate") == []
    own_admin = render({"security": {
        "tls": CERT_MANAGER["security"]["tls"], "adminClient": {"secretName": "ops-cert"}}})
    assert f"{RELEASE}-oncelog-admin-tls" not in {
        c["metadata"]["name"] for c in own_admin.of_kind("Certificate")}


# ---------------------------------------------------------- bearer tokens


def test_bearer_token_issuers_reach_the_services() -> None:
    rendered = render(VARIANTS["secured-with-everything"])
    issuers = SECURED_WITH_EVERYTHING["security"]["oauth"]["issuers"]
    config_map = rendered.one("ConfigMap", f"{RELEASE}-oncelog-oauth-issuers")
    paths = json.loads(config_map["data"]["issuers.json"])
    assert set(paths) == {i["issuer"] for i in issuers}
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        env = pod_environment(rendered, sts, 0)
        (mount,) = [m for m in _container(sts)["volumeMounts"] if m["name"] == "oauth"]
        assert mount["readOnly"] is True
        assert env["ONCELOG_OAUTH_ISSUERS"] == mount["mountPath"] + "/issuers.json"
        assert (env["ONCELOG_OAUTH_AUDIENCE"], env["ONCELOG_OAUTH_SUB_CLAIM"],
                env["ONCELOG_OAUTH_LEEWAY_S"]) == ("oncelog", "client_id", "10")
        files = _projected_files(_volume(sts, "oauth"))
        assert files["issuers.json"] == ("configMap", config_map["metadata"]["name"],
                                         "issuers.json")
        # Every issuer's key file is where issuers.json says, from its source.
        for issuer in issuers:
            relative = paths[issuer["issuer"]].removeprefix(mount["mountPath"] + "/")
            kind = "configMap" if "configMap" in issuer else "secret"
            assert files[relative] == (kind, issuer[kind]["name"], issuer[kind]["key"])
    # The issuers are read at start-up: changing them rolls the pods.
    other = {"security": {**SECURED_WITH_EVERYTHING["security"], "oauth": {
        **SECURED_WITH_EVERYTHING["security"]["oauth"], "issuers": issuers[:1]}}}
    changed = render({**SECURED_WITH_EVERYTHING, **other})
    before = rendered.statefulset("coordinator")["spec"]["template"]["metadata"]["annotations"]
    after = changed.statefulset("coordinator")["spec"]["template"]["metadata"]["annotations"]
    assert before["checksum/oauth-issuers"] != after["checksum/oauth-issuers"]


def test_with_tokens_every_component_serves_and_names_the_token_listener() -> None:
    """security.oauth: every pod serves the token port, is told every
    process's token-listener address (each one's DNS name at ports.token),
    and the Services and NetworkPolicies carry the port; without oauth
    there is no token port anywhere."""
    values = {**VARIANTS["secured-with-everything"], "networkPolicy": {"enabled": True}}
    rendered = render(values)
    token_port = 7001
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        ports = {p["name"]: p["containerPort"] for p in _container(sts)["ports"]}
        assert ports["token"] == token_port
        env = pod_environment(rendered, sts, 0)
        assert env["ONCELOG_TOKEN_LISTEN"] == f"0.0.0.0:{token_port}"
        for layout, token_layout in (("ONCELOG_STORES", "ONCELOG_TOKEN_STORES"),
                                     ("ONCELOG_COORDINATORS", "ONCELOG_TOKEN_COORDINATORS"),
                                     ("ONCELOG_GROUP_COORDINATORS",
                                      "ONCELOG_TOKEN_GROUP_COORDINATORS")):
            assert env[token_layout].split(",") == [
                a.rsplit(":", 1)[0] + f":{token_port}" for a in env[layout].split(",")]
        policy = rendered.one("NetworkPolicy", sts["metadata"]["name"])
        client_rule = policy["spec"]["ingress"][0]
        assert {p["port"] for p in client_rule["ports"]} == {7000, token_port}
    for service in rendered.of_kind("Service"):
        if service["metadata"]["name"].endswith("etcd") or "etcd" in service["metadata"]["name"]:
            continue
        assert token_port in {p["port"] for p in service["spec"]["ports"]}, service["metadata"]
    plain = render({"networkPolicy": {"enabled": True}})
    for component in COMPONENTS:
        sts = plain.statefulset(component)
        assert "token" not in {p["name"] for p in _container(sts)["ports"]}
        assert "ONCELOG_TOKEN_LISTEN" not in pod_environment(plain, sts, 0)


def test_with_coordinators_in_stores_the_token_layout_names_the_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """coordinator.inStores and groupCoordinator.inStores with bearer
    tokens: --token-coordinators (--token-group-coordinators) lists, entry
    by entry, the token listener of the store --coordinators
    (--group-coordinators) lists, which is the one each store advertises,
    and there is no coordinator Secret, Certificate or NetworkPolicy to
    keep."""
    from services.partition_store.server import (
        build_parser,
        config_from_args,
        coordinator_node,
        group_coordinator_node,
    )

    stores = 3
    values = deep_merge(SECURED_WITH_EVERYTHING, {
        "coordinator": {"inStores": True}, "groupCoordinator": {"inStores": True},
        "partitionStore": {"replicas": stores}, "networkPolicy": {"enabled": True}})
    rendered = render(values)
    sts = rendered.statefulset("partition-store")
    for ordinal in range(stores):
        with monkeypatch.context() as patch:
            for key, value in pod_environment(rendered, sts, ordinal).items():
                patch.setenv(key, value)
            args = build_parser().parse_args([])
        layout = config_from_args(args).layout
        assert layout.token_coordinators == tuple(
            layout.token_stores[store_of_coordinator(c, stores)] for c in range(stores))
        assert all(a.endswith(":7001") for a in layout.token_coordinators)
        coordinator = coordinator_node(args, layout, layout.stores[ordinal])
        assert coordinator is not None
        # A client that finds this coordinator on the token port is sent to
        # the token listener this very store serves.
        assert layout.token_coordinators[coordinator] == token_advertised(
            args, layout.token_stores, ordinal)
        assert layout.token_group_coordinators == tuple(
            layout.token_stores[store_of_group_coordinator(g, stores)] for g in range(stores))
        group = group_coordinator_node(args, layout, layout.stores[ordinal])
        assert group is not None
        assert layout.token_group_coordinators[group] == token_advertised(
            args, layout.token_stores, ordinal)
    assert not {"coordinator", "group-coordinator"} & {
        o["metadata"].get("labels", {}).get(COMPONENT_LABEL) for o in rendered.objects}
    assert f"{RELEASE}-oncelog-coordinator-tls" not in rendered.notes
    assert f"{RELEASE}-oncelog-group-coordinator-tls" not in rendered.notes
    assert f"{RELEASE}-oncelog-partition-store-tls" in rendered.notes


# --------------------------------------------------------- the ACL Job


ADMIN_DIR = "/etc/oncelog/admin-tls"


def _binding_from_args(args: list[str]) -> AclBinding:
    """Reads `acls add` arguments in Kafka's vocabulary back into the
    authorizer's own binding."""
    assert args[:2] == ["acls", "add"], args
    fields: dict[str, str] = {"host": "*"}
    rest = iter(args[2:])
    resources = {"--topic": "topic", "--group": "group",
                 "--transactional-id": "transactional_id"}
    for flag in rest:
        if flag in ("--allow-principal", "--deny-principal"):
            fields["permission"] = flag[2:].split("-")[0]
            fields["principal"] = next(rest)
        elif flag in ("--allow-host", "--deny-host"):
            assert flag[2:].split("-")[0] == fields["permission"]
            fields["host"] = next(rest)
        elif flag == "--operation":
            fields["operation"] = next(rest)
        elif flag in resources:
            fields["resource_type"] = resources[flag]
            fields["resource_name"] = next(rest)
        elif flag == "--cluster":
            fields["resource_type"] = "cluster"
            fields["resource_name"] = "oncelog-cluster"
        elif flag == "--resource-pattern-type":
            fields["pattern_type"] = next(rest)
        else:
            raise AssertionError(f"unexpected argument {flag!r} in {args}")
    return AclBinding.of(**fields)


def _binding_from_values(entry: Mapping[str, str]) -> AclBinding:
    return AclBinding.of(
        principal=entry["principal"], resource_type=entry["resourceType"],
        resource_name=entry.get("resourceName", "oncelog-cluster"),
        pattern_type=entry.get("patternType", "literal"), operation=entry["operation"],
        permission=entry.get("permission", "allow"), host=entry.get("host", "*"))


def _connection_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the connection flags before the command, the command)."""
    command_at = args.index("acls")
    head = args[:command_at]
    return dict(zip(head[::2], head[1::2], strict=True)), args[command_at:]


def test_initial_acls_are_a_hook_job_of_acls_add_commands() -> None:
    rendered = render(VARIANTS["secured-with-everything"])
    (job,) = rendered.of_kind("Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert job["spec"]["backoffLimit"] == 3
    pod = _pod(job)
    assert pod["restartPolicy"] == "Never"
    acls = SECURED_WITH_EVERYTHING["security"]["acls"]
    # One `oncelog acls add` per entry, in order, then `oncelog acls list`.
    assert [c["name"] for c in pod["initContainers"]] == [f"acl-{i}" for i in range(len(acls))]
    (last,) = pod["containers"]
    for container in [*pod["initContainers"], last]:
        assert container["command"] == ["/opt/oncelog/bin/python", "-m", "oncelog.cli"]
        connection, _ = _connection_args(container["args"])
        assert connection == {
            "--bootstrap": f"{BOOTSTRAP_HOST}:7000",
            "--timeout-ms": "60000",
            "--security-protocol": "SSL",
            "--ssl-cafile": f"{ADMIN_DIR}/ca.crt",
            "--ssl-certfile": f"{ADMIN_DIR}/tls.crt",
            "--ssl-keyfile": f"{ADMIN_DIR}/tls.key",
        }
        assert {"name": "admin-tls", "mountPath": ADMIN_DIR, "readOnly": True} in (
            container["volumeMounts"])
    assert _connection_args(last["args"])[1] == ["acls", "list"]
    for entry, container in zip(acls, pod["initContainers"], strict=True):
        _, command = _connection_args(container["args"])
        assert _binding_from_args(command) == _binding_from_values(entry)
    # The admin client's certificate, the one certManager issues with CN=ops.
    files = _projected_files(_volume(job, "admin-tls"))
    assert {name for _, name, _ in files.values()} == {f"{RELEASE}-oncelog-admin-tls"}
    assert set(files) == {"tls.crt", "tls.key", "ca.crt"}


def test_no_acls_no_job() -> None:
    assert render().of_kind("Job") == []


def test_the_chart_accepts_an_acl_exactly_when_the_authorizer_does() -> None:
    # Every operation on every resource type: the valid ones render into a
    # command meaning that binding, the others fail naming the entry, as the
    # authorizer's own table (Kafka's) decides.
    valid = [(t, o) for t in ResourceType for o in Operation if o in VALID_OPERATIONS[t]]
    entries = [{"principal": "User:alice", "resourceType": t.value, "operation": o.value,
                **({} if t is ResourceType.CLUSTER else {"resourceName": "payments"})}
               for t, o in valid]
    (job,) = render({"security": {"acls": entries}}).of_kind("Job")
    commands = [_connection_args(c["args"])[1] for c in _pod(job)["initContainers"]]
    assert [_binding_from_args(c) for c in commands] == [_binding_from_values(e) for e in entries]
    for resource_type in ResourceType:
        for operation in set(Operation) - VALID_OPERATIONS[resource_type]:
            entry = {"principal": "User:alice", "resourceType": resource_type.value,
                     "resourceName": "oncelog-cluster", "operation": operation.kafka_name}
            with pytest.raises(helm.HelmRenderError,
                               match=re.escape("security.acls[0]: " + operation.kafka_name)):
                render({"security": {"acls": [entry]}})
            with pytest.raises(ValueError, match="does not apply"):
                _binding_from_values(entry)


BAD_ACLS: dict[str, tuple[dict[str, str], str]] = {
    "topic without a name": (
        {"principal": "User:a", "resourceType": "topic", "operation": "read"},
        "security.acls[0]: a topic ACL needs resourceName"),
    "cluster of another name": (
        {"principal": "User:a", "resourceType": "cluster", "resourceName": "kafka-cluster",
         "operation": "alter"},
        "the cluster resource is named oncelog-cluster"),
    "prefixed cluster": (
        {"principal": "User:a", "resourceType": "cluster", "patternType": "prefixed",
         "operation": "alter"},
        "the cluster resource is bound literally only"),
}


@pytest.mark.parametrize("case", sorted(BAD_ACLS))
def test_an_acl_that_cannot_mean_anything_fails_naming_it(case: str) -> None:
    entry, message = BAD_ACLS[case]
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render({"security": {"acls": [entry]}})


INCONSISTENT: dict[str, tuple[dict[str, Any], str]] = {
    "authorizer without tls": (
        {"security": {"tls": {"enabled": False}}},
        "security.authorizer=acl needs security.tls.enabled=true"),
    "token listener on the gRPC port": (
        {"ports": {"token": 7000}, "security": {"oauth": {"enabled": True, "issuers": [
            {"issuer": "x", "secret": {"name": "k", "key": "k.pem"}}]}}},
        "ports.token must differ from ports.grpc"),
    "tokens without issuers": (
        {"security": {"tls": {"clientAuth": "requested"}, "oauth": {"enabled": True}}},
        "at least one entry in security.oauth.issuers"),
    "services not super users": (
        {"security": {"superUsers": ["User:admin"]}},
        "security.superUsers must include security.servicePrincipal (User:oncelog-service)"),
    "acls without an authorizer": (
        {"security": {"authorizer": "none", "acls": [
            {"principal": "User:a", "resourceType": "topic", "resourceName": "t",
             "operation": "read"}]}},
        "security.acls needs security.authorizer=acl"),
    "cert-manager without an issuer": (
        {"security": {"tls": {"certManager": {"enabled": True}}}},
        "needs security.tls.certManager.issuerRef.name"),
    "cert-manager without tls": (
        {"security": {"tls": {"enabled": False, "certManager": {
            "enabled": True, "issuerRef": {"name": "x"}}}, "authorizer": "none"}},
        "security.tls.certManager.enabled needs security.tls.enabled=true"),
}


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_settings_that_cannot_work_together_fail_the_install(case: str) -> None:
    values, message = INCONSISTENT[case]
    # (`helm lint` renders in lint mode, where `fail` only logs: install,
    # upgrade and template are what stop.)
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


# ------------------------------------------------------------ plain text


def test_plain_text_is_possible_and_the_notes_say_so_loudly() -> None:
    rendered = render(VARIANTS["plain-text"])
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        env = pod_environment(rendered, sts, 0)
        assert env["ONCELOG_AUTHORIZER"] == "none"
        assert not [k for k in env if k.startswith(("ONCELOG_TLS", "ONCELOG_SUPER",
                                                    "ONCELOG_SSL", "POD_NAME"))]
        container = _container(sts)
        assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/etc")]
        assert container["livenessProbe"]["grpc"] == {"port": 7000, "service": ""}
    assert not rendered.of_kind("Certificate") and not rendered.of_kind("Job")
    assert f"{RELEASE}-oncelog-probe" not in {c["metadata"]["name"]
                                               for c in rendered.of_kind("ConfigMap")}
    notes = rendered.notes
    assert "WARNING: PLAIN TEXT" in notes and "WARNING: NO AUTHORIZATION" in notes
    # Up front, before the layout.
    assert notes.index("WARNING: PLAIN TEXT") < notes.index("Layout")
    assert "security_protocol" not in notes
    secured = render().notes
    assert "WARNING" not in secured
    assert 'security_protocol="SSL"' in secured
    for component in COMPONENTS:
        assert f"{RELEASE}-oncelog-{component}-tls" in secured
    # TLS without an authorizer: authentication only, also said loudly.
    tls_only = render({"security": {"authorizer": "none"}}).notes
    assert "WARNING: NO AUTHORIZATION" in tls_only and "PLAIN TEXT" not in tls_only


# ------------------------------------------------------- NetworkPolicies


@dataclass(frozen=True)
class Source:
    """A pod that tries to connect: its namespace and labels."""

    namespace: str
    labels: Mapping[str, str]


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes' LabelSelector semantics ({} selects everything)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get(
            "values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_admits(peer: Mapping[str, Any], source: Source) -> bool:
    if "ipBlock" in peer:
        return False   # pods are matched by labels here, not addresses
    namespace_labels = {"kubernetes.io/metadata.name": source.namespace}
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif source.namespace != NAMESPACE:
        return False   # a podSelector alone means the policy's namespace
    return _selects(peer.get("podSelector", {}), source.labels)


def _reaches(policies: list[Manifest], target: Mapping[str, str], source: Source,
             port: int) -> bool:
    """Whether source may open `port` on a pod with labels `target`: pods no
    policy selects accept anything; selected pods what some rule admits."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], target)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, source) for peer in peers):
                return True
    return False


def _pod_labels(rendered: Rendered) -> dict[str, dict[str, str]]:
    labels = {sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]:
              sts["spec"]["template"]["metadata"]["labels"]
              for sts in rendered.of_kind("StatefulSet")}
    for job in rendered.of_kind("Job"):
        labels["acls-job"] = job["spec"]["template"]["metadata"]["labels"]
    return labels


def test_network_policies_admit_the_release_labelled_clients_and_monitoring_only() -> None:
    rendered = render(VARIANTS["defaults"] | {"security": {"acls": [
        {"principal": "User:a", "resourceType": "topic", "resourceName": "t",
         "operation": "read"}]}})
    policies = rendered.of_kind("NetworkPolicy")
    pods = _pod_labels(rendered)
    grpc_port, metrics_port = 7000, 9400
    client = {"oncelog.io/client": "true", "app": "payments"}
    sources = {
        **{name: Source(NAMESPACE, labels) for name, labels in pods.items()},
        "labelled client": Source(NAMESPACE, client),
        "stranger": Source(NAMESPACE, {"app": "payments"}),
        "labelled client elsewhere": Source("apps", client),
        "other release": Source(NAMESPACE, {**pods["partition-store"],
                                            "app.kubernetes.io/instance": "other"}),
        "prometheus": Source("monitoring", {"app.kubernetes.io/name": "prometheus"}),
    }
    for component in COMPONENTS:
        target = pods[component]
        reach = {name for name, source in sources.items()
                 if _reaches(policies, target, source, grpc_port)}
        assert reach == {*pods, "labelled client"}, component
        scrape = {name for name, source in sources.items()
                  if _reaches(policies, target, source, metrics_port)}
        assert scrape == {"prometheus"}, component
        # No other port is open to anyone.
        assert not any(_reaches(policies, target, s, 8080) for s in sources.values())


def test_the_kafka_port_admits_whom_the_grpc_port_admits() -> None:
    """partitionStore.kafka: the stores' Kafka port is open to exactly the
    sources their gRPC port is open to; the coordinators serve no Kafka
    port, and theirs stays closed."""
    values = {**VARIANTS["secured-with-everything"],
              "partitionStore": {"kafka": {"enabled": True}}}
    rendered = render(values)
    policies = rendered.of_kind("NetworkPolicy")
    pods = _pod_labels(rendered)
    client = {"team": "payments", "oncelog.io/client": "true"}
    sources = {
        **{name: Source(NAMESPACE, labels) for name, labels in pods.items()},
        "labelled client": Source(NAMESPACE, client),
        "labelled client in a listed namespace": Source("apps", client),
        "labelled client elsewhere": Source("web", client),
        "stranger": Source(NAMESPACE, {"team": "payments"}),
    }

    def admitted(component: str, port: int) -> set[str]:
        return {name for name, source in sources.items()
                if _reaches(policies, pods[component], source, port)}

    grpc_port, kafka_port = 7000, 9092
    assert admitted("partition-store", kafka_port) == admitted("partition-store", grpc_port)
    assert admitted("partition-store", kafka_port) == {
        *pods, "labelled client", "labelled client in a listed namespace"}
    for component in ("coordinator", "group-coordinator"):
        assert admitted(component, kafka_port) == set(), component
    # Off, the stores' Kafka port is closed like any other.
    off = render(VARIANTS["secured-with-everything"])
    assert not any(_reaches(off.of_kind("NetworkPolicy"), pods["partition-store"], source,
                            kafka_port) for source in sources.values())


def test_network_policy_settings() -> None:
    values = VARIANTS["secured-with-everything"]
    rendered = render(values)
    policies = rendered.of_kind("NetworkPolicy")
    target = _pod_labels(rendered)["coordinator"]
    client = {"team": "payments", "oncelog.io/client": "true"}
    assert _reaches(policies, target, Source("apps", client), 7000)
    assert _reaches(policies, target, Source("batch", client), 7000)
    assert not _reaches(policies, target, Source("web", client), 7000)
    assert not _reaches(policies, target, Source(NAMESPACE, {"team": "payments"}), 7000)
    # metricsFrom empty: the metrics port admits any source.
    assert _reaches(policies, target, Source("web", {}), 9400)
    # extraFrom is passed through.
    policy = rendered.one("NetworkPolicy", f"{RELEASE}-oncelog-coordinator")
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in policy["spec"]["ingress"][0]["from"]
    # Without the metrics port there is no rule for it; off, no policy at all.
    no_metrics = render({"metrics": {"enabled": False}})
    policy = no_metrics.one("NetworkPolicy", f"{RELEASE}-oncelog-coordinator")
    assert [[p["port"] for p in r["ports"]] for r in policy["spec"]["ingress"]] == [[7000]]
    off = render({"networkPolicy": {"enabled": False}})
    assert [p["metadata"]["name"] for p in off.of_kind("NetworkPolicy")] == [
        f"{RELEASE}-oncelog-etcd"]
    without_groups = render({"groupCoordinator": {"enabled": False}})
    assert f"{RELEASE}-oncelog-group-coordinator" not in {
        p["metadata"]["name"] for p in without_groups.of_kind("NetworkPolicy")}


# ------------------------------------------------------- the TLS probe


@dataclass(frozen=True)
class Pki:
    """A CA and certificates signed by it, as PEM files."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _make_pki(directory: Path, *, dns_names: list[str], common_name: str) -> Pki:
    """A CA and one certificate (server and client auth), written under directory."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test CA {directory.name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in dns_names]
                + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    pki = Pki(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(_key_pem(key))
    return pki


@dataclass
class HealthServer:
    port: int
    health: health.HealthServicer


@pytest.fixture
def mtls_health_server(tmp_path: Path) -> Iterator[tuple[HealthServer, Pki, str]]:
    """A gRPC server with grpc's health service (the one every oncelog
    process serves), serving TLS with a certificate for a pod's DNS names
    under a wildcard (as cert-manager's certificates are) and requiring a
    client certificate from the same CA. Yields the server, the PKI and the
    suffix that follows a pod's name."""
    suffix = f".{RELEASE}-oncelog-coordinator-headless.{NAMESPACE}.svc.cluster.local"
    pki = _make_pki(tmp_path / "pki", dns_names=["*" + suffix], common_name="oncelog-service")
    credentials = grpc.ssl_server_credentials(
        [(pki.key_file.read_bytes(), pki.cert_file.read_bytes())],
        root_certificates=pki.ca_file.read_bytes(), require_client_auth=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield HealthServer(port, servicer), pki, suffix
    finally:
        server.stop(None).wait()


def _probe_command(rendered: Rendered, component: str, probe: str, *, port: int, pki: Pki,
                   suffix: str | None = None) -> list[str]:
    """The rendered exec probe with this machine's paths: the interpreter,
    the chart's script, the certificate files, the server's port."""
    command = list(_container(rendered.statefulset(component))[probe]["exec"]["command"])
    replace = {"--port": str(port), "--ca-file": str(pki.ca_file),
               "--cert-file": str(pki.cert_file), "--key-file": str(pki.key_file)}
    if suffix is not None:
        replace["--server-name-suffix"] = suffix
    for flag, value in replace.items():
        command[command.index(flag) + 1] = value
    assert command[0] == "/opt/oncelog/bin/python"
    assert Path(command[1]).name == PROBE_SCRIPT.name
    return [sys.executable, str(PROBE_SCRIPT), *command[2:]]


def _run_probe(command: list[str], pod_name: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run(command, env={**env, "POD_NAME": pod_name}, capture_output=True,
                          text=True, timeout=60)


def test_the_probe_script_the_pods_mount_is_the_charts() -> None:
    rendered = render({"coordinator": {"replicas": 2}, "groupCoordinator": {"replicas": 2}})
    config_map = rendered.one("ConfigMap", f"{RELEASE}-oncelog-probe")
    assert config_map["data"][PROBE_SCRIPT.name] == PROBE_SCRIPT.read_text().rstrip("\n")
    for component in COMPONENTS:
        sts = rendered.statefulset(component)
        assert _volume(sts, "probe")["configMap"]["name"] == config_map["metadata"]["name"]
        container = _container(sts)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "probe"]
        command = container["livenessProbe"]["exec"]["command"]
        assert command[1] == f"{mount['mountPath']}/{PROBE_SCRIPT.name}"
        # It verifies the server under the pod's own advertised name.
        env = pod_environment(rendered, sts, 1)
        server_name = env["POD_NAME"] + command[command.index("--server-name-suffix") + 1]
        assert server_name in _dialled_names(rendered, component)
        # The health call ends before Kubernetes gives up on the probe.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert float(command[command.index("--timeout-s") + 1]) < (
                container[probe]["timeoutSeconds"])


def test_the_exec_probe_checks_health_over_mutual_tls(
    mtls_health_server: tuple[HealthServer, Pki, str], tmp_path: Path,
) -> None:
    server, pki, suffix = mtls_health_server
    rendered = render()
    pod = f"{RELEASE}-oncelog-coordinator-0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        result = _run_probe(_probe_command(rendered, "coordinator", probe, port=server.port,
                                           pki=pki), pod)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "SERVING"
    command = _probe_command(rendered, "coordinator", "livenessProbe", port=server.port, pki=pki)
    # NOT_SERVING (a process shutting down) fails the probe.
    server.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = _run_probe(command, pod)
    assert result.returncode == 1 and "NOT_SERVING" in result.stderr
    server.health.set("", health_pb2.HealthCheckResponse.SERVING)
    assert _run_probe(command, pod).returncode == 0
    # A server whose certificate does not carry the pod's name fails it.
    result = _run_probe(_probe_command(rendered, "coordinator", "livenessProbe",
                                       port=server.port, pki=pki, suffix=".elsewhere.svc"), pod)
    assert result.returncode == 1 and "UNAVAILABLE" in result.stderr
    # So does a CA that did not sign the server (and a client certificate
    # the server's CA did not sign).
    stranger = _make_pki(tmp_path / "stranger", dns_names=["*" + suffix],
                         common_name="oncelog-service")
    result = _run_probe(_probe_command(rendered, "coordinator", "livenessProbe",
                                       port=server.port, pki=stranger), pod)
    assert result.returncode == 1
    # Nothing listening: a failure, not a hang.
    result = _run_probe(_probe_command(rendered, "coordinator", "livenessProbe",
                                       port=free_port(), pki=pki), pod)
    assert result.returncode == 1 and "UNAVAILABLE" in result.stderr
    # Without the pod's name the probe cannot know what to verify.
    result = _run_probe(command, "")
    assert result.returncode != 0 and "POD_NAME" in result.stderr


# ------------------------------------------- against a real secured cluster


def test_the_job_commands_parse_with_the_cli() -> None:
    # Every command of the Job is one the CLI takes: the connection flags
    # before the command, Kafka's vocabulary after it.
    from oncelog.cli import build_parser, parse_args

    (job,) = render(VARIANTS["secured-with-everything"]).of_kind("Job")
    pod = _pod(job)
    for container in [*pod["initContainers"], *pod["containers"]]:
        args = parse_args(build_parser(), container["args"])
        assert (args.command, args.action) == tuple(_connection_args(container["args"])[1][:2])
        assert args.bootstrap == f"{BOOTSTRAP_HOST}:7000"


def test_the_exec_probe_passes_against_a_secured_store(tmp_path: Path) -> None:
    from oncelog.testing import LocalCluster

    rendered = render()
    with LocalCluster(tmp_path, security=True) as cluster:
        cfg = cluster.client_config("oncelog-service")
        pki = Pki(Path(cfg["ssl_cafile"]), Path(cfg["ssl_certfile"]), Path(cfg["ssl_keyfile"]))
        port = int(cluster.bootstrap.rsplit(":", 1)[1])
        # LocalCluster's certificates name localhost: the "pod" is localhost.
        command = _probe_command(rendered, "partition-store", "readinessProbe", port=port,
                                 pki=pki, suffix="")
        result = _run_probe(command, "localhost")
        assert result.returncode == 0, result.stderr


def test_the_acl_job_commands_create_the_bindings_once(tmp_path: Path) -> None:
    # The Job's commands, run as they are (only the address and the
    # certificate paths mapped to the local cluster), create exactly the
    # bindings of values; run again they change nothing.
    from oncelog import Admin
    from oncelog.testing import LocalCluster

    values = VARIANTS["secured-with-everything"]
    (job,) = render(values).of_kind("Job")
    pod = _pod(job)
    with LocalCluster(tmp_path, security=True) as cluster:
        # The Job connects as whoever its certificate names: LocalCluster's
        # super user User:admin here.
        admin_cfg = cluster.client_config("admin")
        mapped = {"--bootstrap": cluster.bootstrap, "--ssl-cafile": admin_cfg["ssl_cafile"],
                  "--ssl-certfile": admin_cfg["ssl_certfile"],
                  "--ssl-keyfile": admin_cfg["ssl_keyfile"], "--timeout-ms": "30000"}

        def run_job() -> None:
            for container in [*pod["initContainers"], *pod["containers"]]:
                args = list(container["args"])
                for flag, value in mapped.items():
                    args[args.index(flag) + 1] = value
                result = subprocess.run([sys.executable, "-m", "oncelog.cli", *args],
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, (container["name"], result.stderr)

        with Admin(bootstrap=cluster.bootstrap, **admin_cfg) as admin:
            run_job()
            first = admin.describe_acls()
            run_job()
            second = admin.describe_acls()

        def key(binding: Any) -> AclBinding:
            return AclBinding.of(
                principal=binding.principal, resource_type=binding.resource_type,
                resource_name=binding.resource_name, pattern_type=binding.pattern_type,
                operation=binding.operation, permission=binding.permission, host=binding.host)

        expected = {_binding_from_values(e) for e in values["security"]["acls"]}
        assert sorted(map(str, map(key, first))) == sorted(map(str, expected))
        assert sorted(map(str, map(key, second))) == sorted(map(str, expected))

