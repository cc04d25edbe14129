"""Every pod the chart runs is configured the way the services read it.

Goal: the environment each pod starts with (its ConfigMaps and env entries,
with the StatefulSet ordinal put where Kubernetes puts it), handed to the
services' own argument parsers, yields the cluster layout the chart means:
node id = ordinal; the pod's own stable DNS name is its entry of the layout
(so it advertises the name the others dial); every process has the same
layout; coordinator N owns the __transaction_state partitions p with
p % coordinators == N (and likewise the group coordinators); settings from
values reach the service as typed values (large integers included); and
every server flag the chart accepts in `config` is a real flag of that
service, while every real flag is accepted. With coordinator.inStores there
are no coordinator pods: each store runs a coordinator of its own, all of
them distinct, coordinator c in the store oncelog.wire.placement puts it
in, with coordinator.config's settings (the store's own value winning where
partitionStore.config sets the same flag).

Method: render with helm-python-sdk, rebuild each pod's environment, and
run the real parsers in-process (server_base.add_common_arguments and each
service's own parser) with that environment; list the services' flags from
their --help. Which coordinator a store runs is the store's own
coordinator_node on its parsed arguments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oncelog.wire.placement import store_of_coordinator, store_of_group_coordinator
from services.common.metadata.cluster import ClusterLayout
from services.common.rpc.server_base import add_common_arguments, layout_from_args
from services.partition_store.hosted_coordinators import coordinator_node, group_coordinator_node
from tests.helm.chart import (
    CHART_DIR,
    COMPONENT_LABEL,
    NAMESPACE,
    RELEASE,
    REPO,
    SECURITY_FLAGS,
    Rendered,
    deep_merge,
    pod_environment,
    render,
)

# The components: chart name, values key, module run by `python -m`.
COMPONENTS = {
    "partition-store": ("partitionStore", "oncelog_server.partition_store"),
    "coordinator": ("coordinator", "oncelog_server.coordinator"),
    "group-coordinator": ("groupCoordinator", "oncelog_server.group_coordinator"),
}
# Flags every service takes that the chart sets itself (the layout, ports,
# logging; security from the `security` values, test_chart_security.py)
# rather than through a component's `config`.
CHART_MANAGED_FLAGS = {
    "help", "node-id", "listen", "advertised", "stores", "coordinators",
    "group-coordinators", "transaction-state-partitions", "consumer-offsets-partitions",
    "metrics-port", "log-format", "log-level", "data-dir", "etcd-endpoints",
    "token-advertised",
    # The stores' Kafka listener: partitionStore.kafka and ports.kafka
    # (test_chart_kafka.py); each store advertises its entry of kafka-stores.
    "kafka-listen", "kafka-stores", "kafka-advertised",
    # The coordinators a store runs: "auto" with coordinator.inStores and
    # groupCoordinator.inStores.
    "transaction-coordinator", "group-coordinator",
} | SECURITY_FLAGS
# The coordinator's flags a store takes to run one in its process: offered
# through coordinator.config, which reaches the stores with
# coordinator.inStores (the store's --max-transaction-timeout-ms is its own
# flag too, in partitionStore.config).
COORDINATOR_FLAGS_OF_THE_STORE = {
    "producer-id-block-size", "transactional-id-expiration-ms",
    "transaction-check-interval-ms", "allow-two-phase-commit",
}
# Likewise the group coordinator's, through groupCoordinator.config (the
# store's --retention-check-interval-ms is its own flag too).
GROUP_COORDINATOR_FLAGS_OF_THE_STORE = {
    "min-session-timeout-ms", "max-session-timeout-ms", "max-heartbeat-interval-ms",
    "offsets-retention-ms", "initial-rebalance-delay-ms", "lag-refresh-interval-ms",
}
# Flags the chart deliberately does not offer: test-only switches.
NOT_OFFERED = {"unsafe-skip-txn-verification"}


def _parse_common(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    args, _ = parser.parse_known_args([])
    return args


def _pod_layouts(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch
) -> dict[tuple[str, int], tuple[int, ClusterLayout]]:
    """(component, ordinal) -> (node id, layout) as each pod's process parses them."""
    parsed = {}
    statefulsets = {s["metadata"]["name"] for s in rendered.of_kind("StatefulSet")}
    for component in COMPONENTS:
        # By its whole name: "-coordinator" also ends "-group-coordinator".
        if f"{RELEASE}-oncelog-{component}" not in statefulsets:
            continue
        sts = rendered.statefulset(component)
        for ordinal in range(sts["spec"]["replicas"]):
            with monkeypatch.context() as patch:
                args = _parse_common(pod_environment(rendered, sts, ordinal), patch)
            parsed[(component, ordinal)] = (args.node_id, layout_from_args(args))
    return parsed


def _dns_name(rendered: Rendered, component: str, ordinal: int, port: int) -> str:
    sts = rendered.statefulset(component)
    return (f"{sts['metadata']['name']}-{ordinal}.{sts['spec']['serviceName']}."
            f"{NAMESPACE}.svc.cluster.local:{port}")


@pytest.mark.parametrize(
    ("stores", "coordinators", "group_coordinators"), [(1, 1, 1), (3, 1, 1), (3, 3, 2)]
)
def test_every_pod_parses_the_same_layout_with_its_ordinal_as_node_id(
    stores: int, coordinators: int, group_coordinators: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render({
        "partitionStore": {"replicas": stores},
        "coordinator": {"replicas": coordinators},
        "groupCoordinator": {"replicas": group_coordinators},
        "cluster": {"transactionStatePartitions": 5, "consumerOffsetsPartitions": 7},
    })
    parsed = _pod_layouts(rendered, monkeypatch)
    assert len(parsed) == stores + coordinators + group_coordinators
    expected = ClusterLayout(
        stores=tuple(_dns_name(rendered, "partition-store", i, 7000) for i in range(stores)),
        coordinators=tuple(
            _dns_name(rendered, "coordinator", i, 7000) for i in range(coordinators)),
        group_coordinators=tuple(
            _dns_name(rendered, "group-coordinator", i, 7000) for i in range(group_coordinators)),
        transaction_state_partitions=5,
        consumer_offsets_partitions=7,
    )
    kinds = {"partition-store": expected.stores, "coordinator": expected.coordinators,
             "group-coordinator": expected.group_coordinators}
    for (component, ordinal), (node_id, layout) in parsed.items():
        assert node_id == ordinal
        assert layout == expected
        # The process advertises its own entry: its pod's stable DNS name.
        assert kinds[component][node_id] == _dns_name(rendered, component, ordinal, 7000)
    # The ownership rule the chart documents is the one the services compute.
    for partition in range(5):
        assert expected.coordinator_for_partition(partition) == partition % coordinators
    for partition in range(7):
        assert expected.group_coordinator_for_partition(partition) == (
            partition % group_coordinators)


def test_without_group_coordinators_the_layout_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = render({"groupCoordinator": {"enabled": False}})
    parsed = _pod_layouts(rendered, monkeypatch)
    assert {component for component, _ in parsed} == {"partition-store", "coordinator"}
    assert all(layout.group_coordinators == () for _, layout in parsed.values())


def test_processes_listen_on_all_interfaces_and_serve_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render({"ports": {"grpc": 7100, "metrics": 9500}})
    sts = rendered.statefulset("coordinator")
    args = _parse_common(pod_environment(rendered, sts, 0), monkeypatch)
    # Binding the advertised DNS name would need the pod's own record to
    # exist before the pod is ready; the wildcard address does not.
    assert args.listen == "0.0.0.0:7100"
    assert args.metrics_port == 9500
    assert args.log_format == "json"
    with monkeypatch.context() as patch:
        off = render({"metrics": {"enabled": False}})
        args = _parse_common(pod_environment(off, off.statefulset("coordinator"), 0), patch)
    assert args.metrics_port == 0
    with monkeypatch.context() as patch:
        ipv6 = render({"listenHost": "::"})
        args = _parse_common(pod_environment(ipv6, ipv6.statefulset("coordinator"), 0), patch)
    assert args.listen == "[::]:7000"


def test_store_settings_reach_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.partition_store.server import build_parser, config_from_args

    rendered = render({"partitionStore": {"config": {
        "fsync": True, "producer-id-expiration-ms": 86_400_000, "snapshot-interval-batches": 250,
        "lease-ttl-s": 5, "replica-lag-time-max-ms": 10_000, "unclean-leader-election": True,
        "metadata-root": "/oncelog/prod",
    }}})
    for key, value in pod_environment(rendered, rendered.statefulset("partition-store"), 2).items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args([])
    config = config_from_args(args)
    assert config.node_id == 2
    assert config.fsync is True
    assert config.producer_id_expiration_ms == 86_400_000
    assert config.snapshot_interval_batches == 250
    assert config.unsafe_skip_txn_verification is False
    assert args.data_dir == "/var/lib/oncelog"
    # Replicated, with the replication settings of values.
    assert config.replicated is True
    assert config.replica_lag_time_max_ms == 10_000
    assert (args.lease_ttl_s, args.unclean_leader_election, args.metadata_root) == (
        5, True, "/oncelog/prod")


def test_the_default_replication_settings_are_the_stores_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # values.yaml spells out the stores' defaults (so they are visible
    # there); they must stay what the store would take without them.
    from services.partition_store.server import build_parser

    defaults = build_parser().parse_args(["--data-dir", "x"])
    rendered = render()
    for key, value in pod_environment(rendered, rendered.statefulset("partition-store"), 0).items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args([])
    for flag in ("lease_ttl_s", "replica_lag_time_max_ms", "unclean_leader_election",
                 "metadata_root", "fsync", "snapshot_interval_batches", "snapshot_interval_ms"):
        assert getattr(args, flag) == getattr(defaults, flag), flag


def test_coordinator_settings_reach_the_coordinator(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.coordinator.server import parse_args

    rendered = render({"coordinator": {"replicas": 2, "config": {
        "max-transaction-timeout-ms": 120_000, "transactional-id-expiration-ms": 604_800_000,
    }}})
    for key, value in pod_environment(rendered, rendered.statefulset("coordinator"), 1).items():
        monkeypatch.setenv(key, value)
    args = parse_args([])
    assert args.node_id == 1
    assert args.max_transaction_timeout_ms == 120_000
    assert args.transactional_id_expiration_ms == 604_800_000


def test_group_coordinator_settings_reach_the_group_coordinator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = importlib.import_module("services.group_coordinator.server")
    rendered = render({"groupCoordinator": {"replicas": 3, "config": {
        "offsets-retention-ms": 604_800_000, "max-session-timeout-ms": 300_000,
    }}})
    sts = rendered.statefulset("group-coordinator")
    for key, value in pod_environment(rendered, sts, 2).items():
        monkeypatch.setenv(key, value)
    args = server.parse_args([])
    assert args.node_id == 2
    assert args.offsets_retention_ms == 604_800_000
    assert args.max_session_timeout_ms == 300_000
    assert len(layout_from_args(args).group_coordinators) == 3


def _service_flags(module: str) -> set[str]:
    # Wide enough that argparse wraps no help line: it breaks lines after a
    # hyphen, which would cut "--kafka-stores" into a made-up "--kafka-".
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
        cwd=REPO, env={**os.environ, "COLUMNS": "10000"},
    )
    assert result.returncode == 0, result.stderr
    flags = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", result.stdout))
    # A boolean flag's --no-X form is the same setting as X (the chart sets
    # ONCELOG_X=true/false).
    return {f for f in flags if not (f.startswith("no-") and f[3:] in flags)}


@pytest.mark.parametrize("component", [
    "partition-store",
    "coordinator",
    "group-coordinator",
])
def test_config_keys_are_exactly_the_service_flags(component: str) -> None:
    key, module = COMPONENTS[component]
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())

    def offered_by(values_key: str) -> set[str]:
        config_schema = schema["properties"][values_key]["properties"]["config"]
        return set(config_schema.get("properties", {}))

    flags = _service_flags(module)
    offered = offered_by(key)
    assert offered <= flags, f"not flags of {module}: {sorted(offered - flags)}"
    if component == "partition-store":
        # The store's flags of the coordinators it can run are the
        # coordinators' own, offered in their config.
        for hosted, hosted_flags in (("coordinator", COORDINATOR_FLAGS_OF_THE_STORE),
                                     ("group-coordinator", GROUP_COORDINATOR_FLAGS_OF_THE_STORE)):
            hosted_key, hosted_module = COMPONENTS[hosted]
            assert flags & _service_flags(hosted_module) >= hosted_flags
            assert offered_by(hosted_key) >= hosted_flags
            offered |= hosted_flags
    missing = flags - CHART_MANAGED_FLAGS - NOT_OFFERED - offered
    assert not missing, f"flags of {module} the chart does not offer: {sorted(missing)}"


@pytest.mark.parametrize("component", [
    "partition-store",
    "coordinator",
    "group-coordinator",
])
def test_the_module_each_container_runs_exists(component: str) -> None:
    sts = render().statefulset(component)
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    _python, dash_m, module = container["command"]
    assert dash_m == "-m" and module == COMPONENTS[component][1]
    # Found on disk: importing oncelog_server.* here would load a second
    # copy of modules this process has as services.*.
    package, _, kind = module.partition(".")
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    assert any((Path(location) / kind / "__main__.py").is_file()
               for location in spec.submodule_search_locations)


def test_partition_counts_are_part_of_every_pods_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values: dict[str, Any] = {"cluster": {"transactionStatePartitions": 50,
                                          "consumerOffsetsPartitions": 64}}
    parsed = _pod_layouts(render(values), monkeypatch)
    assert {(layout.transaction_state_partitions, layout.consumer_offsets_partitions)
            for _, layout in parsed.values()} == {(50, 64)}


# ------------------------------------------------ coordinators in the stores


def _store_args(
    rendered: Rendered, ordinal: int, monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """A store pod's arguments as its process parses them: the parser is
    built under the pod's environment (its defaults are read from it)."""
    from services.partition_store.server import build_parser

    with monkeypatch.context() as patch:
        sts = rendered.statefulset("partition-store")
        for key, value in pod_environment(rendered, sts, ordinal).items():
            patch.setenv(key, value)
        return build_parser().parse_args([])


@dataclass(frozen=True)
class Hosted:
    """A kind of coordinator the stores can run (<key>.inStores)."""

    key: str
    component: str
    # The layout's list of its addresses, and its partitions' count key.
    addresses: str
    partitions: str
    node: Callable[[argparse.Namespace, ClusterLayout, str], int | None]
    place: Callable[[int, int], int]
    owner: Callable[[ClusterLayout, int], int]
    notes: str
    # One of its settings (config) that reaches the stores.
    setting: tuple[str, int]


HOSTED = [
    Hosted("coordinator", "coordinator", "coordinators", "transactionStatePartitions",
           coordinator_node, store_of_coordinator, ClusterLayout.coordinator_for_partition,
           "coordinators:        in the partition stores, one per store",
           ("producer-id-block-size", 5_000)),
    Hosted("groupCoordinator", "group-coordinator", "group_coordinators",
           "consumerOffsetsPartitions", group_coordinator_node, store_of_group_coordinator,
           ClusterLayout.group_coordinator_for_partition,
           "group coordinators:  in the partition stores, one per store",
           ("min-session-timeout-ms", 500)),
]


@pytest.mark.parametrize("hosted", HOSTED, ids=lambda hosted: hosted.key)
@pytest.mark.parametrize("stores", [1, 3, 5])
def test_with_coordinators_in_stores_each_store_runs_the_coordinator_placed_at_it(
    stores: int, hosted: Hosted, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.partition_store.server import config_from_args

    rendered = render({
        "partitionStore": {"replicas": stores},
        # Unused with inStores: the stores' count is the coordinators'.
        hosted.key: {"inStores": True, "replicas": 2},
        "cluster": {hosted.partitions: 8},
    })
    # No object of the coordinator's component at all: no StatefulSet,
    # Service, PDB, NetworkPolicy or ConfigMap.
    assert not [o for o in rendered.objects
                if o["metadata"].get("labels", {}).get(COMPONENT_LABEL) == hosted.component]
    assert f"{RELEASE}-oncelog-{hosted.component}" not in {
        s["metadata"]["name"] for s in rendered.of_kind("StatefulSet")}
    parsed = _pod_layouts(rendered, monkeypatch)
    assert {component for component, _ in parsed} == {
        "partition-store", "coordinator", "group-coordinator"} - {hosted.component}
    (layout,) = {layout for _, layout in parsed.values()}
    assert layout.stores == tuple(
        _dns_name(rendered, "partition-store", i, 7000) for i in range(stores))
    addresses = getattr(layout, hosted.addresses)
    assert len(addresses) == stores
    runs: dict[int, int | None] = {}
    for ordinal in range(stores):
        args = _store_args(rendered, ordinal, monkeypatch)
        config = config_from_args(args)
        assert config.node_id == ordinal
        assert config.layout == layout
        # As the store's main does: its advertised address is its entry.
        advertised = args.advertised or config.layout.stores[config.node_id]
        runs[ordinal] = hosted.node(args, config.layout, advertised)
    # Every coordinator runs, each in one store, where the placement puts it.
    assert sorted(c for c in runs.values() if c is not None) == list(range(stores))
    for ordinal, coordinator in runs.items():
        assert coordinator is not None
        assert hosted.place(coordinator, stores) == ordinal
        assert addresses[coordinator] == layout.stores[ordinal]
    # Coordinator c owns p % stores == c, as the services compute it.
    for partition in range(8):
        assert hosted.owner(layout, partition) == partition % stores
    # The release notes say where the coordinators are, and name no
    # StatefulSet of theirs to wait for.
    assert hosted.notes in rendered.notes
    assert f"statefulset/{RELEASE}-oncelog-{hosted.component}\n" not in rendered.notes + "\n"


def test_with_both_kinds_in_stores_each_store_runs_one_of_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.partition_store.server import config_from_args

    stores = 3
    rendered = render({"partitionStore": {"replicas": stores},
                       "coordinator": {"inStores": True},
                       "groupCoordinator": {"inStores": True}})
    assert {s["metadata"]["name"] for s in rendered.of_kind("StatefulSet")} >= {
        f"{RELEASE}-oncelog-partition-store"}
    assert not {f"{RELEASE}-oncelog-coordinator", f"{RELEASE}-oncelog-group-coordinator"} & {
        s["metadata"]["name"] for s in rendered.of_kind("StatefulSet")}
    for ordinal in range(stores):
        args = _store_args(rendered, ordinal, monkeypatch)
        layout = config_from_args(args).layout
        for hosted in HOSTED:
            coordinator = hosted.node(args, layout, layout.stores[ordinal])
            assert coordinator is not None and hosted.place(coordinator, stores) == ordinal
    assert "coordinator.inStores and groupCoordinator.inStores" in rendered.notes


def test_a_disabled_group_coordinator_runs_in_no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = render({"groupCoordinator": {"enabled": False, "inStores": True}})
    args = _store_args(rendered, 0, monkeypatch)
    assert args.group_coordinator is None
    assert layout_from_args(args).group_coordinators == ()


def test_without_coordinators_in_stores_no_store_runs_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = render({"partitionStore": {"replicas": 3}})
    args = _store_args(rendered, 1, monkeypatch)
    assert args.transaction_coordinator is None
    assert args.group_coordinator is None
    layout = layout_from_args(args)
    assert not set(layout.coordinators) & set(layout.stores)
    assert not set(layout.group_coordinators) & set(layout.stores)


def test_with_coordinators_in_stores_the_coordinator_settings_reach_the_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.coordinator.server import txn_config_from_args

    defaults = _store_args(render({"coordinator": {"inStores": True}}), 0, monkeypatch)
    rendered = render({"coordinator": {"inStores": True, "config": {
        "producer-id-block-size": 5_000,
        "max-transaction-timeout-ms": 120_000,
        "transactional-id-expiration-ms": 604_800_000,
        "transaction-check-interval-ms": 2_500,
        "allow-two-phase-commit": False,
        # The coordinator process's own drain: the store has its own.
        "shutdown-grace-ms": 1_234,
    }}})
    for ordinal in range(3):
        args = _store_args(rendered, ordinal, monkeypatch)
        assert args.producer_id_block_size == 5_000
        txn = txn_config_from_args(args)
        assert (txn.max_transaction_timeout_ms, txn.transactional_id_expiration_ms,
                txn.check_interval_ms, txn.allow_two_phase_commit) == (
            120_000, 604_800_000, 2_500, False)
        assert args.shutdown_grace_ms == defaults.shutdown_grace_ms != 1_234
    # One flag sets the store's and its coordinator's longest transaction
    # timeout: where partitionStore.config sets it, the store's value wins.
    both = render({
        "coordinator": {"inStores": True, "config": {"max-transaction-timeout-ms": 120_000,
                                                     "producer-id-block-size": 5_000}},
        "partitionStore": {"config": {"max-transaction-timeout-ms": 300_000}},
    })
    args = _store_args(both, 2, monkeypatch)
    assert txn_config_from_args(args).max_transaction_timeout_ms == 300_000
    assert args.producer_id_block_size == 5_000


def test_with_group_coordinators_in_stores_their_settings_reach_the_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.group_coordinator.config import group_config_from_args

    rendered = render({"groupCoordinator": {"inStores": True, "config": {
        "min-session-timeout-ms": 500,
        "max-session-timeout-ms": 60_000,
        "max-heartbeat-interval-ms": 2_000,
        "offsets-retention-ms": 86_400_000,
        "initial-rebalance-delay-ms": 100,
        "lag-refresh-interval-ms": 1_000,
        # The store's own flag (its retention), and so the store's value.
        "retention-check-interval-ms": 1_234,
    }}})
    for ordinal in range(3):
        args = _store_args(rendered, ordinal, monkeypatch)
        groups = group_config_from_args(args)
        assert (groups.min_session_timeout_ms, groups.max_session_timeout_ms,
                groups.max_heartbeat_interval_ms, groups.offsets_retention_ms,
                groups.initial_rebalance_delay_ms, args.lag_refresh_interval_ms) == (
            500, 60_000, 2_000, 86_400_000, 100, 1_000)
        assert groups.retention_check_interval_ms == 300_000
    # The one flag for both is set where the store's settings are.
    both = render({"groupCoordinator": {"inStores": True},
                   "partitionStore": {"config": {"retention-check-interval-ms": 9_000}}})
    args = _store_args(both, 1, monkeypatch)
    assert group_config_from_args(args).retention_check_interval_ms == 9_000


@pytest.mark.parametrize("hosted", HOSTED, ids=lambda hosted: hosted.key)
def test_with_coordinators_in_stores_the_store_count_is_a_layout_change(hosted: Hosted) -> None:
    other = ({"coordinator", "group-coordinator"} - {hosted.component}).pop()

    def annotations(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        rendered = render(deep_merge({hosted.key: {"inStores": True}}, values))
        return {c: rendered.statefulset(c)["spec"]["template"]["metadata"]["annotations"]
                for c in ("partition-store", other)}

    before = annotations({})
    # More stores are more coordinators, which own other partitions: every
    # pod rolls (without inStores a new store restarts nothing,
    # test_chart.py).
    grown = annotations({"partitionStore": {"replicas": 5}})
    for component, checksums in grown.items():
        assert checksums["checksum/cluster-config"] != (
            before[component]["checksum/cluster-config"]), component
    # A coordinator setting rolls the stores, which run the coordinators.
    tuned = annotations({hosted.key: {"config": dict([hosted.setting])}})
    assert tuned["partition-store"]["checksum/component-config"] != (
        before["partition-store"]["checksum/component-config"])
    assert tuned[other] == before[other]
