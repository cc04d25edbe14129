"""Committed offsets, as decisions over one `__consumer_offsets` partition's
replayed state: what a commit may contain, what OffsetFetch answers, which
records delete a group or apply retention. Pure: the runtime passes in the
state, the partition counts it read and the time, and persists what comes
back (docs/groups.md, "Committed offsets" and "Admin").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode

from ...common.kernel import limits
from ...common.kernel.errors import ServiceError
from .classic import AnyGroup, in_use
from .offsets_log import (
    CommittedOffset,
    Entry,
    OffsetsPartitionState,
    encode_group_tombstone,
    encode_offset_tombstone,
)

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    tp: TP
    offset: int
    metadata: str
    error: ServiceError | None = None


def check_topic_names(where: str, topics: Iterable[str], code: ErrorCode, *,
                      allow_empty: bool = False) -> None:
    """Refuses a topic name longer than any topic's may be (no topic has it;
    it would be stored in the group's records, and an error naming it whole
    would not fit in a gRPC status), and, unless allowed, an empty one."""
    for topic in topics:
        if not topic and not allow_empty:
            raise ServiceError(code, f"{where} names a topic with an empty name")
        if len(topic) > limits.MAX_TOPIC_NAME_LENGTH:
            raise ServiceError(
                code,
                f"{where} names topic {topic[:32]!r}..., {len(topic)} characters long, over "
                f"the limit of {limits.MAX_TOPIC_NAME_LENGTH}",
            )


def check_offsets(group_id: str, partitions: Sequence[tuple[TP, int, str]], *,
                  max_metadata_bytes: int) -> set[TP]:
    """Bad input fails the whole request, naming what was wrong. Returns the
    partitions, whose existence the caller checks next (`check_known`)."""
    if not partitions:
        raise ServiceError(ErrorCode.INVALID_REQUEST, "the commit names no partition")
    # No topic has such a name: unknown, as below, but named clearly.
    check_topic_names(f"group {group_id!r}: the commit", (tp[0] for tp, _, _ in partitions),
                      ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    seen: set[TP] = set()
    for tp, offset, metadata in partitions:
        where = f"group {group_id!r}, {tp[0]}-{tp[1]}"
        if tp in seen:
            raise ServiceError(ErrorCode.INVALID_REQUEST, f"{where} appears twice")
        seen.add(tp)
        if offset < 0:
            raise ServiceError(ErrorCode.INVALID_REQUEST,
                               f"{where}: offset {offset} is negative")
        metadata_bytes = len(metadata.encode())
        if metadata_bytes > max_metadata_bytes:
            raise ServiceError(
                ErrorCode.OFFSET_METADATA_TOO_LARGE,
                f"{where}: metadata is {metadata_bytes} bytes, over the "
                f"{max_metadata_bytes}-byte limit",
            )
    return seen


def check_known(group_id: str, partitions: Iterable[TP], counts: Mapping[str, int]) -> None:
    """Every committed partition must exist (`counts`: partitions per topic)."""
    unknown = sorted(tp for tp in partitions if not 0 <= tp[1] < counts.get(tp[0], 0))
    if unknown:
        raise ServiceError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"group {group_id!r}: no such partition(s): "
            + ", ".join(f"{t}-{p}" for t, p in unknown),
        )


def raise_first_refusal(refused: Mapping[TP, ServiceError]) -> None:
    """A commit is atomic: one refused partition refuses it whole, named
    (with how many more were refused)."""
    if refused:
        first = refused[min(refused)]
        raise ServiceError(
            first.code,
            first.message if len(refused) == 1 else
            f"{first.message} (and {len(refused) - 1} more partition(s))",
        )


def fetch_offsets(state: OffsetsPartitionState, *, group_id: str, partitions: Sequence[TP],
                  require_stable: bool) -> list[FetchedOffset]:
    """OffsetFetch: the committed offset per partition (-1: none; all the
    group's when none is named). With require_stable, a partition with a
    transactional offset pending answers UNSTABLE_OFFSET_COMMIT instead."""
    committed = state.offsets.get(group_id, {})
    wanted = sorted(committed) if not partitions else list(partitions)
    if not partitions and require_stable:
        wanted = sorted(set(wanted) | {
            tp for by_group in state.pending.values()
            for tp in by_group.get(group_id, {})
        })
    out = []
    for tp in wanted:
        if require_stable and state.has_pending(group_id, tp):
            out.append(FetchedOffset(tp, -1, "", ServiceError(
                ErrorCode.UNSTABLE_OFFSET_COMMIT,
                f"group {group_id!r}, {tp[0]}-{tp[1]}: a transactional offset commit is "
                "pending; retry",
            )))
            continue
        value: CommittedOffset | None = committed.get(tp)
        out.append(FetchedOffset(tp, value.offset if value else -1,
                                 value.metadata if value else ""))
    return out


def removal_records(state: OffsetsPartitionState, group_id: str) -> list[Entry]:
    """The tombstones that remove a group: its offsets, then its membership."""
    entries = [encode_offset_tombstone(group_id, tp)
               for tp in sorted(state.offsets.get(group_id, {}))]
    if group_id in state.groups:
        entries.append(encode_group_tombstone(group_id))
    return entries


def plan_delete_group(state: OffsetsPartitionState, group_id: str) -> list[Entry]:
    """DeleteGroups: only an empty group (a classic group: one in state
    Empty), and only one that exists."""
    group = state.groups.get(group_id)
    if in_use(group):
        raise ServiceError(
            ErrorCode.NON_EMPTY_GROUP,
            f"group {group_id!r} has {len(group.members) if group else 0} member(s); only an "
            "empty group can be deleted",
        )
    if group is None and group_id not in state.known_groups():
        raise ServiceError(ErrorCode.GROUP_ID_NOT_FOUND,
                           f"group {group_id!r} does not exist")
    return removal_records(state, group_id)


def plan_retention(state: OffsetsPartitionState, *, now_ms: int, counts: Mapping[str, int],
                   retention_ms: int) -> tuple[list[Entry], list[tuple[str, int]]]:
    """Removes offsets of deleted topics (`counts`: partitions per topic) and
    expired empty groups (no member, no commit for retention_ms). Returns the
    records and, for the log, each expired group with how long it was idle."""
    entries: list[Entry] = []
    expired: list[tuple[str, int]] = []
    for group_id in sorted(state.known_groups()):
        group: AnyGroup | None = state.groups.get(group_id)
        committed = state.offsets.get(group_id, {})
        newest_ms = max((c.commit_ms for c in committed.values()), default=0)
        if not in_use(group) and now_ms - newest_ms > retention_ms:
            expired.append((group_id, now_ms - newest_ms))
            entries.extend(removal_records(state, group_id))
            continue
        entries.extend(
            encode_offset_tombstone(group_id, tp) for tp in sorted(committed)
            if not 0 <= tp[1] < counts.get(tp[0], 0)
        )
    return entries, expired


def heartbeat_interval_ms(session_timeout_ms: int, *, max_interval_ms: int) -> int:
    """The interval handed to a member: a third of its session, within
    [100 ms, max_interval_ms]."""
    return max(100, min(max_interval_ms, session_timeout_ms // 3))
