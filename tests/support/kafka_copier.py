"""An exactly-once copier written with confluent-kafka (librdkafka) alone, as
its users write one: a consumer group reads `input` under read_committed,
and each polled batch goes to `output` in one transaction with the group's
offsets (send_offsets_to_transaction). Run as its own process by the
Kafka-protocol tests, which kill -9 the servers under it:

    python -m tests.support.kafka_copier BOOTSTRAP INPUT OUTPUT GROUP TXN_ID EXPECTED [PER_TXN]

It handles errors as librdkafka's own transactional example does: an
abortable error aborts the transaction and rewinds the consumer to the
group's committed offsets; a retriable commit is retried, and so is its
look at the group's committed offsets while the group coordinator fails
over; a fatal error
ends the process with status 3 (the test starts a new one, whose
init_transactions fences this one). It exits 0 once the group's committed
offsets cover EXPECTED input records, printing how many transactions it
committed and aborted.
"""

from __future__ import annotations

import json
import sys
import time

import confluent_kafka as ck

# Failure guards, not expectations: a run that makes no progress this long
# ends with status 4.
STALL_S = 120.0
# Records per transaction unless the caller says otherwise.
POLL_RECORDS = 200
FATAL_EXIT = 3
# What consumer.committed() raises while the group coordinator fails over
# (not flagged retriable by librdkafka, which raises them from this call).
COORDINATOR_MOVING = frozenset({ck.KafkaError.COORDINATOR_NOT_AVAILABLE,
                                ck.KafkaError.NOT_COORDINATOR,
                                ck.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                ck.KafkaError._TIMED_OUT, ck.KafkaError._TRANSPORT})
RETRY_BACKOFF_S = 0.2
STALLED_EXIT = 4


def committed_total(consumer: ck.Consumer, topic: str, partitions: int) -> int:
    offsets = consumer.committed([ck.TopicPartition(topic, p) for p in range(partitions)],
                                 timeout=30)
    return sum(max(tp.offset, 0) for tp in offsets)


def coordinator_moving(error: ck.KafkaError) -> bool:
    """The group coordinator is down or moving (killed, failing over): a
    question to it is asked again, not a reason to stop."""
    return error.retriable() or error.code() in COORDINATOR_MOVING


def rewind(consumer: ck.Consumer) -> None:
    """Back to the group's committed offsets (after an abort)."""
    assigned = consumer.assignment()
    if not assigned:
        return
    for tp in consumer.committed(assigned, timeout=30):
        consumer.seek(ck.TopicPartition(tp.topic, tp.partition,
                                        tp.offset if tp.offset >= 0 else ck.OFFSET_BEGINNING))


def main(argv: list[str]) -> int:
    bootstrap, source, target, group, transactional_id, expected_text, *rest = argv
    expected = int(expected_text)
    per_txn = int(rest[0]) if rest else POLL_RECORDS
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "isolation.level": "read_committed", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest", "session.timeout.ms": 10000})
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                            "transaction.timeout.ms": 30000, "linger.ms": 5})
    producer.init_transactions(60)
    metadata = consumer.list_topics(source, timeout=30)
    partitions = len(metadata.topics[source].partitions)
    consumer.subscribe([source])
    committed_txns = aborted_txns = 0
    last_progress = time.monotonic()
    try:
        while True:
            if time.monotonic() - last_progress > STALL_S:
                print(json.dumps({"stalled": True, "committed": committed_txns}))
                return STALLED_EXIT
            try:
                done = committed_total(consumer, source, partitions)
            except ck.KafkaException as exc:
                if not coordinator_moving(exc.args[0]):
                    raise
                # Kafka's answer while the group's coordinator fails over:
                # ask again, as librdkafka does for its own offset fetches.
                time.sleep(RETRY_BACKOFF_S)
                continue
            if done >= expected:
                print(json.dumps({"committed": committed_txns, "aborted": aborted_txns}))
                return 0
            messages = [m for m in consumer.consume(per_txn, timeout=1.0)
                        if m.error() is None]
            if not messages:
                continue
            try:
                producer.begin_transaction()
                for message in messages:
                    producer.produce(target, key=message.key(), value=message.value())
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()),
                    consumer.consumer_group_metadata(), 60)
                while True:
                    try:
                        producer.commit_transaction(60)
                        break
                    except ck.KafkaException as exc:
                        if exc.args[0].retriable():
                            continue
                        raise
                committed_txns += 1
                last_progress = time.monotonic()
            except ck.KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    print(json.dumps({"fatal": str(error)}), flush=True)
                    return FATAL_EXIT
                producer.abort_transaction(60)
                aborted_txns += 1
                rewind(consumer)
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
