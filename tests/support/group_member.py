"""One group consumer as its own process, logging what it owns and processes.

    python -m tests.support.group_member --bootstrap ADDR --group G --topic T \\
        --name NAME --log FILE [--session-timeout-ms MS]

Subscribes to the topic and, until SIGTERM, polls, "processes" each record by
logging it, and commits after every poll. Every event goes to FILE as one
JSON line, appended with one write (O_APPEND), so several members can share
the file: `{"t": monotonic ns, "m": NAME, "e": EVENT, ...}` where EVENT is

* "assign" / "revoke" / "lost" with "p" (partitions) and "gen" (the member
  epoch then) — written when the callback starts (assign) or ends (revoke,
  lost), so an ownership interval in the log covers the real one;
* "records" with "r" ([partition, offset] pairs), after they were processed;
* "closed", after close() has left the group.

CLOCK_MONOTONIC is one clock for every process on the machine, so times from
different members compare. SIGTERM is a graceful leave (close(): on_revoke,
then the leave heartbeat); SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

from oncelog import Consumer, TopicPartition
from oncelog.errors import OncelogError


class EventLog:
    def __init__(self, path: str, name: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._name = name

    def write(self, event: str, **fields: object) -> None:
        line = json.dumps({"t": time.monotonic_ns(), "m": self._name, "e": event, **fields})
        os.write(self._fd, (line + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=3_000)
    args = parser.parse_args()
    events = EventLog(args.log, args.name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())

    consumer = Consumer(bootstrap=args.bootstrap, group_id=args.group,
                        session_timeout_ms=args.session_timeout_ms, fetch_max_wait_ms=100,
                        max_poll_records=50)

    def names(tps: list[TopicPartition]) -> list[int]:
        return [tp.partition for tp in tps]

    def on_assign(tps: list[TopicPartition]) -> None:
        events.write("assign", p=names(tps), gen=consumer.group_metadata().generation_id)

    def on_revoke(tps: list[TopicPartition]) -> None:
        consumer.commit()  # what was processed here, before another member takes over
        events.write("revoke", p=names(tps), gen=consumer.group_metadata().generation_id)

    def on_lost(tps: list[TopicPartition]) -> None:
        events.write("lost", p=names(tps), gen=consumer.group_metadata().generation_id)

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    events.write("started")
    while not stop.is_set():
        records = consumer.poll(timeout=0.1)
        if records:
            events.write("records", r=[[r.partition, r.offset] for r in records])
            try:
                consumer.commit()
            except OncelogError as exc:  # lost meanwhile: the next poll tells on_lost
                events.write("commit_failed", error=repr(exc))
    consumer.close()
    events.write("closed")


if __name__ == "__main__":
    main()
