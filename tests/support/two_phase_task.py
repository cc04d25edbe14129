"""A two-phase-commit writer in a process of its own, for tests that kill it.

    python -m tests.support.two_phase_task BOOTSTRAP TRANSACTIONAL_ID TOPIC PARTITIONS COUNT

Writes COUNT records ("<transactional id>-<i>", round robin over the
partitions) in one transaction, prepares it, prints `PREPARED <state>` (the
PreparedTxnState as text) and waits on stdin, holding the prepared
transaction, until the test kills it — as a Spark task hands its prepared
state to the driver and may die right after.
"""

from __future__ import annotations

import sys

from oncelog import Producer


def main(argv: list[str]) -> None:
    bootstrap, transactional_id, topic, partitions, count = argv
    producer = Producer(bootstrap=bootstrap, transactional_id=transactional_id,
                        transaction_two_phase_commit_enable=True,
                        transaction_timeout_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(int(count)):
        producer.send(topic, value=f"{transactional_id}-{i}".encode(),
                      partition=i % int(partitions))
    state = producer.prepare_transaction()
    print(f"PREPARED {state}", flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main(sys.argv[1:])
