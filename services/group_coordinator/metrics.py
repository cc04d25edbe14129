"""Prometheus metrics of the group coordinator. Labels are group, topic and
partition (bounded by the deployment's groups and topics; never member or
producer ids).

Group gauges are read from the runtime's memory at scrape time by a
collector, so they always agree with what the coordinator answers. Lag needs
the partitions' end offsets, which live on the partition stores: a
background task reads them (read_committed: the LSO, which is what a
read_committed consumer can reach) every few seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from .core.classic import ClassicGroup
from .runtime import TP, GroupCoordinatorRuntime

REBALANCES = Counter(
    "oncelog_group_rebalances_total",
    "Times a group's epoch (a classic group's generation) moved (join, leave, session "
    "timeout, subscription or partition count change)",
    ["group"],
)


class GroupCollector(Collector):
    def __init__(self, runtime: GroupCoordinatorRuntime,
                 end_offsets: Callable[[], dict[TP, int]]) -> None:
        self._runtime = runtime
        self._end_offsets = end_offsets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        members = GaugeMetricFamily("oncelog_group_members", "Members of a group", labels=["group"])
        epoch = GaugeMetricFamily("oncelog_group_epoch", "A group's epoch (a classic group's "
                                  "generation)",
                                  labels=["group"])
        pending = GaugeMetricFamily(
            "oncelog_group_pending_txn_offsets",
            "Transactional offsets waiting for their transaction's marker", labels=["group"],
        )
        committed = GaugeMetricFamily(
            "oncelog_group_committed_offset", "Last committed offset (next record to read)",
            labels=["group", "topic", "partition"],
        )
        lag = GaugeMetricFamily(
            "oncelog_group_lag_records",
            "Records between the committed offset and the partition's last stable offset",
            labels=["group", "topic", "partition"],
        )
        ends = self._end_offsets()
        for group, group_id, offsets, pending_count in self._runtime.snapshot():
            members.add_metric([group_id], len(group.members) if group else 0)
            epoch.add_metric([group_id], 0 if group is None else
                             group.generation_id if isinstance(group, ClassicGroup)
                             else group.epoch)
            pending.add_metric([group_id], pending_count)
            for (topic, partition), value in sorted(offsets.items()):
                labels = [group_id, topic, str(partition)]
                committed.add_metric(labels, value.offset)
                end = ends.get((topic, partition))
                if end is not None:
                    lag.add_metric(labels, max(end - value.offset, 0))
        yield from (members, epoch, pending, committed, lag)


def register(runtime: GroupCoordinatorRuntime, end_offsets: Callable[[], dict[TP, int]]) -> None:
    REGISTRY.register(GroupCollector(runtime, end_offsets))
