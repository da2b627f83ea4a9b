"""Fetched bytes -> Arrow and Arrow -> produce chunks, no JVM: schema, nulls, headers, grouping, sizes."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, BinaryType, DoubleType, MapType, StringType, StructField, StructType

from tailrace.client import codecs
from tailrace.client.records import (
    FLAGS_AT, F_LOG_APPEND_TIME, STAMP_AT, batches_to_columns, encode_batch, encode_batch_buffers, iter_batches,
)
from tailrace.spark_bridge.arrow import (
    ARROW_HEADERS_TYPE, ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, SCHEMA, SCHEMA_WITH_HEADERS, to_record_batch,
)
from tailrace.spark_bridge.errors import OptionError, SchemaError
from tailrace.spark_bridge.options import parse_write_options
from tailrace.spark_bridge.sink import check_input_schema, chunk_rows, chunks_of
from tailrace.spark_bridge.source import TailraceDataSource
from tests.unit.test_hot_path import _lines  # Python lines a call runs, the cycle collector held off


def stamped(frame: bytes, base_offset: int, log_append_time_us: int | None = None) -> bytes:
    """A frame as the broker stores it, with its base offset stamped in (and, for a topic of
    ``message.timestamp.type`` LogAppendTime, the append time and the flag saying so)."""
    buf = bytearray(frame)
    buf[STAMP_AT : STAMP_AT + 8] = base_offset.to_bytes(8, "little", signed=True)
    if log_append_time_us is not None:
        buf[STAMP_AT + 8 : STAMP_AT + 16] = log_append_time_us.to_bytes(8, "little", signed=True)
        buf[FLAGS_AT] |= F_LOG_APPEND_TIME
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


# Six records over three batches: headers (a repeated key, a null value, a non-ASCII key, an
# empty value) in a zstd batch with per-record create times, none in a plain batch, one more in a
# LogAppendTime batch.
HEADERS = [[("trace", b"t-0"), ("trace", b"t-0b"), ("gone", None)], None, [("schlüssel", b"")],
           None, None, [("trace", b"t-5")]]


def fetched_body_with_headers() -> bytes:
    return b"".join([
        stamped(encode_batch([b"v0", b"v1", b"v2"], headers=HEADERS[:3], timestamps_us=[1_000_000, 1_000_005, 1_000_010],
                             compression=codecs.ZSTD), 20),
        stamped(encode_batch([b"v3", b"v4"], create_time_us=2_000_000), 23),
        stamped(encode_batch([b"v5"], headers=HEADERS[5:], create_time_us=3_000_000), 25, log_append_time_us=9_000_000),
    ])


def as_rows(headers: list) -> list:
    """Header lists as the headers column reads back: [] for none, one dict per entry."""
    return [[{"key": k, "value": v} for k, v in (h or [])] for h in headers]


def test_headers_column_is_kafkas_type_and_carries_every_entry_in_order():
    cols = batches_to_columns(iter_batches(fetched_body_with_headers()), 20, 26)
    rb = to_record_batch("events", 1, cols, include_headers=True)
    rb.validate(full=True)
    assert rb.schema.equals(to_arrow_schema(SCHEMA_WITH_HEADERS, timezone="UTC")) and rb.schema.equals(ARROW_SCHEMA_WITH_HEADERS)
    assert rb.schema.names[-1] == "headers" and rb.schema.field("headers").type == ARROW_HEADERS_TYPE
    rows = rb.to_pylist()
    assert [r["headers"] for r in rows] == as_rows(HEADERS)
    assert rb.column("headers").null_count == 0, "records without headers have an empty list, not null"
    assert [r["value"] for r in rows] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]


def test_timestamp_type_follows_each_batch_create_time_or_log_append_time():
    cols = batches_to_columns(iter_batches(fetched_body_with_headers()), 20, 26)
    rows = to_record_batch("events", 1, cols).to_pylist()
    assert [r["timestampType"] for r in rows] == [0, 0, 0, 0, 0, 1]
    assert [round(r["timestamp"].timestamp() * 1e6) for r in rows] == [
        1_000_000, 1_000_005, 1_000_010, 2_000_000, 2_000_000, 9_000_000]


def test_without_include_headers_the_batch_has_no_headers_column():
    cols = batches_to_columns(iter_batches(fetched_body_with_headers()), 20, 26)
    rb = to_record_batch("events", 1, cols)
    assert rb.schema.equals(ARROW_SCHEMA) and "headers" not in rb.schema.names


def test_a_trimmed_range_keeps_the_headers_of_its_own_records():
    cols = batches_to_columns(iter_batches(fetched_body_with_headers()), 21, 24)  # inside the zstd batch, into the next
    rows = to_record_batch("events", 1, cols, include_headers=True).to_pylist()
    assert [r["offset"] for r in rows] == [21, 22, 23]
    assert [r["headers"] for r in rows] == as_rows(HEADERS[1:4])


def test_records_from_batches_without_headers_get_empty_lists():
    cols = batches_to_columns(iter_batches(fetched_body()), 10, 16)
    assert cols.headers is None
    rb = to_record_batch("events", 3, cols, include_headers=True)
    rb.validate(full=True)
    assert rb.column("headers").to_pylist() == [[]] * 6 and rb.column("headers").null_count == 0
    empty = to_record_batch("events", 0, batches_to_columns([], 0, 0), include_headers=True)
    assert empty.num_rows == 0 and empty.schema.equals(ARROW_SCHEMA_WITH_HEADERS)


def test_include_headers_option_picks_the_schema_and_a_schema_passed_to_the_reader_must_be_it():
    plain, with_headers = TailraceDataSource({"topic": "t"}), TailraceDataSource({"topic": "t", "INCLUDEHEADERS": "true"})
    assert plain.schema() == SCHEMA and with_headers.schema() == SCHEMA_WITH_HEADERS
    assert SCHEMA_WITH_HEADERS["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    assert with_headers.reader(SCHEMA_WITH_HEADERS).options.include_headers
    assert with_headers.streamReader(SCHEMA_WITH_HEADERS).options.include_headers
    with pytest.raises(OptionError, match="fixed schema"):
        with_headers.reader(SCHEMA)
    with pytest.raises(OptionError, match="fixed schema"):
        plain.streamReader(SCHEMA_WITH_HEADERS)
    with pytest.raises(OptionError, match="includeHeaders must be true or false"):
        TailraceDataSource({"topic": "t", "includeHeaders": "sometimes"}).schema()


def test_headers_to_arrow_and_arrow_to_produce_chunks_run_the_same_python_lines_for_10_or_5000_records():
    counts = {}
    for n in (10, 5000, 10, 5000):
        headers = [[("h", b"x" * (i % 3)), ("h", None)] if i % 2 else None for i in range(n)]
        cols = batches_to_columns(iter_batches(stamped(encode_batch([b"v"] * n, headers=headers), 0)), 0, n)
        rb = to_record_batch("t", 0, cols, include_headers=True)
        c_read = _lines(lambda: to_record_batch("t", 0, cols, include_headers=True))
        c_write = _lines(lambda: list(chunk_rows(rb.select(["value", "headers"]), 1 << 20)))
        counts.setdefault(n, []).append((c_read, c_write))
    small, big = counts[10][1], counts[5000][1]  # the second round: the first pays one-time lookups
    assert big == small, f"lines for 10 records {small}, for 5000 {big} (read, write): a per-record loop?"


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


def headers_column(headers: list) -> pa.Array:
    return pa.array(as_rows(headers), type=ARROW_HEADERS_TYPE)


def decode_headers(chunk) -> list:
    frame = encode_batch_buffers(chunk.values, chunk.value_offsets, chunk.keys, chunk.key_offsets, headers=chunk.headers)
    (view,) = iter_batches(frame)
    return [list(h) for h in view.headers.lists()] if view.headers is not None else [[]] * view.record_count


def test_a_headers_column_is_written_with_each_record_null_lists_as_none_and_null_values_kept():
    headers = [[("a", b"1"), ("a", None)], None, [], [("ключ", b"")], [("b", b"22"), ("a", b"3")]]
    rb = pa.RecordBatch.from_arrays([binary([b"v%d" % i for i in range(5)]), headers_column(headers)],
                                    names=["value", "headers"])
    (c,) = chunk_rows(rb, 1 << 20)
    assert decode_headers(c) == [h or [] for h in headers]
    (c,) = chunk_rows(rb.slice(1, 2), 1 << 20)
    assert c.headers is None, "rows without a header write a batch without headers"
    (c,) = chunk_rows(rb.slice(3), 1 << 20)
    assert decode(c)[0] == [b"v3", b"v4"] and decode_headers(c) == [[("ключ", b"")], [("b", b"22"), ("a", b"3")]]


def test_header_bytes_count_toward_the_batch_size_when_rows_are_cut():
    n = 3000
    headers = [[("trace-id", b"h" * (i % 200)), ("seen", None)] * (1 + i % 3) for i in range(n)]
    rb = pa.RecordBatch.from_arrays([binary([b"v" * (i % 50) for i in range(n)]), headers_column(headers)],
                                    names=["value", "headers"])
    budget = 64 * 1024
    chunks = list(chunk_rows(rb, budget))
    got = []
    for c in chunks:
        frame = encode_batch_buffers(c.values, c.value_offsets, headers=c.headers)
        assert len(frame) <= budget
        got += decode_headers(c)
    assert got == headers
    sizes = [len(encode_batch_buffers(c.values, c.value_offsets, headers=c.headers)) for c in chunks]
    assert min(sizes[:-1]) > budget * 0.9, f"chunks are filled close to the budget: {sizes}"


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
    null_key = pa.array([[{"key": None, "value": b"x"}]], type=ARROW_HEADERS_TYPE)
    with pytest.raises(SchemaError, match="1 null keys"):
        list(chunk_rows(pa.RecordBatch.from_arrays([binary([b"a"]), null_key], names=["value", "headers"]), 1 << 20))
    null_entry = pa.array([[None, {"key": "k", "value": b"x"}]], type=ARROW_HEADERS_TYPE)
    with pytest.raises(SchemaError, match="1 null entries"):
        list(chunk_rows(pa.RecordBatch.from_arrays([binary([b"a"]), null_entry], names=["value", "headers"]), 1 << 20))


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
    check_input_schema(schema(value=BinaryType(), headers=SCHEMA_WITH_HEADERS["headers"].dataType), with_topic)
    strict = ArrayType(StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), False)]), False)
    check_input_schema(schema(value=BinaryType(), headers=strict), with_topic)
    for wrong in (MapType(StringType(), BinaryType()), ArrayType(StructType([StructField("key", StringType()),
                                                                            StructField("value", StringType())]))):
        with pytest.raises(SchemaError, match=r"column headers must be array<struct<key:string,value:binary>>"):
            check_input_schema(schema(value=BinaryType(), headers=wrong), with_topic)
