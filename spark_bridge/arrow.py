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

The schema and its column order are Kafka's source schema, so queries written for Kafka run.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from tailrace.client.records import Columns

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
CREATE_TIME = 0  # timestampType: the producer's create time (Kafka's CreateTime)

assert ARROW_SCHEMA.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
assert ARROW_SCHEMA.field("partition").type == pa.int32()
assert ARROW_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")

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


def _fixed(typ: pa.DataType, values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(typ, len(values), [None, _buf(values)], null_count=0)


def _repeated_string(text: str, n: int) -> pa.Array:
    """``n`` copies of ``text`` as a string array: one tiled buffer, arange offsets."""
    raw = text.encode("utf-8")
    offsets = np.arange(n + 1, dtype=_I32) * len(raw)
    data = np.frombuffer(raw * n, dtype=np.uint8) if raw and n else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(pa.string(), n, [None, _buf(offsets), _buf(data)], null_count=0)


def to_record_batch(topic: str, partition: int, cols: Columns) -> pa.RecordBatch:
    """One fetch's records as a batch of ARROW_SCHEMA, sharing the numpy buffers of ``cols``."""
    n = len(cols)
    arrays = [
        _binary(cols.key_offsets.astype(_I32, copy=False), cols.keys, cols.key_valid),
        _binary(cols.value_offsets.astype(_I32, copy=False), cols.values),
        _repeated_string(topic, n),
        _fixed(pa.int32(), np.full(n, partition, dtype=_I32)),
        _fixed(pa.int64(), cols.offsets.astype(_I64, copy=False)),
        _fixed(pa.timestamp("us", tz="UTC"), cols.timestamps_us.astype(_I64, copy=False)),
        _fixed(pa.int32(), np.full(n, CREATE_TIME, dtype=_I32)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
