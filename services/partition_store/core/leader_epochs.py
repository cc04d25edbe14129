"""The leader-epoch cache of one partition replica, and the follower's
truncation rule (Kafka's LeaderEpochFileCache, KIP-101 and KIP-279).

Every batch carries the epoch of the leader that appended it (records.py:
partition_leader_epoch). The cache maps each epoch to the offset of its first
batch in this replica's log:

    [(0, 0), (1, 10), (3, 20)]   epoch 0 wrote [0, 10), epoch 1 [10, 20),
                                 epoch 3 [20, log end); epoch 2 wrote nothing

Entries are strictly increasing in both epoch and start offset. A leader
only ever appends at its own epoch, which only grows, so `assign` takes a new
entry only at the end and a lower epoch is a broken invariant.

**Why.** With a high watermark alone, a follower that restarts truncates to
its HW and may throw away, or keep, the wrong records (KIP-101's two
scenarios). With epochs, a follower asks the leader where its own latest
epoch ended in the leader's log (OffsetsForLeaderEpoch, answered by
`end_offset_for`) and cuts its log exactly where the two diverged
(`divergence_step`).

**The follower's exchange (KIP-279).** The follower asks about its latest
epoch E. The leader answers (E', end): E' is the largest epoch <= E it has,
`end` where E' ended in its log. Then `divergence_step`:

1. The leader knows nothing at or below E (UNDEFINED): truncate to the
   high watermark, the only offset known to be committed (Kafka's fallback).
2. The follower has no epoch <= E' at all: every epoch it holds up to E is
   one the leader never had (the leader has none in (E', E]), so none of
   it can be committed: truncate to min(start of its first epoch, end, log
   end). (Kafka truncates to min(end, log end) here, which keeps a tail
   the leader never had when the follower's first epoch started below
   `end`; see the tests.)
3. The follower's own largest epoch <= E' is E' itself: both logs agree up
   to where E' ended in either; truncate to min(that end here, end, log end).
   (E' == E, the common case: min(end, log end).)
4. Otherwise the follower's largest epoch <= E' is an older F, and its
   epochs after F (up to E) are ones the leader never had. Everything from
   where F ends here on goes (`AskAgain.truncate_to`); ask again, about F,
   and decide on that answer. F < E, so the exchange ends after at most one
   round per local epoch.

A new leader should record its epoch at its log end when it takes over,
before any batch (Kafka's Partition.makeLeader does): otherwise, until it
appends, a follower asking about an epoch newer than the leader's latest
entry gets UNDEFINED and falls back to its high watermark (rule 1), which is
safe but cuts more than needed. `assign` at an offset where the latest epoch
appended nothing replaces that entry, as Kafka's does.

`divergence_offset` runs the whole exchange against a pure answering
function (a leader's `end_offset_for`); the replica runtime runs the same
steps over the network.

**Persistence.** The cache lives in memory; its entries are stored one per
key (`storage/keys.py`, `E`, keyed by epoch), each value sealed by
`encode_epoch_entry`, and a restart loads them back through the
constructor. The cache changes only through `assign` (True when it did;
it may have replaced the latest entry), `truncate_from_end` and
`truncate_from_start` (the entries they removed or moved). The simplest
correct write after any change: delete the partition's `E` range and put
every entry of `entries`, in the same WriteBatch as the log change that
caused it (there is one entry per leader change, and Kafka rewrites its
checkpoint file whole the same way). Compaction leaves the cache alone.

**Two differences from Kafka's current code.** (a) Asked about an epoch
below its first entry (retention removed it, or this log never had it), the
leader answers UNDEFINED, KIP-101's rule and what Kafka's javadoc still
says, so the follower falls back to its high watermark; Kafka since 2.0
answers (asked epoch, start of its first entry). Both are safe (nothing
above a follower's high watermark is committed), this one may cut more.
(b) Rule 2 above, which cuts where Kafka would keep records the leader
never had.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...common.kernel.invariants import InvariantViolation, invariant
from .codec import CorruptValueError, seal, unseal

# What OffsetsForLeaderEpoch answers when it has no answer.
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

EPOCH_ENTRY_VERSION = 1
_EPOCH_ENTRY = struct.Struct(">iq")  # epoch, start_offset


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """The leader epoch `epoch` wrote its first batch at `start_offset`."""

    epoch: int
    start_offset: int


def encode_epoch_entry(entry: EpochEntry) -> bytes:
    """The value of an `E` key (the key holds the epoch too)."""
    return seal(EPOCH_ENTRY_VERSION, _EPOCH_ENTRY.pack(entry.epoch, entry.start_offset))


def decode_epoch_entry(data: bytes, *, what: str = "leader-epoch entry") -> EpochEntry:
    payload = unseal(data, version=EPOCH_ENTRY_VERSION, what=what)
    if len(payload) != _EPOCH_ENTRY.size:
        raise CorruptValueError(
            f"{what}: {len(payload)}-byte payload, expected {_EPOCH_ENTRY.size}"
        )
    epoch, start_offset = _EPOCH_ENTRY.unpack(payload)
    if epoch < 0 or start_offset < 0:
        raise CorruptValueError(
            f"{what}: epoch {epoch} at start offset {start_offset}, expected both >= 0"
        )
    return EpochEntry(int(epoch), int(start_offset))


class LeaderEpochCache:
    """epoch -> start offset of one replica's log, oldest first."""

    __slots__ = ("_entries", "_epochs", "topic_partition")

    def __init__(self, topic_partition: str, entries: Iterable[EpochEntry] = ()) -> None:
        self.topic_partition = topic_partition
        self._entries: list[EpochEntry] = []
        # The epochs of _entries, for bisect.
        self._epochs: list[int] = []
        for entry in entries:
            self._load(entry)

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The epoch of the newest entry; UNDEFINED_EPOCH (-1) when empty."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int | None:
        """Where `epoch` started in this log; None if it has no entry."""
        i = bisect.bisect_left(self._epochs, epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return self._entries[i].start_offset
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        pairs = ", ".join(f"({e.epoch}, {e.start_offset})" for e in self._entries)
        return f"LeaderEpochCache({self.topic_partition!r}, [{pairs}])"

    # ------------------------------------------------------------------ changes

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Records that a batch of leader epoch `epoch` was appended at
        `start_offset`. Returns whether the cache changed:

        * `epoch` is the latest: nothing to record (False).
        * `epoch` is newer and `start_offset` >= the latest start: a new
          entry (True). If the latest entry starts at that same offset (its
          epoch appended nothing that stayed), it goes, as in Kafka.
        * `epoch` is older than the latest, or `start_offset` below the
          latest start: a broken invariant. A leader never appends an older
          epoch, and the log only moves back through truncate_from_end.

        Batches without an epoch (NO_PARTITION_LEADER_EPOCH, -1) must not
        come here: the caller skips them.
        """
        self._check_valid(epoch, start_offset)
        if not self._entries:
            self._append(EpochEntry(epoch, start_offset))
            return True
        latest = self._entries[-1]
        invariant(
            epoch >= latest.epoch,
            lambda: f"{self.topic_partition}: a batch of leader epoch {epoch} appended at "
            f"{start_offset} after epoch {latest.epoch} (started at {latest.start_offset})",
        )
        if epoch == latest.epoch:
            invariant(
                start_offset >= latest.start_offset,
                lambda: f"{self.topic_partition}: a batch of leader epoch {epoch} appended at "
                f"{start_offset}, below where that epoch started ({latest.start_offset})",
            )
            return False
        invariant(
            start_offset >= latest.start_offset,
            lambda: f"{self.topic_partition}: leader epoch {epoch} starting at {start_offset}, "
            f"below the start of epoch {latest.epoch} ({latest.start_offset})",
        )
        if start_offset == latest.start_offset:
            self._entries.pop()
            self._epochs.pop()
        self._append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from_end(self, end_offset: int) -> list[EpochEntry]:
        """After the log was cut at `end_offset` (every offset >= it gone):
        drops the entries that start at or after it. Returns them."""
        i = len(self._entries)
        while i > 0 and self._entries[i - 1].start_offset >= end_offset:
            i -= 1
        removed = self._entries[i:]
        del self._entries[i:]
        del self._epochs[i:]
        return removed

    def truncate_from_start(self, start_offset: int) -> list[EpochEntry]:
        """After retention moved the log start to `start_offset`: drops the
        entries wholly below it, and the one covering it starts there now.
        Returns the entries dropped or moved, as they were."""
        # The entry covering start_offset: the last one starting at or before it.
        i = bisect.bisect_right(self._entries, start_offset, key=_start_offset) - 1
        if i < 0:
            return []
        covering = self._entries[i]
        if covering.start_offset == start_offset:
            changed = self._entries[:i]
            del self._entries[:i]
            del self._epochs[:i]
            return changed
        changed = self._entries[: i + 1]
        self._entries[i] = EpochEntry(covering.epoch, start_offset)
        del self._entries[:i]
        del self._epochs[:i]
        return changed

    # ------------------------------------------------------------------ reads

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer, (epoch, end offset):

        * the latest epoch: (it, log_end_offset);
        * an older epoch: (the largest epoch <= it, start offset of the first
          epoch above it), i.e. where that epoch's part of the log ends;
        * UNDEFINED_EPOCH, an epoch below the first entry (retention removed
          it, or this log never had it), an epoch above the latest, or an
          empty cache: (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        # The first entry whose epoch is above the requested one.
        above = bisect.bisect_right(self._epochs, requested_epoch)
        if above == 0 or above == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        return self._epochs[above - 1], self._entries[above].start_offset

    # ------------------------------------------------------------------ internals

    def _check_valid(self, epoch: int, start_offset: int) -> None:
        invariant(
            epoch >= 0 and start_offset >= 0,
            lambda: f"{self.topic_partition}: leader-epoch entry ({epoch}, {start_offset}): "
            "epoch and start offset must be >= 0",
        )

    def _load(self, entry: EpochEntry) -> None:
        """One stored entry, in epoch order: they must already be in order."""
        self._check_valid(entry.epoch, entry.start_offset)
        if self._entries:
            last = self._entries[-1]
            invariant(
                entry.epoch > last.epoch and entry.start_offset > last.start_offset,
                lambda: f"{self.topic_partition}: leader-epoch entry {entry} after {last}: "
                "entries must increase in both epoch and start offset",
            )
        self._append(entry)

    def _append(self, entry: EpochEntry) -> None:
        self._entries.append(entry)
        self._epochs.append(entry.epoch)


def _start_offset(entry: EpochEntry) -> int:
    return entry.start_offset


# ---------------------------------------------------------------------- follower


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut the log at `offset` (drop every offset >= it; nothing to drop when
    it is the log end) and start fetching there. The exchange is over."""

    offset: int


@dataclass(frozen=True, slots=True)
class AskAgain:
    """The follower has epochs the leader never had: ask the leader about
    `epoch` (an older local epoch) and decide on that answer. Everything from
    `truncate_to` on is already known to go (Kafka cuts there before asking
    again; waiting until the exchange ends is as safe, as the final offset
    is never above it)."""

    epoch: int
    truncate_to: int


def divergence_step(
    *,
    asked_epoch: int,
    leader_epoch: int,
    leader_end_offset: int,
    local: LeaderEpochCache,
    local_log_end_offset: int,
    high_watermark: int,
) -> Truncate | AskAgain:
    """One step of the follower's exchange (the module docstring, rules 1-4):
    the leader answered (leader_epoch, leader_end_offset) when asked about
    `asked_epoch`. `local` and `local_log_end_offset` are the follower's,
    either as they were when the exchange began or cut at the `truncate_to`
    of every AskAgain so far (cache and log alike): the steps come out the
    same."""
    if leader_epoch == UNDEFINED_EPOCH or leader_end_offset == UNDEFINED_OFFSET:
        return Truncate(min(high_watermark, local_log_end_offset))
    invariant(
        leader_epoch <= asked_epoch,
        lambda: f"{local.topic_partition}: asked about leader epoch {asked_epoch}, the "
        f"leader answered epoch {leader_epoch}, which is newer",
    )
    local_epoch, local_end = local.end_offset_for(leader_epoch, local_log_end_offset)
    if local_end == UNDEFINED_OFFSET:
        # No local epoch at or below the leader's: every local epoch up to
        # the asked one is one the leader never had.
        first_start = local.entries[0].start_offset if len(local) else local_log_end_offset
        return Truncate(min(first_start, leader_end_offset, local_log_end_offset))
    if local_epoch == leader_epoch:
        return Truncate(min(local_end, leader_end_offset, local_log_end_offset))
    # local_epoch < leader_epoch <= asked_epoch: the exchange moves down.
    return AskAgain(local_epoch, min(local_end, local_log_end_offset))


def divergence_offset(
    *,
    leader_end_offset_for: Callable[[int], tuple[int, int]],
    local: LeaderEpochCache,
    local_log_end_offset: int,
    high_watermark: int,
) -> int:
    """Where the follower's log must be cut: the whole exchange, asking
    `leader_end_offset_for(epoch)` (the leader's answer: its cache's
    end_offset_for at its log end) until a step says Truncate. With no epoch
    of its own the follower has nothing to ask and keeps only what is
    committed (its high watermark). At most len(local) + 1 questions."""
    asked = local.latest_epoch
    if asked == UNDEFINED_EPOCH:
        return min(high_watermark, local_log_end_offset)
    for _ in range(len(local) + 1):
        leader_epoch, leader_end = leader_end_offset_for(asked)
        step = divergence_step(
            asked_epoch=asked, leader_epoch=leader_epoch, leader_end_offset=leader_end,
            local=local, local_log_end_offset=local_log_end_offset,
            high_watermark=high_watermark,
        )
        if isinstance(step, Truncate):
            return step.offset
        # step.epoch is a local epoch below `asked`: each round asks about an
        # older one, so the loop ends before it runs out.
        asked = step.epoch
    raise InvariantViolation(
        f"{local.topic_partition}: the divergence exchange asked more than "
        f"{len(local) + 1} questions"
    )
