"""An exactly-once consume-transform-produce copier (input topic -> output topic).

Run several of these with the same --group: the group coordinator spreads the
input partitions over them, and each process commits its output records and
its consumed offsets in one transaction. A crashed or replaced process resumes
exactly where the last committed transaction left off; a paused one that lost
its partitions (a zombie) is fenced when it tries to commit.

    python examples/copier.py --bootstrap 127.0.0.1:PORT --input in --output out \\
        --group copier --instance 0

The transform upper-cases the value and keeps key and headers, so the output
can be checked against the input record by record. Each output record also
carries the input's coordinates in a header (`src`), which is how the tests
detect a duplicate or a loss.

Exit codes: 0 after --idle-exit-s seconds with nothing to copy, 2 when the
producer is fenced for good (another process took over this instance id).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from oncelog import Consumer, ConsumerRecord, Producer, TopicPartition, errors
from oncelog.cli import client_security

log = logging.getLogger("copier")


def transform(record: ConsumerRecord) -> bytes:
    return (record.value or b"").upper()


class Copier:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.transactions = 0
        self.aborted_on_purpose = 0
        self.stopping = False
        security = client_security(args)
        self.consumer = Consumer(
            **security, bootstrap=args.bootstrap, group_id=args.group,
            isolation_level="read_committed", auto_offset_reset="earliest",
            enable_auto_commit=False, max_poll_records=args.max_poll_records,
            session_timeout_ms=args.session_timeout_ms,
        )
        self.consumer.subscribe([args.input])
        # One transactional id per instance: a restarted instance fences the
        # process it replaces; zombies of other instances are fenced by the
        # group (their TxnOffsetCommit carries a stale membership).
        self.producer = Producer(
            **security, bootstrap=args.bootstrap,
            transactional_id=f"{args.transactional_id_prefix}-{args.instance}",
            linger_ms=5, transaction_timeout_ms=args.transaction_timeout_ms,
        )
        self.producer.init_transactions()

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()

    def run(self) -> int:
        idle_since = time.monotonic()
        while not self.stopping:
            records = self.consumer.poll(timeout=0.2)
            if not records:
                if (self.args.idle_exit_s
                        and time.monotonic() - idle_since > self.args.idle_exit_s):
                    return 0
                continue
            idle_since = time.monotonic()
            try:
                self.copy(records)
            except errors.FatalError as exc:
                # Fenced (another process took over this instance id) or
                # otherwise unusable: this process must stop.
                log.warning("fatal: %r", exc)
                return 2
            except errors.OncelogError as exc:
                # Abortable (e.g. the group moved our partitions, or a write
                # failed): nothing of this transaction becomes visible.
                log.info("transaction failed (%r); aborting and rewinding", exc)
                self.abort_and_rewind()
        return 0

    def copy(self, records: Sequence[ConsumerRecord]) -> None:
        self.producer.begin_transaction()
        for r in records:
            self.producer.send(
                self.args.output, key=r.key, value=transform(r),
                headers=[*(r.headers or ()),
                         ("src", f"{r.topic}:{r.partition}:{r.offset}".encode())],
            )
        if self.args.test_stop_before_offsets == self.transactions + 1:
            # Test hook: freeze (SIGSTOP) with the transaction open, so a test
            # can let the group move our partitions and then wake us up as a
            # zombie.
            self.producer.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        offsets = {
            tp: self.consumer.position(tp)
            for tp in {TopicPartition(r.topic, r.partition) for r in records}
        }
        self.producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata())
        self.transactions += 1
        if self.args.abort_every and self.transactions % self.args.abort_every == 0:
            self.aborted_on_purpose += 1
            self.abort_and_rewind()
            return
        self.commit()

    def commit(self) -> None:
        """Commits; a commit whose outcome is unknown (a timeout) is retried,
        never turned into an abort: it may have committed already."""
        while True:
            try:
                self.producer.commit_transaction()
                return
            except errors.RetriableError as exc:
                log.info("commit outcome unknown (%r); retrying the commit", exc)

    def abort_and_rewind(self) -> None:
        self.producer.abort_transaction()
        # The output of the aborted transaction is gone; so must be our
        # progress: read again from the last committed offsets.
        self.consumer.seek_to_committed()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--instance", type=int, default=0,
                   help="this process's index; its transactional id is <prefix>-<instance>")
    p.add_argument("--transactional-id-prefix", default="copier")
    p.add_argument("--abort-every", type=int, default=0,
                   help="abort every Nth transaction on purpose (tests the rewind)")
    p.add_argument("--idle-exit-s", type=float, default=0.0,
                   help="exit after this long with nothing to copy (0: run until signalled)")
    p.add_argument("--max-poll-records", type=int, default=500)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--transaction-timeout-ms", type=int, default=30000)
    p.add_argument("--command-config", metavar="FILE",
                   help="client security settings, Kafka's client properties (security.protocol, "
                   "ssl.cafile, ssl.certfile, ssl.keyfile, sasl.oauthbearer.token.file), "
                   "read as the oncelog command reads its --command-config")
    p.add_argument("--test-stop-before-offsets", type=int, default=0, metavar="N",
                   help="tests only: SIGSTOP this process in transaction N, after its "
                   "records are sent and before its offsets are")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s copier %(levelname)s %(message)s")
    args = parse_args(argv)
    copier = Copier(args)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        copier.stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        code = copier.run()
    finally:
        copier.close()
    log.info("done: %d transactions (%d aborted on purpose)", copier.transactions,
             copier.aborted_on_purpose)
    return code


if __name__ == "__main__":
    sys.exit(main())
