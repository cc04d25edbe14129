"""What the source's planning side asks the cluster: partitions and offsets.

Used where Spark plans (the batch reader's `partitions()`, the stream
reader's `initialOffset`/`latestOffset`/`partitions`), never in the tasks
that read records (`reading.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

from oncelog import Admin, Consumer, TopicPartition, errors
from oncelog_spark.offsets import Offsets
from oncelog_spark.options import SourceOptions


class ClusterView:
    """Partitions and offsets of the topics a query reads.

    Holds one Admin and one Consumer, created on first use and kept until
    close(), so a stream reader asking for end offsets at every trigger does
    not dial the cluster anew each time.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._admin: Admin | None = None
        self._consumer: Consumer | None = None

    def topic_partitions(self) -> tuple[list[TopicPartition], list[str]]:
        """Every partition of the topics the query reads, and the topics it
        names that do not exist. Asked fresh each time (one ListTopics
        call), so partitions added to a topic, and new topics that
        `topic_pattern` matches, are found at every micro-batch. Internal
        topics (`__consumer_offsets`, ...) are never listed, so a pattern
        does not match them (as Kafka's exclude.internal.topics)."""
        opts = self._options
        counts = self._admin_client().list_topics()
        if opts.topic_pattern is not None:
            topics = sorted(t for t in counts if opts.reads(t))
            missing: list[str] = []
        else:
            topics = [t for t in opts.topics if t in counts]
            missing = [t for t in opts.topics if t not in counts]
        return [TopicPartition(topic, p) for topic in topics for p in range(counts[topic])], \
            missing

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the topics read; every topic named must exist."""
        tps, missing = self.topic_partitions()
        if missing:
            raise self.missing_topics_error(missing)
        return tps

    def missing_topics_error(self, missing: list[str]) -> errors.OncelogError:
        return errors.error_for(
            errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"oncelog source: topic(s) {', '.join(missing)} do not exist at "
            f"{self._options.bootstrap} (create them before reading)",
        )

    def earliest(self, partitions: Iterable[TopicPartition]) -> Offsets:
        """The first offset still in each partition's log."""
        tps = list(partitions)
        return self._consumer_client().beginning_offsets(tps) if tps else {}

    def latest(self, partitions: Iterable[TopicPartition]) -> Offsets:
        """The end of each partition for the query's isolation level: the last
        stable offset under read_committed, the high watermark under
        read_uncommitted."""
        tps = list(partitions)
        return self._consumer_client().end_offsets(tps) if tps else {}

    def high_watermarks(self, topics: Iterable[str]) -> Offsets:
        """The end of each partition's log, open transactions included."""
        admin = self._admin_client()
        out: Offsets = {}
        for topic in topics:
            for p in admin.describe_topic(topic).partitions:
                out[TopicPartition(topic, p.partition)] = p.high_watermark
        return out

    def _admin_client(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(bootstrap=self._options.bootstrap,
                                **self._options.security.client_options())
        return self._admin

    def _consumer_client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(
                bootstrap=self._options.bootstrap,
                isolation_level=self._options.isolation_level,
                **self._options.security.client_options(),
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def __enter__(self) -> ClusterView:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
