"""The tailrace source in a real local Spark session against a real broker: batch and streaming."""

from __future__ import annotations

import json
import time

import pytest
from pyspark.sql import functions as F

from tailrace import Admin, Producer
from tailrace.spark_bridge.offsets import to_json, from_json

pytestmark = pytest.mark.spark


def produce(bootstrap: str, topic: str, partitions: int, start: int, count: int, keyed_every: int = 0) -> dict:
    """``count`` records per partition, numbered from ``start``; every ``keyed_every``-th batch of
    100 carries keys. Returns {(partition, offset): (key, value)} as the broker will number them."""
    expected = {}
    with Producer(bootstrap, acks="durable") as prod:
        for p in range(partitions):
            for first in range(start, start + count, 100):
                seq = range(first, min(first + 100, start + count))
                values = [b"p%d-v%07d" % (p, i) for i in seq]
                keyed = keyed_every and (first // 100) % keyed_every == 0
                keys = [b"k%07d" % i for i in seq] if keyed else None
                prod.send_batch(topic, values, keys, partition=p)
                for j, i in enumerate(seq):
                    expected[(p, i)] = (keys[j] if keys else None, values[j])
        prod.flush()
    return expected


def reader(spark, broker, topic, **options):
    r = spark.read.format("tailrace").option("bootstrap", broker.bootstrap).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_returns_exactly_the_produced_rows(spark, spark_broker, topic_name):
    Admin(spark_broker.bootstrap).create_topic(topic_name, 3)
    expected = produce(spark_broker.bootstrap, topic_name, 3, 0, 2500, keyed_every=3)
    df = reader(spark, spark_broker, topic_name, startingOffsets="earliest", endingOffsets="latest")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert df.rdd.getNumPartitions() == 1, "7,500 records are one task (minRecordsPerPartition)"
    assert reader(spark, spark_broker, topic_name, minRecordsPerPartition=1).rdd.getNumPartitions() == 3
    rows = df.collect()
    got = {(r.partition, r.offset): (None if r.key is None else bytes(r.key), bytes(r.value)) for r in rows}
    assert len(rows) == len(expected) == 7500
    assert got == expected
    assert {r.topic for r in rows} == {topic_name} and {r.timestampType for r in rows} == {0}


def test_batch_read_honours_offset_maps_and_splits_ranges_for_min_partitions(spark, spark_broker, topic_name):
    Admin(spark_broker.bootstrap).create_topic(topic_name, 2)
    produce(spark_broker.bootstrap, topic_name, 2, 0, 1000)
    starting = json.dumps({topic_name: {"0": 100, "1": -2}})
    ending = json.dumps({topic_name: {"0": 900, "1": -1}})
    df = reader(spark, spark_broker, topic_name, startingOffsets=starting, endingOffsets=ending, minPartitions=6)
    assert df.rdd.getNumPartitions() == 6
    per = {r.partition: (r["min(offset)"], r["max(offset)"], r["count"])
           for r in df.groupBy("partition").agg(F.min("offset"), F.max("offset"), F.count("*").alias("count")).collect()}
    assert per == {0: (100, 899, 800), 1: (0, 999, 1000)}


def run_available_now(spark, broker, topic, out, checkpoint) -> list:
    stream = (spark.readStream.format("tailrace").option("bootstrap", broker.bootstrap).option("topic", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 700).load())
    query = (stream.select("partition", "offset", "value").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "availableNow query did not terminate"
    assert query.exception() is None, query.exception()
    return query.recentProgress


def test_a_stream_with_group_id_commits_each_micro_batch_so_the_group_shows_its_lag(spark, spark_broker, topic_name, tmp_path):
    """groupId: every finished micro-batch's end offsets are committed to the group (issue 19):
    after an availableNow run the group's committed offsets are the query's end, lag 0; more
    data shows as lag until the next run."""
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 2)
    produce(spark_broker.bootstrap, topic_name, 2, 0, 300)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run():
        stream = (spark.readStream.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", topic_name)
                  .option("startingOffsets", "earliest").option("groupId", "spark-job").load())
        query = (stream.select("partition", "offset").writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(180) and query.exception() is None

    run()
    with Admin(spark_broker.bootstrap) as a:
        assert a.committed("spark-job") == {(topic_name, 0): 300, (topic_name, 1): 300}
    produce(spark_broker.bootstrap, topic_name, 2, 300, 50)
    run()
    with Admin(spark_broker.bootstrap) as a:
        assert a.committed("spark-job") == {(topic_name, 0): 350, (topic_name, 1): 350}
    assert spark.read.parquet(str(out)).count() == 700


def test_available_now_stream_restarted_with_new_data_writes_every_message_exactly_once(
        spark, spark_broker, topic_name, tmp_path):
    Admin(spark_broker.bootstrap).create_topic(topic_name, 2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    expected = produce(spark_broker.bootstrap, topic_name, 2, 0, 1000)
    first = run_available_now(spark, spark_broker, topic_name, out, checkpoint)
    batches = [p for p in first if p["numInputRows"] > 0]
    assert len(batches) == 3, "2000 rows at maxOffsetsPerTrigger=700 take three micro-batches"
    assert [p["numInputRows"] for p in batches] == [700, 700, 600]
    end = batches[-1]["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert json.dumps(end) == json.dumps(to_json(from_json(end))), "offsets must be canonical JSON"
    assert from_json(end) == {(topic_name, 0): 1000, (topic_name, 1): 1000}

    expected.update(produce(spark_broker.bootstrap, topic_name, 2, 1000, 500))
    second = run_available_now(spark, spark_broker, topic_name, out, checkpoint)
    assert sum(p["numInputRows"] for p in second) == 1000

    rows = spark.read.parquet(str(out)).collect()
    got = [(r.partition, r.offset) for r in rows]
    assert len(got) == len(set(got)) == 3000, "a message was written twice"
    assert {(r.partition, r.offset): bytes(r.value) for r in rows} == {k: v for k, (_key, v) in expected.items()}


def _mark() -> int:
    import time

    time.sleep(0.005)
    t = int(time.time() * 1000)
    time.sleep(0.005)
    return t


def test_batch_and_stream_start_and_end_by_timestamp_with_kafkas_options(spark, spark_broker, topic_name, tmp_path):
    """startingTimestamp / endingTimestamp over every partition, the per-partition JSON maps,
    startingOffsetsByTimestampStrategy both ways, an ending time past everything = latest, and
    a stream started by time."""
    Admin(spark_broker.bootstrap).create_topic(topic_name, 2)
    t = [_mark()]
    for phase in range(3):  # phase i: offsets 100*i .. 100*i+99 in each partition, appended after t[i]
        produce(spark_broker.bootstrap, topic_name, 2, 100 * phase, 100)
        t.append(_mark())

    def spans(df) -> dict:
        return {r.partition: (r["min(offset)"], r["max(offset)"], r["count"])
                for r in df.groupBy("partition").agg(F.min("offset"), F.max("offset"), F.count("*").alias("count")).collect()}

    df = reader(spark, spark_broker, topic_name, startingTimestamp=str(t[1]), endingTimestamp=str(t[2]))
    assert spans(df) == {0: (100, 199, 100), 1: (100, 199, 100)}
    starting = json.dumps({topic_name: {"0": t[2], "1": t[1]}})
    ending = json.dumps({topic_name: {"0": t[3]}})  # partition 1: endingOffsets (latest)
    df = reader(spark, spark_broker, topic_name, startingOffsetsByTimestamp=starting, endingOffsetsByTimestamp=ending,
                startingOffsets="earliest")
    assert spans(df) == {0: (200, 299, 100), 1: (100, 299, 200)}
    df = reader(spark, spark_broker, topic_name, startingTimestamp=str(t[0]), endingTimestamp=str(t[3] + 60_000))
    assert spans(df) == {0: (0, 299, 300), 1: (0, 299, 300)}  # an end past everything is the latest offset
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):  # default "error": nothing that recent
        reader(spark, spark_broker, topic_name, startingTimestamp=str(t[3])).collect()
    assert reader(spark, spark_broker, topic_name, startingTimestamp=str(t[3]),
                  startingOffsetsByTimestampStrategy="latest").count() == 0

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream = (spark.readStream.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", topic_name)
              .option("startingTimestamp", str(t[2])).load())
    query = (stream.select("partition", "offset").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(180) and query.exception() is None
    assert spans(spark.read.parquet(str(out))) == {0: (200, 299, 100), 1: (200, 299, 100)}


def test_fail_on_data_loss_both_ways_when_retention_took_what_a_query_asks_for(spark, spark_broker, topic_name):
    """Offsets below the log start (records gone with retention): failOnDataLoss=true (the
    default) fails the query naming the option; false reads what is left, exactly."""
    import time

    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 1, config={"retention.ms": 1000})
        produce(spark_broker.bootstrap, topic_name, 1, 0, 1000)
        deadline = time.monotonic() + 30  # the flusher's retention pass: every 5 s by default
        while a.list_offsets(topic_name)[0].log_start_offset < 1000:
            assert time.monotonic() < deadline, a.list_offsets(topic_name)
            time.sleep(0.2)
        a.alter_configs(topic_name, {"retention.ms": -1})
    produce(spark_broker.bootstrap, topic_name, 1, 1000, 500)
    starting = json.dumps({topic_name: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss=false"):
        reader(spark, spark_broker, topic_name, startingOffsets=starting).collect()
    df = reader(spark, spark_broker, topic_name, startingOffsets=starting, failOnDataLoss="false")
    rows = df.select("offset", "value").collect()
    assert sorted(r.offset for r in rows) == list(range(1000, 1500))
    assert {bytes(r.value) for r in rows} == {b"p0-v%07d" % i for i in range(1000, 1500)}


# The tests share one broker and its shared-memory budget (conftest.py): these topics hold a few
# hundred small records, so their partitions take the smallest ring the broker allows (2 x its
# 1 MiB max batch) instead of the 8 MiB default.
SMALL_RING_BYTES = 2 << 20


def header_pattern(i: int) -> list | None:
    """Record i's headers: a repeated key with a null value, a non-ASCII key with an empty value,
    none at all, an empty list (the same as none)."""
    return [[("trace", b"t%d" % i), ("trace", b"t%d-again" % i), ("gone", None)],
            None, [("schlüssel", b"")], []][i % 4]


def headers_of(row) -> list:
    """A collected ``headers`` value as (key, value) pairs."""
    return [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers]


def produce_with_headers(bootstrap: str, topic: str, partitions: int, count: int, base_ms: int) -> dict:
    """``count`` records (record i to partition i % partitions, create time base_ms + i), zstd
    batches, headers by ``header_pattern``; {(partition, offset): (value, headers, time_ms)}."""
    expected = {}
    with Producer(bootstrap, acks="durable", compression="zstd") as prod:
        for i in range(count):
            p, headers = i % partitions, header_pattern(i)
            prod.send(topic, b"v%05d" % i, key=b"k%d" % i if i % 3 else None, headers=headers,
                      timestamp_ms=base_ms + i, partition=p)
            expected[(p, i // partitions)] = (b"v%05d" % i, headers or [], base_ms + i)
        prod.flush()
    return expected


def test_include_headers_reads_each_records_headers_and_timestamp_type_from_zstd_batches(spark, spark_broker, topic_name, tmp_path):
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(topic_name, 2, ring_bytes=SMALL_RING_BYTES)
    base_ms = int(time.time() * 1000) - 60_000
    expected = produce_with_headers(spark_broker.bootstrap, topic_name, 2, 600, base_ms)
    df = reader(spark, spark_broker, topic_name, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    rows = df.select("partition", "offset", "value", "headers", "timestampType",
                     F.unix_micros("timestamp").alias("ts_us")).collect()
    got = {(r.partition, r.offset): (bytes(r.value), headers_of(r), r.ts_us // 1000) for r in rows}
    assert got == expected
    assert {r.timestampType for r in rows} == {0}
    assert all(r.headers is not None for r in rows), "a record without headers has an empty list, not null"

    for plain in (reader(spark, spark_broker, topic_name), reader(spark, spark_broker, topic_name, includeHeaders="false")):
        assert "headers" not in plain.columns and plain.count() == 600

    # the stream reader has the same schema and column
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream = (spark.readStream.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", topic_name)
              .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
    query = (stream.select("partition", "offset", "value", "headers").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(180) and query.exception() is None
    streamed = {(r.partition, r.offset): (bytes(r.value), headers_of(r)) for r in spark.read.parquet(str(out)).collect()}
    assert streamed == {k: (v, h) for k, (v, h, _t) in expected.items()}


def test_a_log_append_time_topic_reads_timestamp_type_1_and_the_brokers_time(spark, spark_broker, topic_name):
    appended, created = topic_name + "-lat", topic_name + "-ct"
    with Admin(spark_broker.bootstrap) as a:
        a.create_topic(appended, 1, ring_bytes=SMALL_RING_BYTES, config={"message.timestamp.type": "LogAppendTime"})
        # records made in 2001 are past any time retention by their create time: kept for ever here,
        # or a retention pass between the produce and the read rightly takes them (Kafka's meaning)
        a.create_topic(created, 1, ring_bytes=SMALL_RING_BYTES, config={"retention.ms": -1})
    old_ms = 1_000_000_000_000  # 2001: the create time a LogAppendTime topic does not keep
    before_us = int(time.time() * 1_000_000)
    for t in (appended, created):
        produce_with_headers(spark_broker.bootstrap, t, 1, 50, old_ms)
    after_us = int(time.time() * 1_000_000)
    df = reader(spark, spark_broker, f"{appended},{created}", includeHeaders="true")
    rows = df.select("topic", "offset", "timestampType", "headers", F.unix_micros("timestamp").alias("ts_us")).collect()
    assert len(rows) == 100
    lat = [r for r in rows if r.topic == appended]
    ct = sorted((r for r in rows if r.topic == created), key=lambda r: r.offset)
    assert {r.timestampType for r in lat} == {1} and {r.timestampType for r in ct} == {0}
    assert all(before_us <= r.ts_us <= after_us for r in lat), "LogAppendTime: the broker's clock at append"
    assert [r.ts_us for r in ct] == [(old_ms + i) * 1000 for i in range(50)]
    assert [headers_of(r) for r in sorted(lat, key=lambda r: r.offset)] == [header_pattern(i) or [] for i in range(50)]


def test_every_codec_and_version_1_batches_read_alike(spark, spark_broker, topic_name):
    """One partition per codec (none, gzip, snappy, lz4, zstd), and version 1 batches (what a
    data directory of the release before format v2 holds) in front of the uncompressed one: the
    source reads every record, headers and times of each."""
    from tailrace.client import protocol as P
    from tailrace.client.connection import Connection
    from tailrace.client.records import encode_batch

    codecs = [None, "gzip", "snappy", "lz4", "zstd"]
    with Admin(spark_broker.bootstrap) as a:  # its version 1 batches are dated 2001: kept for ever, as above
        a.create_topic(topic_name, len(codecs), ring_bytes=SMALL_RING_BYTES, config={"retention.ms": -1})
    conn = Connection(spark_broker.bootstrap)
    try:
        for j in range(2):
            conn.request(P.Op.PRODUCE, topic_name, 0, P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)),
                         encode_batch([b"v1-%d-%d" % (j, i) for i in range(3)], create_time_us=1_000_000_000_000_000,
                                      version=1))
    finally:
        conn.close()
    base_ms = int(time.time() * 1000) - 60_000
    expected = {(0, k): (b"v1-%d-%d" % divmod(k, 3), [], 1_000_000_000_000) for k in range(6)}
    for p, codec in enumerate(codecs):
        with Producer(spark_broker.bootstrap, acks="durable", compression=codec, linger_ms=5) as prod:
            for i in range(40):
                prod.send(topic_name, b"%s-%d" % ((codec or "none").encode(), i), headers=header_pattern(i),
                          timestamp_ms=base_ms + i, partition=p)
            prod.flush()
        first = 6 if p == 0 else 0
        for i in range(40):
            expected[(p, first + i)] = (b"%s-%d" % ((codec or "none").encode(), i), header_pattern(i) or [], base_ms + i)
    rows = (reader(spark, spark_broker, topic_name, includeHeaders="true")
            .select("partition", "offset", "value", "headers", F.unix_micros("timestamp").alias("ts_us")).collect())
    assert {(r.partition, r.offset): (bytes(r.value), headers_of(r), r.ts_us // 1000) for r in rows} == expected
