"""Offsets of the Spark source as values: parsing, JSON, ranges and rate limits.

Pure logic (no Spark, no network), so every rule here is tested without a
cluster. The cluster-facing side is `cluster.py`; the Spark-facing side is
`source.py`.

Offsets travel through Spark as JSON shaped like Spark's Kafka source:
``{"payments": {"0": 42, "1": 17}}`` — topic, then partition number as a
string (JSON keys are strings), then the offset of the next record to read.
In `starting_offsets`/`ending_offsets` an offset may also be -2 (earliest)
or -1 (latest), as in Spark's Kafka source.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog import TopicPartition

EARLIEST = "earliest"
LATEST = "latest"
# Offsets that stand for "earliest"/"latest" inside an offsets JSON.
EARLIEST_OFFSET = -2
LATEST_OFFSET = -1

Offsets = dict[TopicPartition, int]


class OffsetsError(ValueError):
    """An offsets option or a checkpointed offset that cannot be used."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where a read starts or ends: `earliest`, `latest`, or per partition
    (`per_partition`, whose values may be EARLIEST_OFFSET/LATEST_OFFSET)."""

    where: str | None = None
    per_partition: Mapping[TopicPartition, int] | None = None

    def __post_init__(self) -> None:
        if (self.where is None) == (self.per_partition is None):
            raise ValueError("an OffsetSpec is either `where` or `per_partition`")

    @property
    def is_earliest(self) -> bool:
        return self.where == EARLIEST

    @property
    def is_latest(self) -> bool:
        return self.where == LATEST

    def mentions(self, offset: int) -> bool:
        """True when the spec asks for this special offset anywhere."""
        if self.per_partition is None:
            return (offset == EARLIEST_OFFSET and self.is_earliest) or (
                offset == LATEST_OFFSET and self.is_latest
            )
        return offset in self.per_partition.values()


def parse_spec(text: str, *, option: str) -> OffsetSpec:
    """`earliest`, `latest`, or an offsets JSON (-2/-1 allowed per partition)."""
    stripped = text.strip()
    if stripped.lower() in (EARLIEST, LATEST):
        return OffsetSpec(where=stripped.lower())
    try:
        parsed = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise OffsetsError(
            f"option {option!r} must be 'earliest', 'latest' or a JSON object like "
            f'{{"topic": {{"0": 42}}}}, got {text!r} ({exc.msg})'
        ) from None
    return OffsetSpec(per_partition=from_json_dict(parsed, what=f"option {option!r}",
                                                   allow_special=True))


def from_json_dict(value: Any, *, what: str, allow_special: bool = False) -> Offsets:
    """Offsets from their JSON shape; `what` names the source in errors."""
    if not isinstance(value, dict):
        raise OffsetsError(f"{what}: expected a JSON object of topics, got {value!r}")
    out: Offsets = {}
    lowest = EARLIEST_OFFSET if allow_special else 0
    for topic, partitions in value.items():
        if not isinstance(topic, str) or not topic:
            raise OffsetsError(f"{what}: topic names must be non-empty strings, got {topic!r}")
        if not isinstance(partitions, dict):
            raise OffsetsError(
                f"{what}: topic {topic!r} must map partition numbers to offsets, "
                f"got {partitions!r}"
            )
        for key, offset in partitions.items():
            try:
                partition = int(key)
            except (TypeError, ValueError):
                partition = -1
            if partition < 0 or str(partition) != str(key).strip():
                raise OffsetsError(
                    f"{what}: partition of topic {topic!r} must be a non-negative integer, "
                    f"got {key!r}"
                )
            # bool is an int in Python; an offset of `true` is a mistake.
            if type(offset) is not int or offset < lowest:
                allowed = "an offset >= 0, -2 (earliest) or -1 (latest)" if allow_special \
                    else "an offset >= 0"
                raise OffsetsError(
                    f"{what}: offset of {topic}-{partition} must be {allowed}, got {offset!r}"
                )
            out[TopicPartition(topic, partition)] = offset
    return out


def to_json_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The JSON shape of offsets, topics and partitions in order (so equal
    offsets always serialize to equal text in Spark's checkpoint)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def check_covers(spec: OffsetSpec, partitions: Iterable[TopicPartition], *, option: str) -> None:
    """A per-partition spec must name exactly the partitions of the read
    topics: a missing one would be read from an offset nobody chose, an extra
    one is a typo or a topic not in `topics` (Spark's Kafka source is as strict)."""
    if spec.per_partition is None:
        return
    wanted = set(partitions)
    named = set(spec.per_partition)
    missing = sorted(wanted - named)
    extra = sorted(named - wanted)
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing))
        if extra:
            parts.append(
                "not read by this query " + ", ".join(f"{tp.topic}-{tp.partition}" for tp in extra)
            )
        raise OffsetsError(
            f"option {option!r} must name every partition of the topics read, and only "
            f"those: {'; '.join(parts)}"
        )


def resolve(
    spec: OffsetSpec,
    partitions: Iterable[TopicPartition],
    *,
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
) -> Offsets:
    """Concrete offsets for a spec, given each partition's earliest and latest."""
    out: Offsets = {}
    for tp in partitions:
        if spec.per_partition is not None:
            offset = spec.per_partition[tp]
        else:
            offset = EARLIEST_OFFSET if spec.is_earliest else LATEST_OFFSET
        if offset == EARLIEST_OFFSET:
            offset = earliest[tp]
        elif offset == LATEST_OFFSET:
            offset = latest[tp]
        out[tp] = offset
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records of one partition with offsets in [start, end)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    *,
    earliest_of_new: Mapping[TopicPartition, int],
) -> list[OffsetRange]:
    """One range per partition of `end` with something to read.

    A partition in `end` but not in `start` appeared after the start offsets
    were taken (a new partition, or a topic added to the query): it is read
    from `earliest_of_new`. A partition only in `start` is no longer read.
    """
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        first = start[tp] if tp in start else earliest_of_new[tp]
        last = end[tp]
        if last < first:
            raise OffsetsError(
                f"end offset {last} of {tp.topic}-{tp.partition} is below its start "
                f"offset {first}"
            )
        if last > first:
            ranges.append(OffsetRange(tp.topic, tp.partition, first, last))
    return ranges


def limit_end(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_offsets: int,
) -> Offsets:
    """End offsets that take at most `max_offsets` offsets in total, spread
    fairly across the partitions of `latest` (each partition starts at its
    `start`, which must be given for all of them).

    Fair is max-min: every partition with a backlog gets an equal share, a
    share a partition cannot use goes to the others, and offsets left when
    the shares are smaller than one go to the partitions with the largest
    backlog (ties: partition order). So nothing starves, even with a limit
    below the number of partitions: the partition just read has the smaller
    backlog next time.
    """
    if max_offsets < 1:
        raise ValueError(f"max_offsets must be >= 1, got {max_offsets}")
    backlog = {tp: max(latest[tp] - start[tp], 0) for tp in latest}
    take = dict.fromkeys(latest, 0)
    remaining = max_offsets
    active = sorted(tp for tp, n in backlog.items() if n > 0)
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            by_backlog = sorted(active, key=lambda tp: (-(backlog[tp] - take[tp]), tp))
            for tp in by_backlog[:remaining]:
                take[tp] += 1
            break
        still_active = []
        for tp in active:
            given = min(share, backlog[tp] - take[tp])
            take[tp] += given
            remaining -= given
            if take[tp] < backlog[tp]:
                still_active.append(tp)
        active = still_active
    return {tp: start[tp] + take[tp] for tp in latest}
