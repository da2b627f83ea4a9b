"""Fetched records -> Arrow record batches, with numpy alone: no Python object per message.

Some facts about Arrow that this module leans on:

- A ``binary`` (or ``string``) array is two buffers: int32 offsets ``[n + 1]`` from 0 and one
  data buffer; validity is an optional bitmap, least significant bit first, 1 = present.
  That is exactly client/records.py's ``Columns``: ``value_offsets`` + ``values``, and
  ``key_offsets`` + ``keys`` with ``key_valid`` as the bitmap (a batch produced without keys
  gives null keys).
- ``pa.Array.from_buffers`` wraps buffers as they are (numpy arrays through the buffer protocol,
  zero copy), so building a batch costs a few small allocations per *fetch*, none per record.
- Spark checks every batch a Python data source yields against
  ``to_arrow_schema(schema, timezone="UTC")`` with ``Schema.equals``: int32 partition, int64
  offset, timestamp[us, tz=UTC], nullable fields. ``ARROW_SCHEMA`` is that schema, computed by
  Spark's own function at import, and ``to_record_batch`` builds every column with its type.
- A ``list`` array is int32 offsets ``[n + 1]`` over one child array, here a ``struct`` of two
  children. client/sections.py's ``HeaderArrays`` is that shape already: ``starts`` are the
  list offsets, and the header keys and values are two binary arrays (keys UTF-8, so a string
  array; ``valid`` the values' bitmap). A record without headers is an empty range, an empty
  list, never a null one (Kafka's source gives ``[]`` too).

The schema and its column order are Kafka's source schema, so queries written for Kafka run;
``headers`` is there only with ``includeHeaders``, last, as in Kafka's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
)

from tailrace.client.records import Columns
from tailrace.client.sections import HeaderArrays

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
# Kafka's headers type (KafkaRecordToRowConverter.headersType): nullable keys and values, as there
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
SCHEMA_WITH_HEADERS = StructType(SCHEMA.fields + [StructField("headers", HEADERS_TYPE)])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
ARROW_SCHEMA_WITH_HEADERS = to_arrow_schema(SCHEMA_WITH_HEADERS, timezone="UTC")
ARROW_HEADERS_TYPE = ARROW_SCHEMA_WITH_HEADERS.field("headers").type  # list<element: struct<key: string, value: binary>>
ARROW_HEADER_FIELDS = list(ARROW_HEADERS_TYPE.value_type)  # [key: string, value: binary]

assert ARROW_SCHEMA.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
assert ARROW_SCHEMA_WITH_HEADERS.names == ARROW_SCHEMA.names + ["headers"]
assert ARROW_SCHEMA.field("partition").type == pa.int32()
assert ARROW_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
assert [(f.name, f.type) for f in ARROW_HEADER_FIELDS] == [("key", pa.string()), ("value", pa.binary())]


def schema(include_headers: bool) -> StructType:
    """The source's schema: Kafka's, with ``headers`` last when ``includeHeaders`` is set."""
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA

_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")


def _buf(a: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.ascontiguousarray(a))


def _binary(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    n = len(offsets) - 1
    if valid is None or bool(valid.all()):
        return pa.Array.from_buffers(pa.binary(), n, [None, _buf(offsets), _buf(data)], null_count=0)
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(pa.binary(), n, [_buf(bitmap), _buf(offsets), _buf(data)],
                                 null_count=n - int(np.count_nonzero(valid)))


def _string(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A string array over bytes the writer checked are UTF-8 (the broker checks header keys)."""
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1, [None, _buf(offsets), _buf(data)], null_count=0)


def _fixed(typ: pa.DataType, values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(typ, len(values), [None, _buf(values)], null_count=0)


def _repeated_string(text: str, n: int) -> pa.Array:
    """``n`` copies of ``text`` as a string array: one tiled buffer, arange offsets."""
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=_I32) * len(raw)
    data = np.frombuffer(raw * n, dtype=np.uint8) if raw and n else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(pa.string(), n, [None, _buf(offsets), _buf(data)], null_count=0)


def _timestamp_types(cols: Columns) -> np.ndarray:
    """int32[n]: each record's timestampType (0 CreateTime, 1 LogAppendTime, Kafka's ids)."""
    if cols.timestamp_types is None:  # every record is CreateTime
        return np.zeros(len(cols), dtype=_I32)
    return cols.timestamp_types.astype(_I32)


def headers_array(headers: HeaderArrays | None, n: int) -> pa.Array:
    """The ``headers`` column of ``n`` records: list offsets are ``headers.starts``, the list's
    child is the struct of the header keys and values, all over the arrays' own buffers. With
    ``headers`` None (no record has any), n empty lists."""
    if headers is None:
        starts = np.zeros(n + 1, dtype=_I32)
        key_offsets = value_offsets = np.zeros(1, dtype=_I32)
        keys = values = np.zeros(0, dtype=np.uint8)
        valid = np.zeros(0, dtype=bool)
    else:
        starts = headers.starts.astype(_I32, copy=False)
        key_offsets, keys = headers.key_offsets.astype(_I32, copy=False), np.frombuffer(headers.keys, np.uint8)
        value_offsets, values = headers.value_offsets.astype(_I32, copy=False), np.frombuffer(headers.values, np.uint8)
        valid = headers.valid
    assert len(starts) == n + 1, (len(starts), n)
    entries = pa.StructArray.from_arrays([_string(key_offsets, keys), _binary(value_offsets, values, valid)],
                                         fields=ARROW_HEADER_FIELDS)
    return pa.ListArray.from_arrays(_fixed(pa.int32(), starts), entries, type=ARROW_HEADERS_TYPE)


def to_record_batch(topic: str, partition: int, cols: Columns, include_headers: bool = False) -> pa.RecordBatch:
    """One fetch's records as a batch of ARROW_SCHEMA (ARROW_SCHEMA_WITH_HEADERS with
    ``include_headers``), sharing the numpy buffers of ``cols``."""
    n = len(cols)
    arrays = [
        _binary(cols.key_offsets.astype(_I32, copy=False), cols.keys, cols.key_valid),
        _binary(cols.value_offsets.astype(_I32, copy=False), cols.values),
        _repeated_string(topic, n),
        _fixed(pa.int32(), np.full(n, partition, dtype=_I32)),
        _fixed(pa.int64(), cols.offsets.astype(_I64, copy=False)),
        _fixed(pa.timestamp("us", tz="UTC"), cols.timestamps_us.astype(_I64, copy=False)),
        _fixed(pa.int32(), _timestamp_types(cols)),
    ]
    if not include_headers:
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
    arrays.append(headers_array(cols.headers, n))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA_WITH_HEADERS)
