"""KafkaJS, unchanged, runs an exactly-once copier through the Kafka listener.

Goal: a team on Node.js keeps its Kafka client: examples/kafkajs/copier.js
(KafkaJS 2.2 from the committed lockfile) reads a topic with a consumer
group under read_committed and writes each batch in a transaction that also
commits the group's offsets (sendOffsets). Its first transaction is
aborted on purpose. Afterwards every input record is in the output exactly
once, nothing of the aborted transaction is visible, and the group's
committed offsets are the input's end offsets.

Method: a LocalCluster with a Kafka listener; the input written by
librdkafka; `node copier.js --abort-first` as a subprocess (node and the
package come from scripts/setup.sh; a missing node fails the test rather
than skipping it); the output read back by librdkafka under
read_committed, the offsets with librdkafka's committed().
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.testing import LocalCluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kafkajs"
RECORDS = 500
PARTITIONS = 2
# Failure guards, not expectations.
NODE_TIMEOUT_S = 180.0
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafkajs") / "cluster", kafka_listener=True,
                      extra_args={"group_coordinator": ["--initial-rebalance-delay-ms",
                                                        "300"]}) as c:
        yield c


def test_the_kafkajs_copier_is_exactly_once(cluster: LocalCluster) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed; bash scripts/setup.sh installs it")
    if not (EXAMPLE / "node_modules" / "kafkajs").is_dir():
        pytest.fail(f"{EXAMPLE}/node_modules is missing; bash scripts/setup.sh runs npm ci there")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, num_partitions=PARTITIONS)
                                       for t in ("js-in", "js-out")]).values():
        future.result(timeout=DEADLINE_S)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce("js-in", key=b"k%d" % (i % 10), value=b"%d" % i)
    assert producer.flush(DEADLINE_S) == 0

    result = subprocess.run(
        [node, str(EXAMPLE / "copier.js"), "--brokers", cluster.kafka_bootstrap, "--input",
         "js-in", "--output", "js-out", "--group", "js-copier", "--expect", str(RECORDS),
         "--abort-first"], cwd=EXAMPLE, capture_output=True, text=True,
        timeout=NODE_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["aborted"] == 1 and report["copied"] == RECORDS

    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "group.id": "js-check", "isolation.level": "read_committed"})
    consumer.assign([ck.TopicPartition("js-out", p, ck.OFFSET_BEGINNING)
                     for p in range(PARTITIONS)])
    values: list[bytes] = []
    quiet_since = time.monotonic()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is None or message.error() is not None:
            if len(values) >= RECORDS and time.monotonic() - quiet_since > 2:
                break
            continue
        quiet_since = time.monotonic()
        value = message.value()
        assert value is not None
        values.append(value)
    ends = [consumer.get_watermark_offsets(ck.TopicPartition("js-in", p), timeout=DEADLINE_S)[1]
            for p in range(PARTITIONS)]
    consumer.close()
    counts = Counter(values)
    assert {v for v, n in counts.items() if n > 1} == set()
    assert set(counts) == {b"%d" % i for i in range(RECORDS)}
    # The copier's group committed exactly the input's end offsets.
    offsets = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "js-copier"})
    try:
        committed = offsets.committed([ck.TopicPartition("js-in", p) for p in range(PARTITIONS)],
                                      timeout=DEADLINE_S)
    finally:
        offsets.close()
    assert [tp.offset for tp in committed] == ends
