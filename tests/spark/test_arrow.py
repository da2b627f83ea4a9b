"""Fetched bytes -> Arrow and Arrow -> produce chunks, no JVM: schema, nulls, grouping, sizes."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, DoubleType, StringType, StructField, StructType

from tailrace.client.records import batches_to_columns, encode_batch, encode_batch_buffers, iter_batches
from tailrace.spark_bridge.arrow import ARROW_SCHEMA, SCHEMA, to_record_batch
from tailrace.spark_bridge.errors import SchemaError
from tailrace.spark_bridge.options import parse_write_options
from tailrace.spark_bridge.sink import check_input_schema, chunk_rows, chunks_of


def stamped(frame: bytes, base_offset: int) -> bytes:
    """A frame as the broker stores it, with its base offset stamped in."""
    buf = bytearray(frame)
    buf[8:16] = base_offset.to_bytes(8, "little", signed=True)
    return bytes(buf)


def fetched_body() -> bytes:
    """Three batches back to back, as a fetch reply carries them: keyed, unkeyed, keyed."""
    return b"".join([
        stamped(encode_batch([b"v0", b"v1"], [b"k0", b"k1"], create_time_us=1_000_000), 10),
        stamped(encode_batch([b"v2", b"", b"v4"], create_time_us=2_000_000), 12),
        stamped(encode_batch([b"v5"], [b""], create_time_us=3_000_000), 15),
    ])


def test_record_batch_matches_sparks_arrow_schema_exactly():
    cols = batches_to_columns(iter_batches(fetched_body()), 11, 16)
    rb = to_record_batch("events", 3, cols)
    assert rb.schema.equals(to_arrow_schema(SCHEMA, timezone="UTC"))
    assert rb.schema.equals(ARROW_SCHEMA)
    assert rb.schema.field("partition").type == pa.int32()
    assert rb.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    rb.validate(full=True)


def test_record_batch_carries_values_null_keys_offsets_and_create_times():
    cols = batches_to_columns(iter_batches(fetched_body()), 11, 16)  # trims the first record
    rows = to_record_batch("events", 3, cols).to_pylist()
    assert [r["offset"] for r in rows] == [11, 12, 13, 14, 15]
    assert [r["value"] for r in rows] == [b"v1", b"v2", b"", b"v4", b"v5"]
    assert [r["key"] for r in rows] == [b"k1", None, None, None, b""]
    assert {r["topic"] for r in rows} == {"events"} and {r["partition"] for r in rows} == {3}
    assert [r["timestamp"].timestamp() for r in rows] == [1.0, 2.0, 2.0, 2.0, 3.0]
    assert {r["timestampType"] for r in rows} == {0}


def test_empty_fetch_gives_an_empty_batch_of_the_same_schema():
    rb = to_record_batch("events", 0, batches_to_columns([], 0, 0))
    assert rb.num_rows == 0 and rb.schema.equals(ARROW_SCHEMA)


def binary(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, type=pa.binary())


def decode(chunk) -> tuple[list[bytes], list[bytes] | None]:
    """A chunk encoded the way the producer encodes it, read back through the record format."""
    frame = encode_batch_buffers(chunk.values, chunk.value_offsets, chunk.keys, chunk.key_offsets)
    (view,) = iter_batches(frame)
    return [view.value(i) for i in range(view.record_count)], (
        None if view.key_offsets is None else [view.key(i) for i in range(view.record_count)])


def test_rows_are_cut_into_chunks_under_the_batch_size_and_keep_order():
    values = [bytes([i % 251]) * (i % 300) for i in range(5000)]
    rb = pa.RecordBatch.from_arrays([binary(values)], names=["value"])
    chunks = list(chunk_rows(rb, 64 * 1024))
    assert len(chunks) > 5
    got = []
    for c in chunks:
        frame = encode_batch_buffers(c.values, c.value_offsets)
        assert len(frame) <= 64 * 1024
        got += decode(c)[0]
    assert got == values


def test_string_columns_and_null_keys_are_written_as_bytes_and_empty_keys():
    rb = pa.RecordBatch.from_arrays([pa.array(["a", "bb", "ccc"]), pa.array(["x", None, "z"])], names=["value", "key"])
    (c,) = chunk_rows(rb, 1 << 20)
    assert decode(c) == ([b"a", b"bb", b"ccc"], [b"x", b"", b"z"])
    all_null = pa.RecordBatch.from_arrays([binary([b"a"]), binary([None])], names=["value", "key"])
    (c,) = chunk_rows(all_null, 1 << 20)
    assert c.keys is None, "a key column of nulls only writes an unkeyed batch"


def test_sliced_arrow_input_is_read_from_its_offset():
    rb = pa.RecordBatch.from_arrays([binary([b"skip", b"one", b"two"])], names=["value"]).slice(1)
    (c,) = chunk_rows(rb, 1 << 20)
    assert decode(c)[0] == [b"one", b"two"]


def test_rows_are_grouped_by_topic_and_partition_and_unpartitioned_rows_go_round_robin():
    rb = pa.RecordBatch.from_arrays([
        binary([b"a", b"b", b"c", b"d", b"e", b"f"]),
        pa.array(["t1", "t2", "t1", "t1", "t2", "t1"]),
        pa.array([1, 0, 1, None, 0, 2], type=pa.int32()),
    ], names=["value", "topic", "partition"])
    opts = parse_write_options({})
    got = [(t, p, decode(c)[0]) for t, p, c in chunks_of(rb, opts, lambda topic: 3, itertools.count(7))]
    assert sorted(got) == [("t1", 1, [b"a", b"c"]), ("t1", 1, [b"d"]), ("t1", 2, [b"f"]), ("t2", 0, [b"b", b"e"])]
    forced = parse_write_options({"topic": "only"})
    assert {t for t, _p, _c in chunks_of(rb, forced, lambda topic: 3, itertools.count())} == {"only"}


def test_unwritable_rows_raise_schema_errors_naming_the_problem():
    opts = parse_write_options({"topic": "t"})
    with pytest.raises(SchemaError, match="value cannot be null"):
        list(chunk_rows(pa.RecordBatch.from_arrays([binary([b"a", None])], names=["value"]), 1 << 20))
    wide = pa.RecordBatch.from_arrays([binary([b"a"]), pa.array([5], type=pa.int64())], names=["value", "partition"])
    with pytest.raises(SchemaError, match="partition out of range"):
        list(chunks_of(wide, opts, lambda topic: 2, itertools.count()))
    no_topic = pa.RecordBatch.from_arrays([binary([b"a"]), pa.array([None], type=pa.string())], names=["value", "topic"])
    with pytest.raises(SchemaError, match="column topic has 1 nulls"):
        list(chunks_of(no_topic, parse_write_options({}), lambda topic: 2, itertools.count()))


def test_dataframes_that_cannot_be_written_are_refused_on_the_driver():
    def schema(**cols):
        return StructType([StructField(name, typ) for name, typ in cols.items()])

    with_topic = parse_write_options({"topic": "t"})
    check_input_schema(schema(value=StringType(), key=BinaryType(), extra=DoubleType()), with_topic)
    with pytest.raises(SchemaError, match="needs a value column"):
        check_input_schema(schema(key=BinaryType()), with_topic)
    with pytest.raises(SchemaError, match="column partition must be"):
        check_input_schema(schema(value=BinaryType(), partition=StringType()), with_topic)
    with pytest.raises(SchemaError, match="option topic or a topic column"):
        check_input_schema(schema(value=BinaryType()), parse_write_options({}))
