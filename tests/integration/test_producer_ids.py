"""Producer ids stay unique across coordinators and across `kill -9`.

Method: a LocalCluster with two coordinator processes; producer ids are
requested from both alternately, one coordinator is SIGKILLed and restarted
(losing its in-memory block), the partition store is SIGKILLed and restarted
too; every id handed out must be distinct.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import coordinator_pb2_grpc as co_grpc


def _init_producer_id(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = co_grpc.TransactionCoordinatorStub(channel)
        # The coordinator answers COORDINATOR_NOT_AVAILABLE while the store
        # restarts; a real client retries with a backoff, so this helper does too.
        give_up_at = time.monotonic() + 60
        while time.monotonic() < give_up_at:
            try:
                resp = stub.InitProducerId(co.InitProducerIdRequest(), timeout=10)
                return resp.producer_id
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            time.sleep(0.05)
        raise AssertionError(f"no producer id from {address} within 60 s")


def test_ids_unique_across_coordinators_and_crashes(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path, coordinators=2, group_coordinators=0,
        extra_args={"coordinator": ["--producer-id-block-size", "3"]},
    ) as cluster:
        coordinators = [cluster.address("coordinator", i) for i in range(2)]
        ids: list[int] = []
        for round_ in range(4):
            for _ in range(5):
                for address in coordinators:
                    ids.append(_init_producer_id(address))
            if round_ == 1:
                cluster.kill("coordinator", 0)
                cluster.restart("coordinator", 0)
            if round_ == 2:
                cluster.kill("partition_store", 0)
                cluster.restart("partition_store", 0)
        assert len(ids) == 40
        assert len(set(ids)) == len(ids), sorted(ids)

