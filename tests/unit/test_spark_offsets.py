"""The Spark source's offsets and options as pure values.

Goal: offsets JSON round-trips in Spark's Kafka-source shape and rejects
anything malformed with a message naming where; specs resolve -2/-1 and
must cover exactly the partitions read; ranges start new partitions at
their earliest offset and skip empty ones; the per-trigger limit never
exceeds its budget, never goes past the end, uses the whole budget when
there is enough backlog, and starves no partition; and the options parser
turns every mistake into an error that names the option.

Method: direct calls with hand-made offsets; the limit's properties are
checked over a seeded sweep of random backlogs, plus hand-computed cases.
"""

from __future__ import annotations

import json
import random

import pytest

from oncelog import TopicPartition
from oncelog_spark.offsets import (
    OffsetRange,
    OffsetsError,
    OffsetSpec,
    check_covers,
    from_json_dict,
    limit_end,
    parse_spec,
    plan_ranges,
    resolve,
    to_json_dict,
)
from oncelog_spark.options import OptionError, SourceOptions

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_json_round_trip_is_ordered_and_exact() -> None:
    offsets = {B0: 7, A1: 3, A0: 0}
    as_json = to_json_dict(offsets)
    assert json.dumps(as_json) == '{"a": {"0": 0, "1": 3}, "b": {"0": 7}}'
    assert from_json_dict(json.loads(json.dumps(as_json)), what="x") == offsets


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "expected a JSON object"),
        ({"a": [1]}, "must map partition numbers"),
        ({"a": {"x": 1}}, "must be a non-negative integer, got 'x'"),
        ({"a": {"-1": 1}}, "must be a non-negative integer"),
        ({"a": {"01": 1}}, "must be a non-negative integer"),
        ({"a": {"0": -1}}, "offset of a-0 must be an offset >= 0"),
        ({"a": {"0": True}}, "got True"),
        ({"a": {"0": 1.5}}, "got 1.5"),
        ({"": {"0": 1}}, "non-empty strings"),
    ],
)
def test_malformed_offsets_are_refused(value: object, message: str) -> None:
    with pytest.raises(OffsetsError, match=message):
        from_json_dict(value, what="checkpoint")


def test_specs_resolve_special_offsets() -> None:
    earliest, latest = {A0: 2, A1: 0}, {A0: 9, A1: 4}
    assert resolve(parse_spec("earliest", option="o"), [A0, A1],
                   earliest=earliest, latest=latest) == earliest
    assert resolve(parse_spec(" LATEST ", option="o"), [A0, A1],
                   earliest=earliest, latest=latest) == latest
    spec = parse_spec('{"a": {"0": -2, "1": -1}}', option="o")
    assert resolve(spec, [A0, A1], earliest=earliest, latest=latest) == {A0: 2, A1: 4}
    with pytest.raises(OffsetsError, match="option 'o' must be 'earliest', 'latest' or a JSON"):
        parse_spec("beginning", option="o")
    with pytest.raises(OffsetsError, match="-2 \\(earliest\\) or -1 \\(latest\\), got -3"):
        parse_spec('{"a": {"0": -3}}', option="o")


def test_per_partition_specs_must_cover_exactly_the_read_partitions() -> None:
    spec = OffsetSpec(per_partition={A0: 1, B0: 2})
    with pytest.raises(OffsetsError, match="missing a-1; not read by this query b-0"):
        check_covers(spec, [A0, A1], option="starting_offsets")
    check_covers(OffsetSpec(per_partition={A0: 1, A1: 1}), [A1, A0], option="x")
    check_covers(OffsetSpec(where="earliest"), [A0], option="x")


def test_ranges_start_new_partitions_at_earliest_and_skip_empty_ones() -> None:
    ranges = plan_ranges({A0: 5, A1: 3, B0: 1}, {A0: 9, A1: 3, TopicPartition("c", 0): 4},
                         earliest_of_new={TopicPartition("c", 0): 2})
    assert ranges == [OffsetRange("a", 0, 5, 9), OffsetRange("c", 0, 2, 4)]
    with pytest.raises(OffsetsError, match="end offset 2 of a-0 is below its start offset 5"):
        plan_ranges({A0: 5}, {A0: 2}, earliest_of_new={})


def test_limit_hand_computed_cases() -> None:
    start = {A0: 0, A1: 10, B0: 5}
    latest = {A0: 10, A1: 12, B0: 5}
    # Shares of 3 for the two partitions with a backlog; a-1 uses 2, its
    # spare offset goes to a-0.
    assert limit_end(start, latest, 6) == {A0: 4, A1: 12, B0: 5}
    # Budget below the number of backlogged partitions: the largest backlog first.
    assert limit_end(start, latest, 1) == {A0: 1, A1: 10, B0: 5}
    assert limit_end(start, latest, 1000) == latest
    with pytest.raises(ValueError, match="max_offsets must be >= 1"):
        limit_end(start, latest, 0)


def test_limit_properties_over_random_backlogs() -> None:
    rng = random.Random(7)
    for _ in range(500):
        tps = [TopicPartition("t", p) for p in range(rng.randint(1, 6))]
        start = {tp: rng.randint(0, 50) for tp in tps}
        latest = {tp: start[tp] + rng.choice([0, 0, 1, 2, 5, 30]) for tp in tps}
        budget = rng.randint(1, 40)
        end = limit_end(start, latest, budget)
        taken = {tp: end[tp] - start[tp] for tp in tps}
        backlog = {tp: latest[tp] - start[tp] for tp in tps}
        assert all(0 <= taken[tp] <= backlog[tp] for tp in tps)
        assert sum(taken.values()) == min(budget, sum(backlog.values()))
        # Max-min fair: a partition got less than another only if it had no
        # more backlog to give, give or take the one-offset remainders.
        for tp in tps:
            for other in tps:
                if taken[tp] + 1 < taken[other]:
                    assert taken[tp] == backlog[tp]


def test_limit_starves_no_partition() -> None:
    # A budget of one offset per trigger over three equal backlogs: the
    # partitions take turns instead of one being drained first.
    start = {TopicPartition("t", p): 0 for p in range(3)}
    latest = {tp: 4 for tp in start}
    order = []
    for _ in range(6):
        end = limit_end(start, latest, 1)
        (moved,) = [tp for tp in start if end[tp] != start[tp]]
        order.append(moved.partition)
        start = end
    assert order == [0, 1, 2, 0, 1, 2]


def parse(streaming: bool = True, **options: str) -> SourceOptions:
    return SourceOptions.parse({"bootstrap": "127.0.0.1:1", "topics": "a", **options},
                               streaming=streaming)


def test_option_defaults_follow_kafka_source() -> None:
    stream = parse()
    assert stream.starting_offsets.is_latest and stream.isolation_level == "read_committed"
    assert stream.max_records_per_trigger is None
    batch = parse(streaming=False)
    assert batch.starting_offsets.is_earliest and batch.ending_offsets.is_latest
    assert parse(topics=" a, b ,a").topics == ("a", "b")
    assert SourceOptions.parse({"BOOTSTRAP": "h:1", "Topics": "a"}, streaming=True).topics == ("a",)


@pytest.mark.parametrize(
    ("streaming", "options", "message"),
    [
        (True, {"bootstrap": ""}, "option 'bootstrap' is required"),
        (True, {"bootstrap": "nohost"}, "option 'bootstrap': bootstrap address 'nohost'"),
        (True, {"topics": "a,,b"}, "option 'topics' must be comma-separated"),
        (True, {"isolation_level": "serializable"}, "option 'isolation_level' must be one of"),
        # Kafka's names are accepted as aliases, and errors use the name given.
        (True, {"maxOffsetsPerTrigger": "0"},
         "option 'maxOffsetsPerTrigger' must be a positive integer, got '0'"),
        (True, {"kafka.bootstrap.servers": "h:1"},
         "options 'bootstrap' and 'kafka.bootstrap.servers' name the same setting"),
        (True, {"path": "x"}, "takes no path"),
        (True, {"ending_offsets": "latest"}, "applies to batch reads"),
        (True, {"max_records_per_trigger": "0"}, "must be a positive integer, got '0'"),
        (True, {"poll_timeout_ms": "soon"}, "must be a positive integer, got 'soon'"),
        (True, {"starting_offsets": '{"b": {"0": 1}}'}, "names topics that option 'topics'"),
        (False, {"starting_offsets": '{"a": {"0": -1}}'}, "cannot be 'latest'"),
        (False, {"ending_offsets": "earliest"}, "cannot be 'earliest'"),
        (False, {"max_records_per_trigger": "5"}, "applies to streaming reads only"),
    ],
)
def test_option_mistakes_name_the_option(
    streaming: bool, options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse(streaming=streaming, **options)
