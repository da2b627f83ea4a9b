"""The tailrace sink in a real local Spark session: rows written by Spark, read by the client."""

from __future__ import annotations

import time

import pytest
from pyspark.sql import functions as F

from tailrace import Admin, Consumer

pytestmark = pytest.mark.spark


def consume(bootstrap: str, topic: str, total: int, timeout_s: float = 60) -> dict:
    """Every record of ``topic`` as {(partition, offset): (key, value)}, until ``total`` arrived."""
    got = {}
    deadline = time.monotonic() + timeout_s
    with Consumer(bootstrap, max_wait_ms=100, isolation="durable") as cons:
        cons.assign(topic, start="earliest")
        while len(got) < total and time.monotonic() < deadline:
            for r in cons.poll(200):
                got[(r.partition, r.offset)] = (r.key, r.value)
    return got


def writer(df, broker, **options):
    w = df.write.format("tailrace").option("bootstrap", broker.bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    return w


def test_dataframe_written_to_a_topic_is_read_back_by_the_consumer(spark, spark_broker, topic_name):
    Admin(spark_broker.bootstrap).create_topic(topic_name, 3)
    n = 6000
    df = spark.range(0, n, 1, 4).select(
        F.format_string("value-%06d", "id").cast("binary").alias("value"),
        F.when(F.col("id") % 2 == 0, F.format_string("key-%06d", "id").cast("binary")).alias("key"),
        (F.col("id") % 3).cast("int").alias("partition"),
    )
    writer(df, spark_broker, topic=topic_name).mode("append").save()
    got = consume(spark_broker.bootstrap, topic_name, n)
    assert len(got) == n
    by_value = {v: (p, k) for (p, _off), (k, v) in got.items()}
    for i in range(n):
        partition, key = by_value[b"value-%06d" % i]
        assert partition == i % 3
        # a keyed batch writes a null key as an empty key (docs/SPARK.md)
        assert key == (b"key-%06d" % i if i % 2 == 0 else b"")
    for p in range(3):  # dense offsets from 0 in every partition
        assert sorted(off for (q, off) in got if q == p) == list(range(n // 3))


def test_rows_without_partition_go_round_robin_and_topic_column_routes_rows(spark, spark_broker, topic_name):
    a, b = topic_name + "-a", topic_name + "-b"
    Admin(spark_broker.bootstrap).create_topic(a, 2)
    Admin(spark_broker.bootstrap).create_topic(b, 1)
    df = spark.createDataFrame([(f"m{i}", a if i % 4 else b) for i in range(400)], "value string, topic string")
    writer(df.repartition(2), spark_broker, acks="memory").mode("append").save()
    got_a, got_b = consume(spark_broker.bootstrap, a, 300), consume(spark_broker.bootstrap, b, 100)
    assert sorted(v for _k, v in got_a.values()) == sorted(b"m%d" % i for i in range(400) if i % 4)
    assert sorted(v for _k, v in got_b.values()) == sorted(b"m%d" % i for i in range(0, 400, 4))
    assert {p for p, _off in got_a} == {0, 1}


def test_overwrite_mode_is_rejected(spark, spark_broker, topic_name):
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="append-only log"):
        writer(df, spark_broker, topic=topic_name).mode("overwrite").save()


def test_stream_from_one_topic_into_another_carries_every_record(spark, spark_broker, topic_name, tmp_path):
    src, dst = topic_name + "-in", topic_name + "-out"
    Admin(spark_broker.bootstrap).create_topic(src, 2)
    Admin(spark_broker.bootstrap).create_topic(dst, 2)
    spark.range(0, 1000, 1, 2).select(F.format_string("e%04d", "id").cast("binary").alias("value"),
                                     (F.col("id") % 2).cast("int").alias("partition")) \
        .write.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", src).mode("append").save()
    stream = (spark.readStream.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", src)
              .option("startingOffsets", "earliest").load())
    query = (stream.select("value", "partition").writeStream.format("tailrace")
             .option("bootstrap", spark_broker.bootstrap).option("topic", dst)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None
    got = consume(spark_broker.bootstrap, dst, 1000)
    assert sorted(v for _k, v in got.values()) == [b"e%04d" % i for i in range(1000)]


def test_a_fresh_topic_is_produced_to_straight_from_its_workers(spark_broker, topic_name):
    """No Spark: the executor-side function, on a topic no request has touched yet. Only the
    first request of each partition may go through the router (it makes the owner take the
    partition up); everything after goes straight to the owning worker."""
    import pyarrow as pa

    from tailrace.spark_bridge.options import parse_write_options
    from tailrace.spark_bridge.sink import produce

    Admin(spark_broker.bootstrap).create_topic(topic_name, 2)
    options = parse_write_options({"bootstrap": spark_broker.bootstrap, "topic": topic_name, "acks": "memory",
                                   "maxBatchBytes": "4096"})
    before = Admin(spark_broker.bootstrap).status()["forwarded"]
    batch = pa.RecordBatch.from_arrays([pa.array([b"r%d" % i for i in range(1000)]), pa.array([i % 2 for i in range(1000)])],
                                       names=["value", "partition"])
    assert produce(iter([batch, batch.slice(500)]), options).records == 1500
    forwarded = Admin(spark_broker.bootstrap).status()["forwarded"] - before
    assert forwarded <= 2, f"{forwarded} produce requests went through the router"
    got = consume(spark_broker.bootstrap, topic_name, 1500)
    assert sorted(v for _k, v in got.values()) == sorted([b"r%d" % i for i in range(1000)] + [b"r%d" % i for i in range(500, 1000)])


def test_a_headers_column_is_written_with_each_record_and_copies_through_a_read_and_a_write(spark, spark_broker, topic_name):
    """A DataFrame's headers (repeated keys, null values, null and empty lists) reach the broker
    with their records; read back with includeHeaders and written on, they arrive unchanged."""
    src, dst = topic_name + "-in", topic_name + "-out"
    with Admin(spark_broker.bootstrap) as a:  # small rings: the tests share the broker's shared-memory budget
        a.create_topic(src, 2, ring_bytes=2 << 20)
        a.create_topic(dst, 2, ring_bytes=2 << 20)
    n = 900

    def headers(i: int) -> list | None:
        return [None, [], [("trace", b"t%d" % i), ("trace", None), ("size", b"x" * (i % 300))],
                [("ключ", b"")]][i % 4]

    rows = [(b"m%04d" % i, i % 2, headers(i)) for i in range(n)]
    df = spark.createDataFrame(rows, "value binary, partition int, headers array<struct<key:string,value:binary>>")
    writer(df.repartition(3), spark_broker, topic=src, maxBatchBytes="8192").mode("append").save()
    want = {b"m%04d" % i: tuple(headers(i) or ()) for i in range(n)}

    def headers_by_value(topic: str) -> dict:
        got = {}
        deadline = time.monotonic() + 60
        with Consumer(spark_broker.bootstrap, max_wait_ms=100, isolation="durable") as cons:
            cons.assign(topic, start="earliest")
            while len(got) < n and time.monotonic() < deadline:
                for r in cons.poll(200):
                    got[r.value] = tuple(r.headers)
        return got

    assert headers_by_value(src) == want
    copied = (spark.read.format("tailrace").option("bootstrap", spark_broker.bootstrap).option("topic", src)
              .option("includeHeaders", "true").load().select("key", "value", "partition", "headers"))
    writer(copied, spark_broker, topic=dst).mode("append").save()
    assert headers_by_value(dst) == want


def test_a_headers_column_of_another_type_is_refused_before_any_task_runs(spark, spark_broker, topic_name):
    df = spark.createDataFrame([(b"x", {"k": b"v"})], "value binary, headers map<string,binary>")
    with pytest.raises(Exception, match="column headers must be array<struct<key:string,value:binary>>"):
        writer(df, spark_broker, topic=topic_name).mode("append").save()
