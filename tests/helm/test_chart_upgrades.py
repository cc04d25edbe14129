"""What the chart renders for rolling upgrades of the stores.

Goal: `helm upgrade` (or any change of the stores' pod template) restarts
one store at a time and never takes a second one down before the first is
back in sync: the stores' StatefulSet rolls with maxUnavailable 1; their
readiness probe asks the store's own "in sync" health status (the name the
store serves, in plain text and over TLS), while startup and liveness ask
for the overall status and the coordinators' probes do too; the
PodDisruptionBudget allows one store away, counting a not-ready one; the
grace period holds the hand-over of leaderships and the drain, as the store
will read its settings, and a grace period that does not is refused naming
the keys.

Method: Helm's own engine through helm-python-sdk; the rendered pod
environment is given to the store's own argument parser; the health
service name is imported from the store's server module, so a rename on
either side fails here.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from services.partition_store.replication.controlled_shutdown import (
    DEFAULT_CONTROLLED_SHUTDOWN_TIMEOUT_MS,
)
from services.partition_store.server import IN_SYNC_HEALTH_SERVICE, build_parser
from tests.helm.chart import COMPONENTS, RELEASE, pod_environment, render

STORES = "partition-store"


def _container(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def _asked(probe: dict[str, Any]) -> str:
    """The health service name a rendered probe asks for."""
    if "grpc" in probe:
        return str(probe["grpc"]["service"])
    command = probe["exec"]["command"]
    return command[command.index("--service") + 1] if "--service" in command else ""


def test_the_stores_roll_one_at_a_time_and_one_may_be_away() -> None:
    rendered = render()
    sts = rendered.statefulset(STORES)
    assert sts["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}}
    pdb = rendered.one("PodDisruptionBudget", f"{RELEASE}-oncelog-{STORES}")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    # A canary: the pods below the partition ordinal keep the old template.
    canary = render({"partitionStore": {"updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 2, "maxUnavailable": 1}}}})
    assert canary.statefulset(STORES)["spec"]["updateStrategy"]["rollingUpdate"][
        "partition"] == 2


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain-text"])
def test_a_store_is_ready_once_it_is_in_sync(tls: bool) -> None:
    values: dict[str, Any] = {} if tls else {
        "security": {"tls": {"enabled": False}, "authorizer": "none"}}
    rendered = render(values)
    store = _container(rendered.statefulset(STORES))
    assert _asked(store["readinessProbe"]) == IN_SYNC_HEALTH_SERVICE
    # Starting and staying alive are the process's own business: a store
    # that is catching up must not be restarted for it.
    assert _asked(store["startupProbe"]) == _asked(store["livenessProbe"]) == ""
    for component in COMPONENTS:
        if component != STORES:
            coordinator = _container(rendered.statefulset(component))
            assert _asked(coordinator["readinessProbe"]) == ""


def _store_args(values: dict[str, Any]) -> Any:
    rendered = render(values)
    sts = rendered.statefulset(STORES)
    env = pod_environment(rendered, sts, 0)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        return build_parser().parse_args([]), sts


def test_the_grace_period_holds_the_hand_over_and_the_drain() -> None:
    args, sts = _store_args({})
    # The store reads the chart's hand-over bound as its own default.
    assert args.controlled_shutdown_timeout_ms == DEFAULT_CONTROLLED_SHUTDOWN_TIMEOUT_MS
    grace_s = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s * 1000 >= args.controlled_shutdown_timeout_ms + args.shutdown_grace_ms
    # Another bound reaches the store as such.
    args, _ = _store_args({"partitionStore": {"config": {
        "controlled-shutdown-timeout-ms": 20_000}}})
    assert args.controlled_shutdown_timeout_ms == 20_000


@pytest.mark.parametrize(("values", "needed_s"), [
    ({"partitionStore": {"terminationGracePeriodSeconds": 20}}, 25),
    ({"partitionStore": {"config": {"controlled-shutdown-timeout-ms": 60_000}}}, 75),
    ({"partitionStore": {"terminationGracePeriodSeconds": 30,
                         "config": {"shutdown-grace-ms": 30_000}}}, 50),
])
def test_a_grace_period_too_short_for_the_shutdown_is_refused(
        values: dict[str, Any], needed_s: int) -> None:
    with pytest.raises(helm.HelmRenderError) as refused:
        render(values)
    message = str(refused.value)
    assert "partitionStore.terminationGracePeriodSeconds" in message
    assert f"must be at least {needed_s}" in message
    assert "controlled-shutdown-timeout-ms" in message


def test_no_hand_over_needs_only_the_drain() -> None:
    values = {"partitionStore": {"terminationGracePeriodSeconds": 15,
                                 "config": {"controlled-shutdown-timeout-ms": 0}}}
    args, _ = _store_args(values)
    assert args.controlled_shutdown_timeout_ms == 0
