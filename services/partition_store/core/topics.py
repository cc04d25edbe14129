"""Topics: name and configuration rules (Kafka's), the catalog record, and its
encoding.

Names: 1..249 characters from [a-zA-Z0-9._-], not "." or "..". Names starting
with "__" are internal: the store creates them itself (the layout's internal
topics) and users cannot.

Configuration keys (anything else is INVALID_CONFIG naming the key):
  retention.ms       -1 (forever) or >= 0; default 7 days
  retention.bytes    -1 (no limit) or >= 0; default -1
  max.message.bytes  the largest encoded batch accepted, HEADER_SIZE_BYTES ..
                     limits.MAX_BATCH_BYTES_CEILING; default limits.DEFAULT_MAX_BATCH_BYTES
  cleanup.policy     delete | compact | compact,delete; default delete.
                     "delete": time/size retention; "compact": the log cleaner
                     keeps the newest record per key (core/compaction.py) and
                     nothing is deleted by time or size; both: both.
                     Internal topics are always compacted and never deleted
                     by time or size, whatever their catalog entry says (see
                     TopicRecord.compacted and .deletes).
  delete.retention.ms  how long a tombstone (or a transaction marker) stays
                     after it first entered the cleaned part of a compacted
                     log, >= 0; default 1 day (Kafka's)
  min.cleanable.dirty.ratio  compact a partition when the bytes written since
                     its last cleaning are at least this share of the log,
                     0.0..1.0; default 0.5 (Kafka's)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import HEADER_SIZE_BYTES

from ...common.kernel import limits
from ...common.metadata.cluster import INTERNAL_PREFIX
from .codec import CorruptValueError, seal, unseal
from .outcomes import Rejection

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
CLEANUP_POLICY = "cleanup.policy"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
CONFIG_KEYS = (
    RETENTION_MS, RETENTION_BYTES, MAX_MESSAGE_BYTES, CLEANUP_POLICY, DELETE_RETENTION_MS,
    MIN_CLEANABLE_DIRTY_RATIO, MIN_INSYNC_REPLICAS,
)
DEFAULT_MIN_INSYNC_REPLICAS = 2

DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
DEFAULT_DELETE_RETENTION_MS = 24 * 60 * 60 * 1000
DEFAULT_MIN_CLEANABLE_DIRTY_RATIO = 0.5
POLICY_DELETE = "delete"
POLICY_COMPACT = "compact"

# Internal topics hold the coordinators' state; nothing may age out of them.
INTERNAL_TOPIC_CONFIG: Mapping[str, str] = {
    RETENTION_MS: "-1",
    RETENTION_BYTES: "-1",
    CLEANUP_POLICY: POLICY_COMPACT,
}

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_ILLEGAL_CHAR = re.compile(r"[^a-zA-Z0-9._-]")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's effective configuration (overrides applied to defaults)."""

    retention_ms: int = DEFAULT_RETENTION_MS
    retention_bytes: int = -1
    max_message_bytes: int = limits.DEFAULT_MAX_BATCH_BYTES
    cleanup_policy: frozenset[str] = frozenset({POLICY_DELETE})
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    min_cleanable_dirty_ratio: float = DEFAULT_MIN_CLEANABLE_DIRTY_RATIO
    min_insync_replicas: int = DEFAULT_MIN_INSYNC_REPLICAS

    @property
    def deletes(self) -> bool:
        """Whether retention deletes old batches of this topic at all."""
        return POLICY_DELETE in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        """Whether the policy asks for compaction (TopicRecord.compacted also
        counts internal topics)."""
        return POLICY_COMPACT in self.cleanup_policy

    def as_strings(self) -> dict[str, str]:
        return {
            RETENTION_MS: str(self.retention_ms),
            RETENTION_BYTES: str(self.retention_bytes),
            MAX_MESSAGE_BYTES: str(self.max_message_bytes),
            CLEANUP_POLICY: ",".join(sorted(self.cleanup_policy)),
            DELETE_RETENTION_MS: str(self.delete_retention_ms),
            MIN_CLEANABLE_DIRTY_RATIO: str(self.min_cleanable_dirty_ratio),
            MIN_INSYNC_REPLICAS: str(self.min_insync_replicas),
        }


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One topic in the catalog. A deleted and re-created topic gets a new
    topic_id, and stored data is keyed by topic_id, so the two never mix."""

    name: str
    topic_id: int
    partitions: int
    # The overrides the creator gave (sorted key/value pairs).
    config_overrides: tuple[tuple[str, str], ...]
    internal: bool
    config: TopicConfig

    @staticmethod
    def build(
        *, name: str, topic_id: int, partitions: int, overrides: Mapping[str, str],
        internal: bool,
    ) -> TopicRecord:
        """A record from overrides that validate_config has accepted."""
        parsed = parse_config(overrides)
        if isinstance(parsed, Rejection):
            raise CorruptValueError(f"topic {name!r}: {parsed.message}")
        return TopicRecord(
            name=name, topic_id=topic_id, partitions=partitions,
            config_overrides=tuple(sorted(overrides.items())), internal=internal,
            config=parsed,
        )

    @property
    def compacted(self) -> bool:
        """Whether the log cleaner compacts this topic and produce requires
        keys. Internal topics always are: the coordinators' state is keyed
        records (newest per key = current state), and a data directory whose
        internal topics were created under another policy must not grow
        forever because of it."""
        return self.internal or self.config.compacts

    @property
    def deletes(self) -> bool:
        """Whether retention deletes old batches by time and size. Never for
        an internal topic, whatever its catalog entry says: the
        coordinators' state must not age out (compaction bounds it)."""
        return self.config.deletes and not self.internal

    def topic_partition(self, partition: int) -> str:
        return f"{self.name}-{partition}"


def validate_topic_name(name: str, *, allow_internal: bool = False) -> Rejection | None:
    def bad(why: str) -> Rejection:
        return Rejection(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} {why}")

    if not name:
        return Rejection(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if len(name) > limits.MAX_TOPIC_NAME_LENGTH:
        return bad(
            f"is {len(name)} characters long, over the limit of {limits.MAX_TOPIC_NAME_LENGTH}"
        )
    if name in (".", ".."):
        return bad("is not allowed")
    if not _LEGAL_NAME.fullmatch(name):
        found = _ILLEGAL_CHAR.search(name)
        char = found.group(0) if found else "?"
        return bad(
            f"contains {char!r}; only ASCII letters, digits, '.', '_' and '-' are allowed"
        )
    if name.startswith(INTERNAL_PREFIX) and not allow_internal:
        return bad(f"starts with {INTERNAL_PREFIX!r}, which is reserved for internal topics")
    return None


def validate_partitions(name: str, partitions: int) -> Rejection | None:
    if not 1 <= partitions <= limits.MAX_PARTITIONS_PER_TOPIC:
        return Rejection(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r}: partitions must be 1..{limits.MAX_PARTITIONS_PER_TOPIC}, "
            f"got {partitions}",
        )
    return None


def parse_config(overrides: Mapping[str, str]) -> TopicConfig | Rejection:
    """The effective configuration, or INVALID_CONFIG naming the key and value."""
    values: dict[str, int] = {}
    policy = frozenset({POLICY_DELETE})
    dirty_ratio = DEFAULT_MIN_CLEANABLE_DIRTY_RATIO
    for key in sorted(overrides):
        value = overrides[key]
        if key not in CONFIG_KEYS:
            return Rejection(
                ErrorCode.INVALID_CONFIG,
                f"unknown config key {key!r}; known keys: {', '.join(CONFIG_KEYS)}",
            )
        if key == CLEANUP_POLICY:
            parts = [p.strip() for p in value.split(",")]
            if not parts or any(p not in (POLICY_DELETE, POLICY_COMPACT) for p in parts) or (
                len(set(parts)) != len(parts)
            ):
                return Rejection(
                    ErrorCode.INVALID_CONFIG,
                    f"{key}={value!r}: expected 'delete', 'compact' or 'compact,delete'",
                )
            policy = frozenset(parts)
            continue
        if key == MIN_CLEANABLE_DIRTY_RATIO:
            try:
                ratio = float(value.strip())
            except ValueError:
                return Rejection(ErrorCode.INVALID_CONFIG, f"{key}={value!r}: not a number")
            if not 0.0 <= ratio <= 1.0:
                return Rejection(
                    ErrorCode.INVALID_CONFIG, f"{key}={value!r}: must be between 0.0 and 1.0"
                )
            dirty_ratio = ratio
            continue
        try:
            number = int(value.strip())
        except ValueError:
            return Rejection(ErrorCode.INVALID_CONFIG, f"{key}={value!r}: not an integer")
        if key in (RETENTION_MS, RETENTION_BYTES) and number < -1:
            return Rejection(
                ErrorCode.INVALID_CONFIG, f"{key}={number}: must be -1 (no limit) or >= 0"
            )
        if key == MIN_INSYNC_REPLICAS and number < 1:
            return Rejection(ErrorCode.INVALID_CONFIG, f"{key}={number}: must be >= 1")
        if key == DELETE_RETENTION_MS and number < 0:
            return Rejection(ErrorCode.INVALID_CONFIG, f"{key}={number}: must be >= 0")
        if key == MAX_MESSAGE_BYTES and not (
            HEADER_SIZE_BYTES <= number <= limits.MAX_BATCH_BYTES_CEILING
        ):
            return Rejection(
                ErrorCode.INVALID_CONFIG,
                f"{key}={number}: must be {HEADER_SIZE_BYTES}.."
                f"{limits.MAX_BATCH_BYTES_CEILING} bytes",
            )
        values[key] = number
    return TopicConfig(
        retention_ms=values.get(RETENTION_MS, DEFAULT_RETENTION_MS),
        retention_bytes=values.get(RETENTION_BYTES, -1),
        max_message_bytes=values.get(MAX_MESSAGE_BYTES, limits.DEFAULT_MAX_BATCH_BYTES),
        cleanup_policy=policy,
        delete_retention_ms=values.get(DELETE_RETENTION_MS, DEFAULT_DELETE_RETENTION_MS),
        min_cleanable_dirty_ratio=dirty_ratio,
        min_insync_replicas=values.get(MIN_INSYNC_REPLICAS, DEFAULT_MIN_INSYNC_REPLICAS),
    )


def validate_new_topic(
    name: str, partitions: int, overrides: Mapping[str, str], *, allow_internal: bool = False
) -> Rejection | TopicConfig:
    """Checks a CreateTopics entry: name, then partitions, then config."""
    rejection = validate_topic_name(name, allow_internal=allow_internal) or (
        validate_partitions(name, partitions)
    )
    if rejection is not None:
        return rejection
    parsed = parse_config(overrides)
    if isinstance(parsed, Rejection):
        return Rejection(parsed.code, f"topic {name!r}: {parsed.message}")
    return parsed


def grow_topic(name: str, record: TopicRecord | None, count: int) -> Rejection | TopicRecord:
    """A CreatePartitions entry (Kafka's rules, KIP-195) against the topic as
    the catalog has it: the topic's record with `count` partitions (its id
    and configuration unchanged), or the first rule it breaks, in order:

    1. the topic exists (UNKNOWN_TOPIC_OR_PARTITION);
    2. it is not internal (INVALID_REQUEST): the coordinators place
       transactional ids and groups by hashing over its partition count, so
       a new count would move their state to partitions they never wrote;
    3. the count grows (INVALID_PARTITIONS for an equal or lower one: a
       partition is never removed, its records would go with it);
    4. the count is within limits.MAX_PARTITIONS_PER_TOPIC (INVALID_PARTITIONS)."""
    if record is None:
        return Rejection(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    if record.internal:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"topic {name!r} is internal: its {record.partitions} partitions cannot change "
            "(the coordinators place their state by hashing over that count)",
        )
    if count == record.partitions:
        return Rejection(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} already has {record.partitions} partitions; ask for more "
            f"than {record.partitions}",
        )
    if count < record.partitions:
        return Rejection(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} has {record.partitions} partitions; {count} would not be an "
            "increase (partitions are never removed)",
        )
    if count > limits.MAX_PARTITIONS_PER_TOPIC:
        return Rejection(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r}: partitions must be 1..{limits.MAX_PARTITIONS_PER_TOPIC}, "
            f"got {count}",
        )
    return replace(record, partitions=count)


CATALOG_VERSION = 1


def topic_record_json(record: TopicRecord) -> str:
    """The catalog record as JSON: sealed on a store's disk, plain in the
    metadata store (etcd)."""
    return json.dumps({
        "name": record.name,
        "topic_id": record.topic_id,
        "partitions": record.partitions,
        "config": dict(record.config_overrides),
        "internal": record.internal,
    }, sort_keys=True)


def encode_topic_record(record: TopicRecord) -> bytes:
    return seal(CATALOG_VERSION, topic_record_json(record).encode())


def decode_topic_record(data: bytes) -> TopicRecord:
    return topic_record_from_json(
        unseal(data, version=CATALOG_VERSION, what="topic catalog record")
    )


def topic_record_from_json(payload: str | bytes) -> TopicRecord:
    try:
        doc = json.loads(payload)
        name, topic_id, partitions = doc["name"], doc["topic_id"], doc["partitions"]
        config, internal = doc["config"], doc["internal"]
        if not (
            isinstance(name, str) and isinstance(topic_id, int) and isinstance(partitions, int)
            and isinstance(config, dict) and isinstance(internal, bool)
        ):
            raise TypeError("a field has the wrong type")
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptValueError(f"topic catalog record does not parse: {exc}") from exc
    return TopicRecord.build(
        name=name, topic_id=topic_id, partitions=partitions,
        overrides={str(k): str(v) for k, v in config.items()}, internal=internal,
    )
