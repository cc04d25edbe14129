"""The SDK honours the stores' throttle times (client quotas, KIP-13).

Goal: after a store answers a Produce with a throttle time, the producer
sends that store nothing until the time has passed, then sends what waited
(nothing lost); after a store answers a Fetch with one, the consumer does
not fetch from it until then, then reads everything; both sum the throttle
times they were answered in `produce_throttle_time` / `fetch_throttle_time`.

Method: tests/support/inprocess_cluster.InProcessCluster (the real store
in this process) whose `produce_reply` / `fetch_reply` add a throttle time
of a minute to the first answer, and the clients' clocks replaced by one
the test moves (`oncelog.producer._now_ms`, `oncelog._fetcher._monotonic_ms`),
so the minute passes when the test says so. "Nothing was sent meanwhile"
is checked after a wait that a correct client survives however long it is
(a longer wait only makes the check stronger).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncelog import Consumer, Producer, TopicPartition, _fetcher, errors, producer
from oncelog.types import ThrottleTime
from oncelog.v1 import partition_store_pb2 as pb
from tests.support.inprocess_cluster import InProcessCluster

THROTTLE_MS = 60_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def store() -> Iterator[InProcessCluster]:
    with InProcessCluster(group_coordinator=False) as cluster:
        yield cluster


def test_the_producer_waits_out_a_throttle_time(store: InProcessCluster,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(producer, "_now_ms", clock)
    store.create_topic("t", 1)
    answers = [0]

    def throttle_first(reply: pb.ProduceResponse) -> pb.ProduceResponse:
        answers[0] += 1
        if answers[0] == 1:
            reply.throttle_time_ms = THROTTLE_MS
        return reply

    store.produce_reply = throttle_first
    with Producer(bootstrap=store.address, client_id="me", linger_ms=0) as p:
        p.send("t", value=b"a").result(timeout=30)
        assert p.produce_throttle_time == ThrottleTime(count=1, total_ms=THROTTLE_MS,
                                                       max_ms=THROTTLE_MS)
        sent = store.produce_calls
        waiting = p.send("t", value=b"b")
        with pytest.raises(errors.KafkaTimeoutError):
            p.flush(timeout=1.0)
        assert store.produce_calls == sent, "sent to a store that throttles the producer"
        clock.now_ms += THROTTLE_MS
        assert waiting.result(timeout=30).offset == 1
        assert store.produce_calls == sent + 1
    assert [r.client_id for r in store.calls_named("Produce")] == ["me", "me"]


def test_the_consumer_waits_out_a_throttle_time(store: InProcessCluster,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(_fetcher, "_monotonic_ms", clock)
    store.create_topic("t", 1)
    with Producer(bootstrap=store.address) as p:
        for value in (b"a", b"b"):
            p.send("t", value=value)
    answers = [0]

    def throttle_first(reply: pb.FetchResponse) -> pb.FetchResponse:
        answers[0] += 1
        if answers[0] == 1:
            # What a throttled store answers: no batches, the same offsets.
            for result in reply.results:
                del result.batches[:]
                result.next_fetch_offset = 0
            reply.throttle_time_ms = THROTTLE_MS
        return reply

    store.fetch_reply = throttle_first
    with Consumer(bootstrap=store.address, client_id="reader") as c:
        c.assign([TopicPartition("t", 0)])
        got = [r.value for r in c.poll(timeout=1.0)]
        got += [r.value for r in c.poll(timeout=1.0)]
        assert got == []
        assert store.fetch_calls == 1, "fetched from a store that throttles the consumer"
        assert c.fetch_throttle_time.count == 1
        clock.now_ms += THROTTLE_MS
        for _ in range(60):
            got += [r.value for r in c.poll(timeout=0.5)]
            if len(got) == 2:
                break
        assert got == [b"a", b"b"]
    assert {r.client_id for r in store.calls_named("Fetch")} == {"reader"}
