"""The stores' Kafka listener in the chart: partitionStore.kafka and ports.kafka.

Goal: off by default, nothing of it is rendered and no store listens for
Kafka; on, every store serves Kafka's protocol on ports.kafka (container
port, headless and bootstrap Service port "kafka"), and its environment,
handed to the store's own parser, yields a listener on
listenHost:ports.kafka, every store's Kafka address by node id (each pod's
stable DNS name, as in the gRPC layout) and the pod's own DNS name as the
address Kafka clients are told; the coordinators get none of it. Turning
the listener on or moving its port rolls the stores alone, and a longer
store list rolls no pod (new stores register their Kafka address in etcd,
as their gRPC one). A Kafka port equal to another port the store serves
fails the install naming both. The release notes say how a Kafka client
connects (bootstrap.servers and the security properties) when, and only
when, the listener is on. (tests/helm/test_chart_security.py checks that
the NetworkPolicy admits to the Kafka port whom it admits to the gRPC port.)

Method: Helm's own engine through helm-python-sdk; each pod's environment
rebuilt as Kubernetes builds it and given to the partition store's own
argument parser (services.partition_store.server) and its
`kafka_advertised`; assertions on the parsed objects and on the pods'
checksum annotations.
"""

from __future__ import annotations

import argparse
from typing import Any

import helm_python as helm
import pytest

from services.common.rpc.server_base import layout_from_args
from services.partition_store.server import build_parser, kafka_advertised
from tests.helm.chart import (
    COMPONENTS,
    NAMESPACE,
    RELEASE,
    Rendered,
    deep_merge,
    pod_environment,
    render,
)

KAFKA_ON: dict[str, Any] = {"partitionStore": {"kafka": {"enabled": True}}}
KAFKA_PORT = 9092
STORE_STS = f"{RELEASE}-oncelog-partition-store"
STORE_HEADLESS = f"{STORE_STS}-headless"
BOOTSTRAP_SERVICE = f"{RELEASE}-oncelog"
# Bearer tokens besides certificates (which the chart allows with client
# certificates requested, not required).
TOKENS: dict[str, Any] = {"security": {
    "tls": {"clientAuth": "requested"},
    "oauth": {"enabled": True, "issuers": [
        {"issuer": "https://login.example.com/", "configMap": {"name": "k", "key": "k.pem"}}]},
}}


def _store_dns_name(ordinal: int, port: int) -> str:
    return f"{STORE_STS}-{ordinal}.{STORE_HEADLESS}.{NAMESPACE}.svc.cluster.local:{port}"


def _store_args(rendered: Rendered, ordinal: int,
                monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The store's own parser, run with the environment of pod <sts>-<ordinal>."""
    env = pod_environment(rendered, rendered.statefulset("partition-store"), ordinal)
    with monkeypatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        return build_parser().parse_args([])


def _container_ports(rendered: Rendered, component: str) -> dict[str, int]:
    (container,) = rendered.statefulset(component)["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _service_ports(rendered: Rendered, name: str) -> dict[str, tuple[int, str]]:
    service = rendered.one("Service", name)
    return {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}


def test_off_by_default_no_store_listens_for_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = render()
    for component in COMPONENTS:
        assert "kafka" not in _container_ports(rendered, component)
        sts = rendered.statefulset(component)
        env = pod_environment(rendered, sts, 0)
        assert not [key for key in env if key.startswith("ONCELOG_KAFKA_")], component
    for service in rendered.of_kind("Service"):
        assert "kafka" not in {p["name"] for p in service["spec"]["ports"]}
    args = _store_args(rendered, 0, monkeypatch)
    assert args.kafka_listen == ""
    assert kafka_advertised(args, layout_from_args(args).kafka_stores, 0) is None
    assert "bootstrap.servers" not in rendered.notes


@pytest.mark.parametrize(("values", "listen", "port"), [
    ({"partitionStore": {"replicas": 1}}, "0.0.0.0:9092", 9092),
    ({"partitionStore": {"replicas": 3}}, "0.0.0.0:9092", 9092),
    ({"partitionStore": {"replicas": 5}, "listenHost": "::", "ports": {"kafka": 19092}},
     "[::]:19092", 19092),
])
def test_every_store_listens_and_is_told_every_stores_kafka_address(
    values: dict[str, Any], listen: str, port: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render(deep_merge(KAFKA_ON, values))
    stores = values["partitionStore"]["replicas"]
    expected = tuple(_store_dns_name(i, port) for i in range(stores))
    for ordinal in range(stores):
        args = _store_args(rendered, ordinal, monkeypatch)
        layout = layout_from_args(args)
        assert args.node_id == ordinal
        assert args.kafka_listen == listen
        # By node id, the gRPC layout's hosts at the Kafka port.
        assert layout.kafka_stores == expected
        assert [a.rsplit(":", 1)[0] for a in layout.kafka_stores] == [
            a.rsplit(":", 1)[0] for a in layout.stores]
        # What Metadata tells Kafka clients about this store: its DNS name.
        assert kafka_advertised(args, layout.kafka_stores, ordinal) == expected[ordinal]
    assert _container_ports(rendered, "partition-store")["kafka"] == port


def test_only_the_stores_serve_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = render(KAFKA_ON)
    assert _service_ports(rendered, STORE_HEADLESS)["kafka"] == (KAFKA_PORT, "kafka")
    # Kafka clients bootstrap where gRPC clients do.
    assert _service_ports(rendered, BOOTSTRAP_SERVICE)["kafka"] == (KAFKA_PORT, "kafka")
    for component in ("coordinator", "group-coordinator"):
        assert "kafka" not in _container_ports(rendered, component)
        sts = rendered.statefulset(component)
        assert "kafka" not in _service_ports(rendered, sts["spec"]["serviceName"])
        env = pod_environment(rendered, sts, 0)
        assert not [key for key in env if key.startswith("ONCELOG_KAFKA_")], component


def _annotations(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    rendered = render(values)
    return {c: rendered.statefulset(c)["spec"]["template"]["metadata"]["annotations"]
            for c in COMPONENTS}


def test_the_listener_rolls_the_stores_and_more_stores_roll_nothing() -> None:
    off = _annotations({})
    on = _annotations(KAFKA_ON)
    assert on["partition-store"]["checksum/component-config"] != (
        off["partition-store"]["checksum/component-config"])
    assert on["partition-store"]["checksum/cluster-config"] == (
        off["partition-store"]["checksum/cluster-config"])
    for component in ("coordinator", "group-coordinator"):
        assert on[component] == off[component]
    # The port is the stores' setting: moving it rolls them; while the
    # listener is off it changes nothing.
    moved = _annotations(deep_merge(KAFKA_ON, {"ports": {"kafka": 9093}}))
    assert moved["partition-store"] != on["partition-store"]
    assert _annotations({"ports": {"kafka": 9093}}) == off
    # A longer store list (ONCELOG_STORES and ONCELOG_KAFKA_STORES) rolls
    # nothing, although the stores' ConfigMap changes.
    grown = deep_merge(KAFKA_ON, {"partitionStore": {"replicas": 5}})
    assert _annotations(grown) == on
    config = f"{STORE_STS}-config"
    assert render(grown).one("ConfigMap", config)["data"]["ONCELOG_KAFKA_STORES"] != (
        render(KAFKA_ON).one("ConfigMap", config)["data"]["ONCELOG_KAFKA_STORES"])


@pytest.mark.parametrize(("values", "other"), [
    ({"ports": {"kafka": 7000}}, "ports.grpc"),
    ({"ports": {"kafka": 9400}}, "ports.metrics"),
    ({"ports": {"kafka": 7001}, **TOKENS}, "ports.token"),
])
def test_a_kafka_port_the_store_serves_already_fails_naming_both(
    values: dict[str, Any], other: str,
) -> None:
    clash = deep_merge(KAFKA_ON, values)
    with pytest.raises(helm.HelmRenderError, match=rf"ports\.kafka .* must differ from {other}"):
        render(clash)
    # Without the listener the port is not used, so not checked.
    render({"ports": values["ports"]})


def test_the_notes_say_how_a_kafka_client_connects() -> None:
    bootstrap = f"bootstrap.servers={BOOTSTRAP_SERVICE}.{NAMESPACE}.svc.cluster.local:9092"
    tls = render(KAFKA_ON).notes
    assert bootstrap in tls
    assert "security.protocol=SSL" in tls and "ssl.certificate.location=" in tls
    assert "SASL_SSL" not in tls
    tokens = render(deep_merge(KAFKA_ON, TOKENS)).notes
    assert "security.protocol=SASL_SSL" in tokens and "OAUTHBEARER" in tokens
    plain = render(deep_merge(KAFKA_ON, {"security": {"tls": {"enabled": False},
                                                      "authorizer": "none"},
                                         "ports": {"kafka": 19092}})).notes
    assert "bootstrap.servers=" + bootstrap.split("=")[1].replace("9092", "19092") in plain
    assert "security.protocol=PLAINTEXT" in plain
    # The plain-text warning names the Kafka port too.
    warning = plain[plain.index("WARNING: PLAIN TEXT"):plain.index("Layout")]
    assert "7000 or 19092" in " ".join(warning.split())
