"""The leader-epoch cache and the follower's truncation rule follow Kafka
(LeaderEpochFileCache, KIP-101, KIP-279), and find exactly where two
replicas' logs diverge.

Method: tables of (cache, operation) -> result for assign, end_offset_for
(Kafka's documented examples among them), truncate_from_end/start, the stored
encoding and the `E` keys; a table of single divergence steps; scenarios of
leader changes (a deposed leader's tail, identical replicas, a follower that
never saw the leader's epochs, one that needs a second question); then a
seeded sweep over generated pairs of replica logs that obey log matching
(an epoch's records are the same wherever they are), where the offset the
exchange picks must be the first offset at which the two logs differ,
whether or not the follower cuts its log between questions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from services.common.kernel.invariants import InvariantViolation
from services.partition_store.core.codec import CorruptValueError, seal
from services.partition_store.core.leader_epochs import (
    EPOCH_ENTRY_VERSION,
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    AskAgain,
    EpochEntry,
    LeaderEpochCache,
    Truncate,
    decode_epoch_entry,
    divergence_offset,
    divergence_step,
    encode_epoch_entry,
)
from services.partition_store.storage import keys

TP = "t-0"
U = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def cache(*pairs: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache(TP, [EpochEntry(e, o) for e, o in pairs])


def pairs(c: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in c.entries]


def from_log(log: Sequence[int]) -> LeaderEpochCache:
    """The cache a replica builds while appending `log` (the leader epoch of
    each offset, one record per batch)."""
    c = LeaderEpochCache(TP)
    for offset, epoch in enumerate(log):
        c.assign(epoch, offset)
    return c


# ---------------------------------------------------------------------- assign


@pytest.mark.parametrize(
    ("before", "epoch", "offset", "changed", "after"),
    [
        ([], 0, 0, True, [(0, 0)]),
        ([], 3, 17, True, [(3, 17)]),
        ([(0, 0)], 0, 5, False, [(0, 0)]),          # the latest epoch: nothing to do
        ([(0, 0)], 0, 0, False, [(0, 0)]),
        ([(0, 0)], 1, 5, True, [(0, 0), (1, 5)]),
        ([(0, 0), (1, 5)], 4, 9, True, [(0, 0), (1, 5), (4, 9)]),   # epochs may skip
        # The latest epoch appended nothing at 5: the newer one replaces it.
        ([(0, 0), (1, 5)], 2, 5, True, [(0, 0), (2, 5)]),
    ],
)
def test_assign(before: list[tuple[int, int]], epoch: int, offset: int, changed: bool,
                after: list[tuple[int, int]]) -> None:
    c = cache(*before)
    assert c.assign(epoch, offset) is changed
    assert pairs(c) == after
    assert c.latest_epoch == after[-1][0]


@pytest.mark.parametrize(
    ("before", "epoch", "offset", "fragment"),
    [
        ([(0, 0), (2, 5)], 1, 9, "epoch 1 appended at 9 after epoch 2"),
        ([(0, 0), (2, 5)], 2, 4, "below where that epoch started"),
        ([(0, 0), (2, 5)], 3, 4, "below the start of epoch 2"),
        ([], -1, 0, "must be >= 0"),
        ([], 0, -1, "must be >= 0"),
    ],
)
def test_assign_refuses_what_no_leader_appends(
        before: list[tuple[int, int]], epoch: int, offset: int, fragment: str) -> None:
    c = cache(*before)
    with pytest.raises(InvariantViolation, match=fragment):
        c.assign(epoch, offset)
    assert pairs(c) == before


@pytest.mark.parametrize(
    "entries",
    [[(1, 5), (1, 9)], [(2, 5), (1, 9)], [(1, 5), (2, 5)], [(1, 9), (2, 5)], [(-1, 0)]],
)
def test_stored_entries_out_of_order_do_not_load(entries: list[tuple[int, int]]) -> None:
    with pytest.raises(InvariantViolation, match=TP):
        cache(*entries)


def test_empty_cache() -> None:
    c = LeaderEpochCache(TP)
    assert (c.latest_epoch, c.entries, len(c)) == (UNDEFINED_EPOCH, (), 0)
    assert c.start_offset_of(0) is None
    assert c.truncate_from_end(0) == [] and c.truncate_from_start(10) == []


def test_start_offset_of() -> None:
    c = cache((0, 0), (1, 10), (3, 20))
    assert [c.start_offset_of(e) for e in range(5)] == [0, 10, None, 20, None]


# -------------------------------------------------------------- end_offset_for

KAFKA = ((0, 0), (1, 10), (3, 20))


@pytest.mark.parametrize(
    ("entries", "requested", "log_end_offset", "answer"),
    [
        # Kafka's example: epochs [(0, 0), (1, 10), (3, 20)], log end 25.
        (KAFKA, 3, 25, (3, 25)),      # the latest epoch: the log end
        (KAFKA, 2, 25, (1, 20)),      # never an epoch here: the one below, ending at 3's start
        (KAFKA, 1, 25, (1, 20)),
        (KAFKA, 0, 25, (0, 10)),
        (KAFKA, 4, 25, U),            # newer than anything here
        (KAFKA, UNDEFINED_EPOCH, 25, U),
        ((((2, 5), (3, 20))), 1, 25, U),   # below the first entry (KIP-101's answer)
        ((), 0, 25, U),
        ((), UNDEFINED_EPOCH, 0, U),
        (((0, 0),), 0, 0, (0, 0)),
    ],
)
def test_end_offset_for(entries: tuple[tuple[int, int], ...], requested: int,
                        log_end_offset: int, answer: tuple[int, int]) -> None:
    assert cache(*entries).end_offset_for(requested, log_end_offset) == answer


# ------------------------------------------------------------------ truncation


@pytest.mark.parametrize(
    ("end_offset", "removed", "after"),
    [
        (25, [], list(KAFKA)),
        (21, [], list(KAFKA)),
        (20, [(3, 20)], [(0, 0), (1, 10)]),   # an entry starting at the cut goes
        (15, [(3, 20)], [(0, 0), (1, 10)]),
        (10, [(1, 10), (3, 20)], [(0, 0)]),
        (0, list(KAFKA), []),
    ],
)
def test_truncate_from_end(end_offset: int, removed: list[tuple[int, int]],
                           after: list[tuple[int, int]]) -> None:
    c = cache(*KAFKA)
    assert [(e.epoch, e.start_offset) for e in c.truncate_from_end(end_offset)] == removed
    assert pairs(c) == after


@pytest.mark.parametrize(
    ("start_offset", "changed", "after"),
    [
        (0, [], list(KAFKA)),
        (5, [(0, 0)], [(0, 5), (1, 10), (3, 20)]),       # the covering entry moves up
        (10, [(0, 0)], [(1, 10), (3, 20)]),              # epoch 0 lay wholly below
        (19, [(0, 0), (1, 10)], [(1, 19), (3, 20)]),
        (20, [(0, 0), (1, 10)], [(3, 20)]),
        (30, list(KAFKA), [(3, 30)]),                    # the latest epoch always stays
    ],
)
def test_truncate_from_start(start_offset: int, changed: list[tuple[int, int]],
                             after: list[tuple[int, int]]) -> None:
    c = cache(*KAFKA)
    assert [(e.epoch, e.start_offset) for e in c.truncate_from_start(start_offset)] == changed
    assert pairs(c) == after


def test_truncate_from_start_before_the_first_entry_changes_nothing() -> None:
    c = cache((2, 10), (3, 20))
    assert c.truncate_from_start(5) == []
    assert pairs(c) == [(2, 10), (3, 20)]


def test_a_leader_appends_after_its_log_was_cut() -> None:
    c = cache(*KAFKA)
    c.truncate_from_end(15)
    assert c.assign(4, 15) is True
    assert pairs(c) == [(0, 0), (1, 10), (4, 15)]


# ------------------------------------------------------------- stored values


def test_entry_encoding_round_trips() -> None:
    for entry in (EpochEntry(0, 0), EpochEntry(2**31 - 1, 2**63 - 1), EpochEntry(7, 12_345)):
        assert decode_epoch_entry(encode_epoch_entry(entry)) == entry


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda d: d[:-1] + bytes([d[-1] ^ 0x01]), "CRC32C"),
        (lambda d: bytes([EPOCH_ENTRY_VERSION + 1]) + d[1:], "version"),
        (lambda d: d[:3], "shorter than"),
        (lambda _d: seal(EPOCH_ENTRY_VERSION, b"\x00" * 4), "4-byte payload"),
        (lambda _d: seal(EPOCH_ENTRY_VERSION, (-1).to_bytes(4, "big", signed=True)
                         + (0).to_bytes(8, "big")), "expected both >= 0"),
    ],
)
def test_damaged_entries_are_refused(damage: Callable[[bytes], bytes], fragment: str) -> None:
    data = encode_epoch_entry(EpochEntry(3, 40))
    with pytest.raises(CorruptValueError, match=fragment):
        decode_epoch_entry(damage(data), what="leader-epoch entry t-0/3")


def test_epoch_keys_sort_by_epoch_and_belong_to_their_partition() -> None:
    tid, p = 9, 2
    epochs = [0, 1, 255, 256, 70_000, 2**31 - 1]
    made = [keys.leader_epoch_key(tid, p, e) for e in epochs]
    assert sorted(made) == made
    assert [keys.leader_epoch_key_epoch(k) for k in made] == epochs
    prefix = keys.partition_prefix(keys.LEADER_EPOCH, tid, p)
    assert all(prefix <= k < keys.next_prefix(prefix) for k in made)
    # Neither another partition's range nor another kind's holds them.
    other = keys.partition_prefix(keys.LEADER_EPOCH, tid, p + 1)
    assert not any(other <= k < keys.next_prefix(other) for k in made)
    assert keys.LEADER_EPOCH in keys.PARTITION_KINDS
    assert len(set(keys.PARTITION_KINDS)) == len(keys.PARTITION_KINDS)
    # Deleting the topic deletes them.
    assert all(any(start <= k < end for start, end in keys.topic_ranges(tid)) for k in made)
    assert not any(start <= k < end for start, end in keys.topic_ranges(tid + 1) for k in made)


# ------------------------------------------------------------------ divergence


@pytest.mark.parametrize(
    ("local", "leo", "hw", "asked", "answer", "step"),
    [
        # Rule 1: the leader has no answer: keep what is committed.
        (KAFKA, 25, 12, 3, U, Truncate(12)),
        # Rule 3, the common case: the leader has our latest epoch.
        (KAFKA, 25, 12, 3, (3, 30), Truncate(25)),    # the leader is ahead: nothing to cut
        (KAFKA, 25, 12, 3, (3, 22), Truncate(22)),    # our epoch-3 tail went further
        # Rule 3 with an older epoch both have: where it ended in either.
        (KAFKA, 25, 12, 3, (1, 18), Truncate(18)),
        (KAFKA, 25, 12, 3, (1, 24), Truncate(20)),
        # Rule 4: the leader's epoch 2 is unknown here: cut at our epoch 3
        # (which the leader never had) and ask about epoch 1.
        (KAFKA, 25, 12, 3, (2, 22), AskAgain(1, 20)),
        # Rule 2: nothing here at or below the leader's epoch.
        (((2, 10), (3, 20)), 25, 5, 3, (1, 30), Truncate(10)),
        (((2, 10), (3, 20)), 25, 5, 3, (1, 8), Truncate(8)),
    ],
)
def test_divergence_step(local: tuple[tuple[int, int], ...], leo: int, hw: int, asked: int,
                         answer: tuple[int, int], step: Truncate | AskAgain) -> None:
    c = cache(*local)
    before = pairs(c)
    got = divergence_step(asked_epoch=asked, leader_epoch=answer[0], leader_end_offset=answer[1],
                          local=c, local_log_end_offset=leo, high_watermark=hw)
    assert got == step
    assert pairs(c) == before   # a step reads the cache, never changes it


def test_divergence_step_refuses_an_answer_newer_than_the_question() -> None:
    with pytest.raises(InvariantViolation, match="answered epoch 4"):
        divergence_step(asked_epoch=3, leader_epoch=4, leader_end_offset=30,
                        local=cache(*KAFKA), local_log_end_offset=25, high_watermark=0)


def _exchange(leader_log: Sequence[int], follower_log: Sequence[int], *,
              high_watermark: int = 0) -> tuple[int, list[int]]:
    """Where the follower cuts, and the epochs it asked about."""
    leader = from_log(leader_log)
    asked: list[int] = []

    def answer(epoch: int) -> tuple[int, int]:
        asked.append(epoch)
        return leader.end_offset_for(epoch, len(leader_log))

    offset = divergence_offset(leader_end_offset_for=answer, local=from_log(follower_log),
                               local_log_end_offset=len(follower_log),
                               high_watermark=high_watermark)
    return offset, asked


def test_a_deposed_leaders_tail_is_cut_where_the_new_leader_took_over() -> None:
    # Epoch 1's leader wrote 5..11; only 5..7 reached the replica that became
    # leader at epoch 2 and went on from offset 8.
    leader = [0] * 5 + [1] * 3 + [2] * 6
    deposed = [0] * 5 + [1] * 7
    assert _exchange(leader, deposed, high_watermark=8) == (8, [1])


def test_a_follower_identical_to_the_leader_cuts_nothing() -> None:
    log = [0] * 4 + [1] * 3 + [3] * 5
    assert _exchange(log, log, high_watermark=5) == (len(log), [3])


def test_a_follower_that_missed_the_leaders_epochs_keeps_what_it_has() -> None:
    # It fell behind during epoch 0; epochs 2 and 4 came and went without it.
    leader = [0] * 5 + [2] * 4 + [4] * 3
    follower = [0] * 5
    assert _exchange(leader, follower, high_watermark=5) == (5, [0])
    behind = [0] * 3
    assert _exchange(leader, behind, high_watermark=3) == (3, [0])


def test_a_follower_whose_epochs_the_leader_never_had_falls_back() -> None:
    # The follower led epoch 1 and wrote 0..5, none of it committed; the
    # leader at epoch 2 started from an empty log. Asked about epoch 1, below
    # everything it has, the leader has no answer: the high watermark.
    assert _exchange([2] * 4, [1] * 6, high_watermark=0) == (0, [1])


def test_a_second_question_when_the_leader_answers_with_an_epoch_unknown_here() -> None:
    # The follower has epochs 0 and 2; the leader 0, 1 and 3. Asked about 2,
    # the leader answers epoch 1 (ending at 7), which the follower never had:
    # it asks about 0, which ended at 4 on the leader.
    leader = [0] * 4 + [1] * 3 + [3] * 3
    follower = [0] * 6 + [2] * 3
    assert _exchange(leader, follower) == (4, [2, 0])


def test_no_local_epoch_below_the_leaders_answer_cuts_all_the_leader_never_had() -> None:
    # The follower led epoch 3 from an empty log; the leader holds epoch 1's
    # records at 0..1 and then epoch 5. Asked about 3, it answers (1, 2).
    # Kafka would cut at min(2, 2) and keep the follower's epoch-3 records
    # at 0..1, which differ from the leader's; the follower cuts at 0.
    assert _exchange([1, 1, 5], [3, 3]) == (0, [3])


def test_a_follower_without_epochs_keeps_its_high_watermark() -> None:
    offset = divergence_offset(leader_end_offset_for=lambda _e: pytest.fail("asked"),
                               local=LeaderEpochCache(TP), local_log_end_offset=9,
                               high_watermark=4)
    assert offset == 4


def _replica_logs(rng: random.Random) -> tuple[list[int], list[int]]:
    """Two replica logs (the epoch of each offset) that obey log matching: a
    common prefix, then at most one side goes on in the prefix's last epoch,
    then each side has epochs of its own (every epoch on one side only), and
    the leader holds the newest epoch."""
    common: list[int] = []
    epoch = -1
    for _ in range(rng.randint(0, 3)):
        epoch += rng.randint(1, 2)
        common += [epoch] * rng.randint(1, 4)
    leader, follower = list(common), list(common)
    if common and rng.random() < 0.6:
        rng.choice((leader, follower)).extend([common[-1]] * rng.randint(1, 3))
    pool = list(range(epoch + 1, epoch + 1 + rng.randint(0, 6)))
    mine = set(rng.sample(pool, rng.randint(0, len(pool))))
    for e in pool:
        (follower if e in mine else leader).extend([e] * rng.randint(1, 3))
    leader.extend([max(pool, default=epoch) + 1] * rng.randint(1, 3))
    return leader, follower


def _exchange_cutting_as_it_goes(leader_log: Sequence[int], follower_log: Sequence[int], *,
                                 high_watermark: int) -> int:
    """The exchange as Kafka's fetcher runs it: the follower cuts its log
    (and cache) at every AskAgain's truncate_to before asking again."""
    leader = from_log(leader_log)
    local, log_end = from_log(follower_log), len(follower_log)
    asked = local.latest_epoch
    while True:
        answer = leader.end_offset_for(asked, len(leader_log))
        step = divergence_step(asked_epoch=asked, leader_epoch=answer[0],
                               leader_end_offset=answer[1], local=local,
                               local_log_end_offset=log_end, high_watermark=high_watermark)
        if isinstance(step, Truncate):
            return step.offset
        log_end = step.truncate_to
        local.truncate_from_end(log_end)
        assert local.latest_epoch == step.epoch
        asked = step.epoch


@pytest.mark.parametrize("seed", range(20))
def test_the_exchange_finds_the_first_offset_where_replicas_differ(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        leader, follower = _replica_logs(rng)
        first_difference = next(
            (i for i, (a, b) in enumerate(zip(leader, follower, strict=False)) if a != b),
            min(len(leader), len(follower)),
        )
        # The follower's high watermark: never past what both hold.
        hw = rng.randint(0, first_difference)
        offset, asked = _exchange(leader, follower, high_watermark=hw)
        assert offset == first_difference, (seed, leader, follower, hw, asked)
        assert asked == sorted(asked, reverse=True) and len(set(asked)) == len(asked)
        if follower:
            assert _exchange_cutting_as_it_goes(leader, follower, high_watermark=hw) == offset
