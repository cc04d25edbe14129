"""Admin's consumer-group calls: list, describe, offsets, reset, delete."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from oncelog._admin_base import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    RESET_TARGETS,
    AdminBase,
    _answer_for,
    _within_budget,
)
from oncelog._client import (
    raise_for_error,
)
from oncelog._group import (
    NO_GENERATION,
    GroupClient,
    check_group_id,
    check_offsets,
    partition_names,
)
from oncelog.types import (
    GroupDescription,
    GroupListing,
    GroupOffset,
    MemberDescription,
    TopicPartition,
)
from oncelog.v1 import (
    group_coordinator_pb2,
    records_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import GROUP_STATES
from oncelog.wire.vocabulary import GroupState


class GroupsAdmin(AdminBase):
    """Lists, describes and deletes consumer groups; shows and resets their offsets."""

    # ------------------------------------------------------------ groups

    @_within_budget
    def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Every group every group coordinator (as Metadata lists them) knows,
        optionally only those in `states` (Empty, Reconciling,
        Stable, Dead; for classic groups, Kafka's protocol, also
        PreparingRebalance and CompletingRebalance); sorted by group id."""
        texts = GROUP_STATES.texts_of(states or ())
        request = group_coordinator_pb2.ListGroupsRequest(
            states=texts, states_enum=GROUP_STATES.numbers_of(texts))
        def list_at(address: str, timeout_s: float) -> group_coordinator_pb2.ListGroupsResponse:
            resp = self._rpc(address, self._client.group_coordinator(address).ListGroups,
                             request, time.monotonic() + timeout_s, service="group coordinator")
            raise_for_error(resp.error)
            return resp

        out: dict[str, GroupListing] = {}
        for resp in self._ask_each(self._group_coordinator_addresses(), "ListGroups", list_at):
            for g in resp.groups:
                out[g.group_id] = GroupListing(g.group_id, GroupState.reported(
                    GROUP_STATES.response_text(g.state_enum, g.state)))
        return [out[k] for k in sorted(out)]

    @_within_budget
    def describe_group(self, group_id: str) -> GroupDescription:
        """The group's state, epoch and members (each with its subscription
        and the partitions it owns), from its coordinator. For a classic
        group (Kafka's clients) the epoch is its generation, and a member's
        topics and partitions are decoded from its consumer-protocol bytes
        (empty for other protocols)."""
        group = GroupClient(self._client, check_group_id(group_id))
        request = group_coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id])

        def attempt(address: str, timeout_s: float) -> GroupDescription:
            resp = self._client.group_coordinator(address).DescribeGroups(
                request, timeout=timeout_s
            )
            d = _answer_for(resp.groups, lambda d: d.group_id, group_id, "DescribeGroups")
            return _group_description(d)

        return group.call("DescribeGroups", attempt, budget_ms=self._left_ms())

    @_within_budget
    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, GroupOffset]:
        """The group's committed offsets (of `partitions`, default: every
        partition it has one for), each with the partition's end for a
        read_committed reader (last stable offset) and the lag between them.
        A transactional offset still pending is not shown: the last stable
        one is. Partitions without a committed offset are left out."""
        group = GroupClient(self._client, check_group_id(group_id))
        wanted = None if partitions is None else list(partitions)
        committed = group.fetch(wanted, budget_ms=self._left_ms(),
                                require_stable=False)
        found = {tp: offset for tp, offset in committed.items() if offset >= 0}
        ends = self._end_offsets(found)
        out: dict[TopicPartition, GroupOffset] = {}
        for tp in sorted(found):
            end = ends.get(tp)
            out[tp] = GroupOffset(found[tp], end, None if end is None else end - found[tp])
        return out

    @_within_budget
    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Sets the group's committed offsets (each the next offset to read).
        Only while the group has no members: a running consumer would
        overwrite them (UnknownMemberIdError otherwise)."""
        group = GroupClient(self._client, check_group_id(group_id))
        checked = check_offsets(offsets)
        try:
            group.commit(checked, generation_id=NO_GENERATION, member_id="",
                         budget_ms=self._left_ms())
        except errors.OncelogError as exc:
            if exc.code is not ErrorCode.UNKNOWN_MEMBER_ID:
                raise
            raise errors.error_for(
                exc.code, f"group {group_id!r} has members, so its offsets cannot be changed "
                f"from outside; stop its consumers first ({exc.message or exc.code.name})",
            ) from exc

    @_within_budget
    def reset_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        to: str | None = None,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        dry_run: bool = False,
    ) -> dict[TopicPartition, int]:
        """Moves the group's committed offsets of `partitions` (default: every
        partition it has one for) to the earliest offset (`to="earliest"`),
        the end for a read_committed reader (`to="latest"`: the last stable
        offset), an `offset` (which must lie within every partition's log), or
        the first record at or after `timestamp_ms` (the end where there is
        none). Exactly one of the three. Only while the group has no members;
        with dry_run, computes the new offsets without committing them.
        Returns the new offsets."""
        check_group_id(group_id)
        given = [name for name, value in (("to", to), ("offset", offset),
                                          ("timestamp_ms", timestamp_ms)) if value is not None]
        if len(given) != 1:
            raise ValueError(
                "reset_group_offsets() takes exactly one of to='earliest'|'latest', offset=N, "
                f"timestamp_ms=T; got {', '.join(given) or 'none'}"
            )
        if to is not None and to not in RESET_TARGETS:
            raise ValueError(f"to must be 'earliest' or 'latest', got {to!r}")
        if offset is not None and (type(offset) is not int or offset < 0):
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if timestamp_ms is not None and (type(timestamp_ms) is not int or timestamp_ms < 0):
            raise ValueError(f"timestamp_ms must be an int >= 0, got {timestamp_ms!r}")
        if partitions is None:
            tps = sorted(self.list_group_offsets(group_id))
        else:
            tps = sorted(set(partitions))
            for tp in tps:
                if not isinstance(tp, TopicPartition):
                    raise TypeError(f"partitions must be TopicPartition values, got {tp!r}")
        if not tps:
            return {}
        if offset is not None:
            earliest = self._partition_offsets(tps, EARLIEST_TIMESTAMP,
                                               records_pb2.READ_COMMITTED)
            ends = self._end_offsets(tps, missing_ok=False)
            outside = [tp for tp in tps if not earliest[tp] <= offset <= ends[tp]]
            if outside:
                raise errors.error_for(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {offset} is outside " + "; ".join(
                        f"{tp.topic}-{tp.partition} (offsets {earliest[tp]}..{ends[tp]})"
                        for tp in outside
                    ),
                )
            target = dict.fromkeys(tps, offset)
        elif timestamp_ms is not None:
            found = self._partition_offsets(tps, timestamp_ms, records_pb2.READ_COMMITTED)
            ends = self._end_offsets([tp for tp in tps if found[tp] < 0], missing_ok=False)
            target = {tp: found[tp] if found[tp] >= 0 else ends[tp] for tp in tps}
        elif to == "earliest":
            target = self._partition_offsets(tps, EARLIEST_TIMESTAMP, records_pb2.READ_COMMITTED)
        else:
            target = self._end_offsets(tps, missing_ok=False)
        if not dry_run:
            self.alter_group_offsets(group_id, target)
        return target

    @_within_budget
    def delete_group(self, group_id: str) -> None:
        """Deletes an empty group and its committed offsets; raises
        NonEmptyGroupError while it has members, GroupIdNotFoundError for a
        group the coordinator does not know."""
        group = GroupClient(self._client, check_group_id(group_id))
        request = group_coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id])

        def attempt(address: str, timeout_s: float) -> None:
            resp = self._client.group_coordinator(address).DeleteGroups(
                request, timeout=timeout_s
            )
            _answer_for(resp.results, lambda r: r.group_id, group_id, "DeleteGroups")

        group.call("DeleteGroups", attempt, budget_ms=self._left_ms())

    def _end_offsets(self, partitions: Iterable[TopicPartition], *, missing_ok: bool = True
                     ) -> dict[TopicPartition, int]:
        """Each partition's end for a read_committed reader (its last stable
        offset). With missing_ok, partitions of topics that no longer exist are
        left out; without, they raise UnknownTopicOrPartitionError."""
        tps = list(partitions)
        if missing_ok:
            md = self._metadata()
            tps = [tp for tp in tps if tp.topic in md.topics
                   and tp.partition < md.topics[tp.topic].num_partitions]
        return self._partition_offsets(tps, LATEST_TIMESTAMP, records_pb2.READ_COMMITTED)

    def _partition_offsets(
        self,
        partitions: Iterable[TopicPartition],
        timestamp_ms: int,
        isolation: records_pb2.IsolationLevel.ValueType,
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        out: dict[TopicPartition, int] = {}
        for topic, ps in by_topic.items():
            info = self._topic(topic)
            missing = [p for p in ps if not 0 <= p < info.num_partitions]
            if missing:
                raise errors.error_for(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has {info.num_partitions} partitions; no "
                    + partition_names(TopicPartition(topic, p) for p in missing),
                )
            for p, offset in self._offsets(topic, sorted(ps), timestamp_ms, isolation).items():
                out[TopicPartition(topic, p)] = offset
        return out

    def _group_coordinator_addresses(self) -> tuple[str, ...]:
        md = self._metadata()
        if not md.group_coordinators:
            md = self._refreshed_metadata()
        if not md.group_coordinators:
            raise errors.error_for(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "the cluster has no group coordinator (Metadata lists none), so it has no groups",
            )
        return md.group_coordinators


def _group_description(d: group_coordinator_pb2.GroupDescription) -> GroupDescription:
    return GroupDescription(
        group_id=d.group_id,
        state=GroupState.reported(GROUP_STATES.response_text(d.state_enum, d.state)),
        group_epoch=d.group_epoch,
        members=tuple(
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id or None,
                member_epoch=m.member_epoch,
                subscribed_topics=tuple(m.subscribed_topics),
                assignment=tuple(sorted(
                    TopicPartition(tp.topic, tp.partition) for tp in m.assignment
                )),
            )
            for m in sorted(d.members, key=lambda m: m.member_id)
        ),
        coordinator_epoch=d.coordinator_epoch,
    )
