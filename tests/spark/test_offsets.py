"""Offset options and planning, no JVM: parsing, resolving, minPartitions, maxOffsetsPerTrigger."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tailrace.client.protocol import PartitionOffsets
from tailrace.spark_bridge.errors import DataLossError, OptionError
from tailrace.spark_bridge.offsets import OffsetRange, check_ranges, from_json, rate_limit, resolve, split_ranges, to_json
from tailrace.spark_bridge.options import EARLIEST, LATEST, parse_offset_spec, parse_read_options, parse_write_options

LOGS = {
    "events": [PartitionOffsets(0, 5, 100, 90), PartitionOffsets(1, 0, 40, 40), PartitionOffsets(2, 10, 10, 10)],
    "audit": [PartitionOffsets(0, 0, 7, 7)],
}


def test_offsets_option_takes_earliest_latest_or_kafka_json_map():
    topics = ("events", "audit")
    assert parse_offset_spec(None, "startingOffsets", "earliest", topics) == "earliest"
    assert parse_offset_spec(" LATEST ", "startingOffsets", "earliest", topics) == "latest"
    spec = parse_offset_spec('{"events": {"0": 23, "1": -2}, "audit": {"0": -1}}', "startingOffsets", "earliest", topics)
    assert spec == {"events": {0: 23, 1: EARLIEST}, "audit": {0: LATEST}}


@pytest.mark.parametrize("raw, words", [
    ("soonest", "earliest, latest or a JSON map"),
    ('["events"]', "must map topic"),
    ('{"other": {"0": 1}}', "does not list"),
    ('{"events": {"zero": 1}}', "partition must be an integer"),
    ('{"events": {"0": -3}}', "offset must be an integer >= -2"),
    ('{"events": {"0": 1.5}}', "offset must be an integer >= -2"),
    ('{"events": {"0": true}}', "offset must be an integer >= -2"),
])
def test_malformed_offsets_option_is_rejected_with_the_option_named(raw, words):
    with pytest.raises(OptionError, match="startingOffsets") as info:
        parse_offset_spec(raw, "startingOffsets", "earliest", ("events",))
    assert words in str(info.value)


def test_read_options_mirror_kafka_defaults_and_forbidden_combinations():
    batch = parse_read_options({"topic": "events, audit,events", "MINPARTITIONS": "4", "failOnDataLoss": "false"}, streaming=False)
    assert batch.topics == ("events", "audit")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.min_partitions == 4 and batch.fail_on_data_loss is False and batch.isolation == "durable"
    stream = parse_read_options({"topic": "events", "maxOffsetsPerTrigger": "1000"}, streaming=True)
    assert stream.starting == "latest" and stream.max_offsets_per_trigger == 1000
    with pytest.raises(OptionError, match="topic is required"):
        parse_read_options({}, streaming=False)
    with pytest.raises(OptionError, match="startingOffsets cannot be latest"):
        parse_read_options({"topic": "events", "startingOffsets": "latest"}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsets cannot be earliest"):
        parse_read_options({"topic": "events", "endingOffsets": '{"events": {"0": -2}}'}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsets is for batch"):
        parse_read_options({"topic": "events", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="minPartitions must be >= 1"):
        parse_read_options({"topic": "events", "minPartitions": "0"}, streaming=False)
    with pytest.raises(OptionError, match="isolation"):
        parse_read_options({"topic": "events", "isolation": "eventual"}, streaming=False)


def test_write_options_default_to_durable_acks_and_reject_unknown_levels():
    assert parse_write_options({"topic": "t"}).acks == "durable"
    assert parse_write_options({"acks": "NONE"}).acks == "none"
    assert parse_write_options({"acks": "all"}).acks == "all"  # every in-sync replica (memory on one replica)
    with pytest.raises(OptionError, match="acks must be one of"):
        parse_write_options({"acks": "most"})
    with pytest.raises(OptionError, match="one topic"):
        parse_write_options({"topic": "a,b"})


def test_resolve_maps_earliest_and_latest_per_isolation_and_fills_unlisted_partitions():
    spec = {"events": {0: 50, 1: LATEST}}
    got = resolve(spec, EARLIEST, LOGS, "durable", "startingOffsets")
    assert got == {("events", 0): 50, ("events", 1): 40, ("events", 2): 10, ("audit", 0): 0}
    assert resolve("latest", LATEST, LOGS, "durable", "x")[("events", 0)] == 90
    assert resolve("latest", LATEST, LOGS, "memory", "x")[("events", 0)] == 100
    with pytest.raises(OptionError, match="partitions=\\[7\\]"):
        resolve({"events": {7: 1}}, EARLIEST, LOGS, "durable", "startingOffsets")


def test_offsets_json_is_canonical_sorted_plain_ints_and_round_trips():
    positions = {("events", 10): 3, ("events", 2): 5, ("audit", 0): 7, ("events", 0): np.int64(1)}
    doc = to_json(positions)
    assert json.dumps(doc) == json.dumps(doc, sort_keys=True)
    assert json.dumps(doc) == '{"audit": {"0": 7}, "events": {"0": 1, "10": 3, "2": 5}}'
    assert all(type(v) is int for parts in doc.values() for v in parts.values())
    assert from_json(json.loads(json.dumps(doc))) == positions


def test_ranges_outside_the_log_are_data_loss_unless_told_to_read_what_is_left():
    ranges = [OffsetRange("events", 0, 0, 50), OffsetRange("events", 1, 10, 60)]
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        check_ranges(ranges, LOGS, "durable", fail_on_data_loss=True)
    got = check_ranges(ranges, LOGS, "durable", fail_on_data_loss=False)
    assert got == [OffsetRange("events", 0, 5, 50), OffsetRange("events", 1, 10, 40)]
    with pytest.raises(OptionError, match="starting offset is after the ending offset"):
        check_ranges([OffsetRange("events", 0, 60, 50)], LOGS, "durable", True)


def test_min_partitions_splits_ranges_in_proportion_to_size_into_adjacent_pieces():
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 100, 400), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None) == ranges
    assert split_ranges(ranges, 3) == ranges  # already as many ranges as asked
    pieces = split_ranges(ranges, 8)
    by_partition = {p: [r for r in pieces if r.partition == p] for p in range(3)}
    assert [len(by_partition[p]) for p in range(3)] == [6, 2, 1]
    for p, rs in by_partition.items():
        original = ranges[p]
        assert rs[0].start == original.start and rs[-1].end == original.end
        assert all(a.end == b.start for a, b in zip(rs, rs[1:])), "pieces must be adjacent"
        assert max(r.size for r in rs) - min(r.size for r in rs) <= 1
    assert split_ranges([OffsetRange("t", 0, 0, 3)], 10) == [OffsetRange("t", 0, i, i + 1) for i in range(3)]


def test_max_offsets_per_trigger_is_shared_in_proportion_to_backlog_and_sums_exactly():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50, ("t", 3): 7}
    latest = {("t", 0): 600, ("t", 1): 400, ("t", 2): 150, ("t", 3): 7}  # backlogs 600, 300, 100, 0
    end = rate_limit(start, latest, 100)
    taken = {k: end[k] - start[k] for k in start}
    assert taken == {("t", 0): 60, ("t", 1): 30, ("t", 2): 10, ("t", 3): 0}
    assert rate_limit(start, latest, 5000) == latest  # the limit covers the whole backlog
    for limit in (1, 3, 7, 999):
        end = rate_limit(start, latest, limit)
        assert sum(end[k] - start[k] for k in start) == limit
        assert all(start[k] <= end[k] <= latest[k] for k in start)
    # remainders go to the largest fractions: 2 rows over backlogs 1, 1, 1 -> the first two in order
    three = {("t", p): 0 for p in range(3)}
    assert rate_limit(three, {k: 1 for k in three}, 2) == {("t", 0): 1, ("t", 1): 1, ("t", 2): 0}


def test_time_options_take_precedence_in_kafkas_order_and_are_batch_only_at_the_end():
    o = parse_read_options({"topic": "events", "startingTimestamp": "1000", "startingOffsetsByTimestamp": '{"events": {"0": 5}}',
                            "startingOffsets": "latest"}, streaming=False)  # latest is not read: the time wins
    assert o.starting_time == 1000 and o.ending_time is None and o.by_time_strategy == "error"
    o = parse_read_options({"topic": "events", "endingOffsetsByTimestamp": '{"events": {"1": 7}}',
                            "startingOffsetsByTimestampStrategy": "LATEST"}, streaming=False)
    assert o.ending_time == {"events": {1: 7}} and o.starting_time is None and o.by_time_strategy == "latest"
    for name in ("endingTimestamp", "endingOffsetsByTimestamp"):
        with pytest.raises(OptionError, match=f"{name} is for batch"):
            parse_read_options({"topic": "events", name: "1"}, streaming=True)
    for bad, words in (({"startingTimestamp": "-1"}, "must be >= 0"), ({"startingOffsetsByTimestamp": '{"other": {}}'}, "does not list"),
                       ({"startingOffsetsByTimestamp": '{"events": {"0": -3}}'}, "ms since the epoch"),
                       ({"startingOffsetsByTimestampStrategy": "earliest"}, "one of")):
        with pytest.raises(OptionError, match=words):
            parse_read_options({"topic": "events", **bad}, streaming=False)


def test_resolve_times_asks_once_per_topic_and_time_and_applies_the_strategy():
    from tailrace.spark_bridge.offsets import resolve_times

    asked = []

    def lookup(topic, ts):  # the broker's LIST_OFFSETS by time, for these logs: a record at 60 from ts 100 on
        asked.append((topic, ts))
        return [PartitionOffsets(po.partition, po.log_start_offset, po.high_watermark, po.durable_watermark,
                                 time_offset=(-1 if ts > 500 or po.high_watermark == po.log_start_offset else
                                              min(po.high_watermark - 1, 60 if ts >= 100 else po.log_start_offset)))
                for po in LOGS[topic]]

    got = resolve_times(100, lookup, EARLIEST, LOGS, "durable", "startingTimestamp", "latest")
    assert got == {("events", 0): 60, ("events", 1): 39, ("events", 2): 10, ("audit", 0): 6}
    assert sorted(asked) == [("audit", 100), ("events", 100)]
    got = resolve_times({"events": {0: 100}}, lookup, LATEST, LOGS, "memory", "startingOffsetsByTimestamp", "error")
    assert got == {("events", 0): 60, ("events", 1): 40, ("events", 2): 10, ("audit", 0): 7}
    with pytest.raises(OptionError, match="startingOffsetsByTimestampStrategy=latest"):
        resolve_times(1000, lookup, EARLIEST, LOGS, "durable", "startingTimestamp", "error")
    assert resolve_times(1000, lookup, EARLIEST, LOGS, "durable", "startingTimestamp", "latest")[("events", 0)] == 90
    with pytest.raises(OptionError, match="partitions=\\[9\\]"):
        resolve_times({"events": {9: 1}}, lookup, EARLIEST, LOGS, "durable", "startingOffsetsByTimestamp", "error")
