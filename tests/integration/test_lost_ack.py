"""A lost acknowledgement does not duplicate or reorder records.

Method: a proxy between the SDK and the partition store lets the store append
and then drops the reply of chosen Produce calls; the idempotent producer
retries the same batches with the same sequence numbers; reading the log back
must give every record exactly once, in send order per partition.
"""

from __future__ import annotations

from pathlib import Path

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.support.grpc_proxy import DropPolicy, LostReplyProxy
from tests.support.reading import read_all


def test_dropped_produce_replies_are_retried_without_duplicates(tmp_path: Path) -> None:
    records_per_partition = 2000
    partitions = 2
    with LocalCluster(tmp_path, group_coordinators=0) as cluster, \
            LostReplyProxy(cluster.bootstrap, DropPolicy(drop_calls={2, 3, 5, 8, 13})) as proxy:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("payments", partitions=partitions)
        # Small batches and a short linger give many Produce calls, several in flight.
        with Producer(bootstrap=proxy.address, linger_ms=2, batch_size=2048,
                      max_in_flight=5) as producer:
            futures = [
                producer.send("payments", value=b"%d:%d" % (p, i), partition=p)
                for i in range(records_per_partition) for p in range(partitions)
            ]
            producer.flush()
            offsets = [f.result(timeout=60).offset for f in futures]
        assert proxy.policy.dropped == 5, "the proxy must really have dropped replies"
        got = read_all(cluster.bootstrap, "payments", partitions)
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for r in got:
        assert r.value is not None
        by_partition[r.partition].append(r.value)
    for p in range(partitions):
        assert by_partition[p] == [b"%d:%d" % (p, i) for i in range(records_per_partition)]
    # Each future got the offset the record really has (retries answer with the original).
    for p in range(partitions):
        mine = offsets[p::partitions]
        assert mine == list(range(records_per_partition))
