"""Clients of a secured LocalCluster in tests: ACLs granted and waited for,
topics read back as the super user.

An ACL change reaches each service when it next reads `__acls` (every 200
ms on a LocalCluster); `grant` and `revoke` return once every service
reports, in its `oncelog_acl_applied_offset` metric, that it has read the
topic up to its end, so a test's next call meets the new ACLs wherever it
lands (no sleeping and hoping).
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

from oncelog import AclBinding, AclFilter, Admin, Consumer, ConsumerRecord, TopicPartition
from oncelog.testing import LocalCluster
from tests.support.reading import read_all

ACLS_TOPIC = "__acls"
SERVICES = ("partition_store", "coordinator", "group_coordinator")
_APPLIED = re.compile(r"^oncelog_acl_applied_offset (\S+)$", re.MULTILINE)
# Failure guard for a service that never catches up (not a timing assumption).
WAIT_S = 60.0


def admin_of(cluster: LocalCluster, **options: Any) -> Admin:
    """An Admin of the cluster's super user."""
    return Admin(bootstrap=cluster.bootstrap, **cluster.client_config("admin"), **options)


def applied_offset(cluster: LocalCluster, kind: str, index: int) -> float:
    with urllib.request.urlopen(cluster.metrics_url(kind, index), timeout=10) as resp:
        found = _APPLIED.search(resp.read().decode())
    return -1.0 if found is None else float(found.group(1))


def wait_acls_applied(cluster: LocalCluster) -> None:
    """Returns once every service has read `__acls` up to its present end."""
    with admin_of(cluster) as admin:
        end = admin.describe_topic(ACLS_TOPIC).partitions[0].high_watermark
    deadline = time.monotonic() + WAIT_S
    for kind in SERVICES:
        for index in range(len(cluster.processes.get(kind, []))):
            while applied_offset(cluster, kind, index) < end:
                assert time.monotonic() < deadline, (
                    f"{kind} {index} did not read {ACLS_TOPIC} up to {end}")
                time.sleep(0.05)


def grant(cluster: LocalCluster, bindings: Iterable[AclBinding]) -> None:
    """Creates the bindings (as the super user) and waits until every
    service has them."""
    with admin_of(cluster) as admin:
        admin.create_acls(list(bindings))
    wait_acls_applied(cluster)


def revoke(cluster: LocalCluster, selectors: Iterable[AclFilter | AclBinding]
           ) -> list[AclBinding]:
    """Deletes what the selectors select and waits until every service
    knows; the deleted bindings."""
    with admin_of(cluster) as admin:
        deleted = admin.delete_acls(list(selectors))
    wait_acls_applied(cluster)
    return deleted


def allow(principal: str, resource_type: str, name: str, *operations: str,
          pattern_type: str = "literal") -> list[AclBinding]:
    return [AclBinding(principal=principal, resource_type=resource_type, resource_name=name,
                       pattern_type=pattern_type, operation=op) for op in operations]


def read_committed(cluster: LocalCluster, topic: str, partitions: int
                   ) -> list[ConsumerRecord]:
    """Every committed record of a topic, read as the super user once every
    transaction written so far is decided."""
    return read_all(cluster.bootstrap, topic, partitions, isolation_level="read_committed",
                    deadline_s=WAIT_S, **cluster.client_config("admin"))


def end_offsets(cluster: LocalCluster, topic: str, partitions: int,
                isolation_level: str = "read_uncommitted") -> dict[TopicPartition, int]:
    """Each partition's end (the high watermark by default: anything
    written, committed or not), asked as the super user."""
    with Consumer(bootstrap=cluster.bootstrap, isolation_level=isolation_level,
                  **cluster.client_config("admin")) as consumer:
        return consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
