"""Micro-batch cost and admission control, no JVM: coalescing small ranges into few tasks,
minOffsetsPerTrigger / maxTriggerDelay / maxOffsetsPerTrigger, lag from the progress, and the
stream reader's per-trigger calls against a real broker."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tailrace import Admin, Producer
from tailrace.spark_bridge.errors import OptionError
from tailrace.spark_bridge.offsets import (
    OffsetRange, admit, behind_latest, coalesce_ranges, from_json, progress_metrics,
)
from tailrace.spark_bridge.options import MIN_RECORDS_PER_PARTITION, parse_read_options
from tailrace.spark_bridge.source import RangePartition, TailraceStreamReader, read_partition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows


def test_small_ranges_share_a_task_and_big_ones_keep_their_own():
    small = [OffsetRange("t", p, 100, 100 + 12_500) for p in range(8)]
    assert coalesce_ranges(small, 100_000) == [small], "a 100,000-record batch over 8 partitions is one task"
    two = coalesce_ranges(small, 50_000)
    assert [len(g) for g in two] == [4, 4] and sorted(r for g in two for r in g) == sorted(small)
    assert all(g == sorted(g) for g in two), "a group keeps the input's order"
    assert coalesce_ranges(small, 0) == [[r] for r in small] == coalesce_ranges(small, 1)
    big = [OffsetRange("t", p, 0, 1_000_000) for p in range(8)]
    assert coalesce_ranges(big, 100_000) == [[r] for r in big], "a batch read of big ranges keeps one task per range"
    assert coalesce_ranges(small, 100_000, min_groups=3) != [small] and len(coalesce_ranges(small, 100_000, 3)) == 3
    skewed = [OffsetRange("t", 0, 0, 90_000)] + [OffsetRange("t", p, 0, 10_000) for p in range(1, 10)]
    sizes = sorted(sum(r.size for r in g) for g in coalesce_ranges(skewed, 90_000))
    assert sizes == [90_000, 90_000], "largest first into the lightest group"
    assert coalesce_ranges([], 100_000) == []


def test_min_offsets_per_trigger_waits_until_enough_records_or_the_delay_passes():
    begin = {("t", 0): 0, ("t", 1): 10}
    avail = {("t", 0): 30, ("t", 1): 40}  # 60 new records
    assert admit(begin, avail, None, 100, 500.0, 1000) is None, "too few, delay not reached: wait"
    assert admit(begin, avail, None, 100, 1000.0, 1000) == avail, "delay reached: read what there is"
    assert admit(begin, avail, None, 100, None, 1000) == avail, "the first trigger never waits (Kafka)"
    assert admit(begin, avail, None, 60, 0.0, 1000) == avail
    capped = admit(begin, avail, 20, 50, 0.0, 1000)
    assert sum(capped[k] - begin[k] for k in begin) == 20, "the minimum is judged before the cap, then the cap holds"
    assert admit(begin, avail, None, None, 0.0, 1000) == avail


def test_trigger_options_parse_with_kafkas_names_and_are_refused_where_meaningless():
    o = parse_read_options({"topic": "t", "minOffsetsPerTrigger": "500", "maxTriggerDelay": "30s",
                            "maxOffsetsPerTrigger": "1000"}, streaming=True)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms, o.max_offsets_per_trigger) == (500, 30_000, 1000)
    assert parse_read_options({"topic": "t"}, streaming=True).max_trigger_delay_ms == 15 * 60_000  # Kafka's 15m
    assert parse_read_options({"topic": "t", "maxTriggerDelay": "250"}, streaming=True).max_trigger_delay_ms == 250
    assert parse_read_options({"topic": "t"}, streaming=False).min_records_per_partition == MIN_RECORDS_PER_PARTITION
    with pytest.raises(OptionError, match="maxTriggerDelay must be a duration"):
        parse_read_options({"topic": "t", "maxTriggerDelay": "soon"}, streaming=True)
    with pytest.raises(OptionError, match="must not exceed maxOffsetsPerTrigger"):
        parse_read_options({"topic": "t", "minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "4"}, streaming=True)
    with pytest.raises(OptionError, match="are for streams"):
        parse_read_options({"topic": "t", "minOffsetsPerTrigger": "5"}, streaming=False)


def test_lag_is_kafkas_offsets_behind_latest_from_the_progress():
    assert behind_latest({("t", 0): 10, ("t", 1): 40}, {("t", 0): 30, ("t", 1): 40}) == {
        "minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "20", "avgOffsetsBehindLatest": "10.0"}
    src = {"endOffset": json.dumps({"t": {"0": 10, "1": 40}}), "latestOffset": {"t": {"0": 30, "1": 40}}}
    assert progress_metrics(src)["maxOffsetsBehindLatest"] == "20"
    assert progress_metrics({"endOffset": "17", "latestOffset": None}) == {}  # not ours: nothing


def _fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    with Producer(bootstrap, acks="durable") as prod:
        for p in range(partitions):
            values = np.full(per_partition * 10, p, dtype=np.uint8)
            prod.send_buffers(topic, values, np.arange(per_partition + 1, dtype=np.int32) * 10, partition=p)
        prod.flush()


class CountingAdmin:
    """The reader's Admin with its describe_topic calls counted (the real one underneath)."""

    def __init__(self, admin):
        self.admin, self.describes = admin, 0

    def describe_topic(self, topic):
        self.describes += 1
        return self.admin.describe_topic(topic)

    def __getattr__(self, name):
        return getattr(self.admin, name)


def test_a_trigger_describes_each_topic_once_and_places_partitions_once_per_query(spark_broker, topic_name, monkeypatch):
    import tailrace.spark_bridge.source as source

    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 4)
    _fill(spark_broker.bootstrap, topic_name, 4, 1000)
    placed = []
    real_place = source.place
    monkeypatch.setattr(source, "place", lambda conn, topic, parts, *a: (placed.append(list(parts)), real_place(conn, topic, parts, *a)))
    r = TailraceStreamReader(parse_read_options({"bootstrap": spark_broker.bootstrap, "topic": topic_name,
                                                 "startingOffsets": "earliest"}, streaming=True))
    start = r.initialOffset()
    r._admin = counting = CountingAdmin(r._admin)
    for _ in range(3):
        end = r.latestOffset(start, ReadAllAvailable())
        parts = r.partitions(start, end)
        _fill(spark_broker.bootstrap, topic_name, 4, 10)
        start = end
    assert counting.describes == 3, "one describe per trigger: partitions() reuses latestOffset's"
    assert placed == [[0, 1, 2, 3]], "partitions are placed on their workers once per query"
    assert len(parts) == 1 and len(parts[0].ranges) == 4, "a small batch is one task reading every partition"
    assert from_json(r.reportLatestOffset()) == {(topic_name, p): 1020 for p in range(4)}, "as of the last trigger"
    r.stop()


def test_a_coalesced_task_reads_exactly_each_of_its_ranges(spark_broker, topic_name):
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 3)
        endpoints = {pi.partition: pi.endpoint for pi in a.describe_topic(topic_name).partitions}
    _fill(spark_broker.bootstrap, topic_name, 3, 2000)
    o = parse_read_options({"bootstrap": spark_broker.bootstrap, "topic": topic_name}, streaming=False)
    ranges = [OffsetRange(topic_name, 0, 5, 1500), OffsetRange(topic_name, 2, 0, 2000), OffsetRange(topic_name, 1, 1999, 2000)]
    batches = list(read_partition(o, RangePartition(ranges, [endpoints[r.partition] for r in ranges])))
    got = [(b.column("partition")[0].as_py(), b.column("offset").to_numpy()) for b in batches]
    for r in ranges:
        offsets = np.concatenate([o for p, o in got if p == r.partition])
        assert offsets.tolist() == list(range(r.start, r.end))


def test_the_reader_waits_for_min_offsets_per_trigger_until_max_trigger_delay(spark_broker, topic_name):
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 2)
    o = parse_read_options({"bootstrap": spark_broker.bootstrap, "topic": topic_name, "startingOffsets": "earliest",
                            "minOffsetsPerTrigger": "100", "maxTriggerDelay": "1s"}, streaming=True)
    r = TailraceStreamReader(o)
    assert r.getDefaultReadLimit() == ReadMinRows(100)
    start = r.initialOffset()
    _fill(spark_broker.bootstrap, topic_name, 2, 10)
    first = r.latestOffset(start, ReadMinRows(100))
    assert first != start, "the first trigger does not wait"
    _fill(spark_broker.bootstrap, topic_name, 2, 10)
    assert r.latestOffset(first, ReadMinRows(100)) == first, "20 new records < 100: wait"
    assert r.latestOffset(first, ReadAllAvailable()) != first, "the engine's ReadAllAvailable reads everything"
    time.sleep(1.1)
    assert from_json(r.latestOffset(first, ReadMinRows(100))) == {(topic_name, 0): 20, (topic_name, 1): 20}, \
        "after maxTriggerDelay it reads what there is"
    both = TailraceStreamReader(parse_read_options({"bootstrap": spark_broker.bootstrap, "topic": topic_name,
                                                    "minOffsetsPerTrigger": "5", "maxOffsetsPerTrigger": "7"}, streaming=True))
    assert both.getDefaultReadLimit() == ReadMaxRows(7)
    r.stop()
    both.stop()


def test_a_running_stream_holds_a_small_batch_back_for_min_offsets_per_trigger(spark, spark_broker, topic_name, tmp_path):
    """Through Spark: the first trigger reads at once; 40 more records (< minOffsetsPerTrigger
    100) wait until maxTriggerDelay (2 s) has passed since that batch, then come in one batch,
    one task for both partitions; every record once."""
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 2)
    _fill(spark_broker.bootstrap, topic_name, 2, 20)
    stream = (spark.readStream.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", topic_name)
              .option("startingOffsets", "earliest").option("minOffsetsPerTrigger", 100).option("maxTriggerDelay", "2s").load())
    seen = []

    def sink(df, batch_id):
        seen.append((time.monotonic(), df.rdd.getNumPartitions(), sorted((r.partition, r.offset) for r in df.collect())))

    query = (stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        _fill(spark_broker.bootstrap, topic_name, 2, 20)
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
    assert len(seen) >= 2, seen
    (t1, n1, rows1), (t2, n2, rows2) = seen[0], seen[1]
    assert rows1 == [(p, o) for p in range(2) for o in range(20)]
    assert rows2 == [(p, o) for p in range(2) for o in range(20, 40)]
    assert t2 - t1 >= 1.5, "the second batch waited for maxTriggerDelay"
    assert n1 == n2 == 1, "a small batch is one task"
