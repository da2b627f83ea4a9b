"""Write DataFrames into topics: Arrow record batches -> buffer chunks -> produce requests.

Input columns (Kafka's sink shape; other columns are ignored):

    value      binary or string, required, never null
    key        binary or string, optional; a null key is written as an empty key
    topic      string, required unless option ``topic`` is set (the option wins, as with Kafka)
    partition  integer, optional; rows with none go round-robin, one produce batch at a time
    headers    array<struct<key: string, value: binary>>, optional (Kafka's type); a null list
               is no headers, a null value a null header value; a null key or entry is refused

No Python object per row: a batch's rows are grouped by (topic, partition) with one stable
numpy argsort and one Arrow ``take``, each group's offsets and data buffers are cut into chunks
under ``maxBatchBytes`` with ``searchsorted`` over cumulative sizes, and each chunk goes to the
client's ``Producer.send_buffers`` as one batch, straight from those buffers, keys and headers
included (the headers column's list offsets and its struct's two children are the record
format's header columns already, client/sections.py). Keys are hashed by
nobody: to place rows by key, compute the column in Spark, e.g. ``pmod(crc32(key), 8)``, which
is what the Python producer's ``key_hash`` partitioner computes (zlib's CRC-32).

Delivery is at-least-once: a task acknowledged by the broker may still be retried by Spark (a
lost executor, a failed stage, a streaming batch re-run after a restart), and a produce retried
after a timeout may land twice. Nothing is rolled back on abort. Records of one task to one
partition keep their order (one request in flight per partition).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType, BinaryType, ByteType, DataType, IntegerType, LongType, ShortType, StringType, StructType,
)

from tailrace.client.producer import Producer
from tailrace.client.records import HEADER_BYTES
from tailrace.client.sections import HeaderArrays

from .errors import SchemaError
from .options import WriteOptions

FLUSH_BYTES = 64 << 20  # wait for acks after this many bytes, so a task's memory stays bounded
_TEXT = (BinaryType, StringType)
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


@dataclass
class Produced(WriterCommitMessage):
    """What one task wrote: records acknowledged (sent, for acks=none), in how many chunks."""

    records: int
    chunks: int


def check_input_schema(schema: StructType, options: WriteOptions) -> None:
    """Fail on the driver, before any task runs, when the DataFrame cannot be written."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise SchemaError(f"writing to tailrace needs a value column (binary or string): columns={list(fields)}")
    for name, kinds in (("value", _TEXT), ("key", _TEXT), ("topic", (StringType,)), ("partition", _INTEGERS)):
        if name in fields and not isinstance(fields[name], kinds):
            raise SchemaError(f"column {name} must be {'/'.join(k.__name__ for k in kinds)}: {name}={fields[name].simpleString()}")
    if options.topic is None and "topic" not in fields:
        raise SchemaError("writing to tailrace needs option topic or a topic column")
    if "headers" in fields and not _is_headers_type(fields["headers"]):
        raise SchemaError(f"column headers must be array<struct<key:string,value:binary>> (Kafka's headers): "
                          f"headers={fields['headers'].simpleString()}")


def _is_headers_type(t: DataType) -> bool:
    """Kafka's headers type, whatever the nullability of its parts."""
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    entry = t.elementType.fields
    return ([f.name for f in entry] == ["key", "value"] and isinstance(entry[0].dataType, StringType)
            and isinstance(entry[1].dataType, BinaryType))


def _binary_buffers(arr: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets [n + 1] rebased to 0, uint8 data) of a binary/string array, zero copy."""
    if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.binary())
    elif pa.types.is_string(arr.type):
        arr = arr.view(pa.binary())
    if not pa.types.is_binary(arr.type):
        raise SchemaError(f"column {name} must be binary or string, got {arr.type}")
    _validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype="<i4", count=len(arr) + 1, offset=arr.offset * 4)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def _group(batch: pa.RecordBatch, topic_of: Callable[[int], str], topic_ids: np.ndarray, parts: np.ndarray):
    """Split rows into runs of one (topic, partition): yields (topic, partition or -1, sub-batch)."""
    if len(batch) == 0:
        return
    key = topic_ids.astype(np.int64) << 32 | (parts + 1)
    if bool((key[1:] == key[:-1]).all()):
        yield topic_of(int(topic_ids[0])), int(parts[0]), batch
        return
    order = np.argsort(key, kind="stable")
    batch, key = batch.take(pa.array(order)), key[order]
    bounds = np.concatenate(([0], np.flatnonzero(key[1:] != key[:-1]) + 1, [len(key)])).tolist()
    for a, b in zip(bounds, bounds[1:]):
        yield topic_of(int(topic_ids[order[a]])), int(parts[order[a]]), batch.slice(a, b - a)


def _chunks(sizes: np.ndarray, budget: int) -> Iterator[tuple[int, int]]:
    """Cut rows into [a, b) runs whose ``sizes`` sum to at most ``budget`` (a lone row that is
    over the budget gets a run of its own: the broker will refuse it by name)."""
    cum = np.cumsum(sizes)
    a, n = 0, len(sizes)
    while a < n:
        base = int(cum[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(cum, base + budget, side="right")))
        yield a, b
        a = b


class Chunk(NamedTuple):
    """Rows for one produce request, as the buffers client/records.py encodes from."""

    values: np.ndarray  # uint8, all values back to back
    value_offsets: np.ndarray  # int32[n + 1], from 0
    keys: np.ndarray | None  # uint8, or None for a batch without keys
    key_offsets: np.ndarray | None  # int32[n + 1], from 0
    headers: HeaderArrays | None = None  # every array from 0; None when no row of the chunk has headers

    def __len__(self) -> int:
        return len(self.value_offsets) - 1

    def payload_bytes(self) -> int:
        """Bytes this chunk holds for the producer: values, keys, header keys and values."""
        n = len(self.values) + (0 if self.keys is None else len(self.keys))
        return n if self.headers is None else n + len(self.headers.keys) + len(self.headers.values)


# What a record's headers add to a batch's section (client/sections.py section_size): a header
# start per record, then per header two offsets (4 bytes each), a null flag byte, key and value.
_HEADER_START_BYTES = 4
_HEADER_ENTRY_BYTES = 4 + 4 + 1
_HEADERS_FIXED_BYTES = 4 + 4 + 4  # the extra last entry of header_starts, hkey_offsets, hvalue_offsets


class _RowHeaders(NamedTuple):
    """A group's headers column as the record format's arrays, over the Arrow buffers: offsets
    are not rebased (``keys[key_offsets[0]:]`` is the first key), chunks cut and rebase them."""

    starts: np.ndarray  # int32[n + 1], from 0: row i's headers are entries starts[i] .. starts[i + 1]
    key_offsets: np.ndarray  # int32[H + 1] into keys
    keys: np.ndarray  # uint8, UTF-8
    value_offsets: np.ndarray  # int32[H + 1] into values
    values: np.ndarray  # uint8
    valid: np.ndarray  # bool[H]: False where the value is null
    row_bytes: np.ndarray  # int64[n]: what each row's headers add to a section

    def cut(self, a: int, b: int) -> HeaderArrays | None:
        """Rows [a, b) as HeaderArrays from 0, or None when they have no headers."""
        st = self.starts[a : b + 1]
        ha, hb = int(st[0]), int(st[-1])
        if ha == hb:
            return None
        ko, vo = self.key_offsets[ha : hb + 1], self.value_offsets[ha : hb + 1]
        return HeaderArrays(st - ha, ko - ko[0], self.keys[ko[0] : ko[-1]], vo - vo[0], self.values[vo[0] : vo[-1]],
                            self.valid[ha:hb])


def _row_headers(column: pa.Array) -> _RowHeaders | None:
    """The ``headers`` column, list<struct<key, value>>, as arrays with numpy and Arrow kernels:
    no Python step per row or per header. None when no row has a header. A null list is a row
    without headers (as with Kafka's sink); a null entry or key cannot be written."""
    if pa.types.is_large_list(column.type):
        column = column.cast(pa.list_(column.type.value_field))
    if not pa.types.is_list(column.type) or not pa.types.is_struct(column.type.value_type):
        raise SchemaError(f"column headers must be a list of struct<key, value>, got {column.type}")
    n = len(column)
    counts = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    starts = np.zeros(n + 1, dtype="<i4")
    np.cumsum(counts, out=starts[1:])
    if int(starts[-1]) == 0:
        return None
    entries = column.flatten()  # the rows' entries in order: follows slicing, skips null lists' slots
    if entries.null_count:
        raise SchemaError(f"column headers has {entries.null_count} null entries; each header is a (key, value) struct")
    key, value = entries.field("key"), entries.field("value")
    if key.null_count:
        raise SchemaError(f"column headers has {key.null_count} null keys; a header key is a string, never null")
    valid = np.ones(len(value), dtype=bool) if not value.null_count else value.is_valid().to_numpy(zero_copy_only=False)
    if value.null_count:  # the record format wants a null value's range empty, which Arrow does not promise
        value = pc.fill_null(value, pa.scalar(b"", value.type))
    koffs, kdata = _binary_buffers(key, "header keys")
    voffs, vdata = _binary_buffers(value, "header values")
    entry_bytes = np.diff(koffs).astype(np.int64) + np.diff(voffs) + _HEADER_ENTRY_BYTES
    cum = np.zeros(len(entry_bytes) + 1, dtype=np.int64)
    np.cumsum(entry_bytes, out=cum[1:])
    row_bytes = cum[starts[1:]] - cum[starts[:-1]] + _HEADER_START_BYTES
    return _RowHeaders(starts, koffs, kdata, voffs, vdata, valid, row_bytes)


def chunk_rows(batch: pa.RecordBatch, max_batch_bytes: int) -> Iterator[Chunk]:
    """One group's rows cut into chunks whose encoded batch stays under ``max_batch_bytes``
    (values, keys and headers counted as client/sections.py lays them out)."""
    value = batch.column("value")
    if value.null_count:
        raise SchemaError(f"column value has {value.null_count} nulls; a record's value cannot be null")
    voffs, vdata = _binary_buffers(value, "value")
    sizes = np.diff(voffs).astype(np.int64) + 4
    kdata = koffs = None
    key = batch.column("key") if "key" in batch.schema.names else None
    if key is not None and key.null_count < len(key):
        if key.null_count:
            key = pc.fill_null(key, pa.scalar(b"", key.type) if pa.types.is_binary(key.type) else pa.scalar("", key.type))
        koffs, kdata = _binary_buffers(key, "key")
        sizes += np.diff(koffs).astype(np.int64) + 4
    budget = max_batch_bytes - HEADER_BYTES - 8 - 8  # header, the two offset arrays' extra entries, padding
    headers = _row_headers(batch.column("headers")) if "headers" in batch.schema.names else None
    if headers is not None:
        sizes += headers.row_bytes
        budget -= _HEADERS_FIXED_BYTES
    for a, b in _chunks(sizes, budget):
        vo = voffs[a : b + 1]
        ko = None if koffs is None else koffs[a : b + 1]
        yield Chunk(vdata[vo[0] : vo[-1]], vo - vo[0],
                    None if ko is None else kdata[ko[0] : ko[-1]], None if ko is None else ko - ko[0],
                    None if headers is None else headers.cut(a, b))


def chunks_of(batch: pa.RecordBatch, options: WriteOptions, partitions_for: Callable[[str], int],
              round_robin: Iterator[int]) -> Iterator[tuple[str, int, Chunk]]:
    """(topic, partition, chunk) for every produce request one input batch makes."""
    n = len(batch)
    if n == 0:
        return
    names = batch.schema.names
    if options.topic is not None:
        topics, topic_ids = [options.topic], np.zeros(n, dtype=np.int64)
    else:
        column = batch.column("topic")
        if column.null_count:
            raise SchemaError(f"column topic has {column.null_count} nulls and option topic is not set")
        encoded = pc.dictionary_encode(column)
        topics = encoded.dictionary.to_pylist()
        topic_ids = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    if "partition" in names:
        column = batch.column("partition")
        parts = column.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        parts = np.full(n, -1, dtype=np.int64)
    for topic, partition, rows in _group(batch, topics.__getitem__, topic_ids, parts):
        count = partitions_for(topic)
        if partition >= count or partition < -1:
            raise SchemaError(f"partition out of range: topic={topic!r} partition={partition} partitions={count}")
        for chunk in chunk_rows(rows, options.max_batch_bytes):
            yield topic, partition if partition >= 0 else next(round_robin) % count, chunk


def send(producer: Producer, topic: str, partition: int, chunk: Chunk) -> None:
    """One chunk as one batch, straight from its buffers (keys and headers too): no object per record."""
    producer.send_buffers(topic, chunk.values, chunk.value_offsets, partition=partition,
                          keys=chunk.keys, key_offsets=chunk.key_offsets, headers=chunk.headers)


class Producers:
    """The task's producer. The client addresses each partition's owning worker directly once
    the router has placed it (client/routes.py), and falls back to the router by itself;
    ``directProduce=false`` keeps every request on the router path.

    Producing through the router costs a Python hop: measured here, the router spent ~0.25-0.35
    us of CPU per 100-byte record on a drain of 4M records, as much as the worker that stored
    them.
    """

    def __init__(self, options: WriteOptions):
        self.options = options
        self.producer = Producer(options.bootstrap, acks=options.acks, request_timeout_ms=options.request_timeout_ms,
                                 batch_bytes=options.max_batch_bytes, direct=options.direct_produce,
                                 **dict(options.security))

    def partitions_for(self, topic: str) -> int:
        return self.producer.partitions_for(topic)

    def send(self, topic: str, partition: int, chunk: Chunk) -> None:
        send(self.producer, topic, partition, chunk)

    def flush(self) -> None:
        self.producer.flush(self.options.request_timeout_ms * 2)

    def close(self) -> None:
        self.producer.pool.close()


def produce(batches: Iterator[pa.RecordBatch], options: WriteOptions) -> Produced:
    """Executor side: write every batch, wait for the acks, report what was written."""
    from pyspark import TaskContext

    task = TaskContext.get()
    round_robin = itertools.count(task.partitionId() if task is not None else 0)
    records = chunks = unflushed = 0
    producers = Producers(options)
    try:
        for batch in batches:
            for topic, partition, chunk in chunks_of(batch, options, producers.partitions_for, round_robin):
                producers.send(topic, partition, chunk)
                n = len(chunk)
                records, chunks, unflushed = records + n, chunks + 1, unflushed + chunk.payload_bytes() + 4 * n
                if unflushed >= FLUSH_BYTES:
                    producers.flush()
                    unflushed = 0
        producers.flush()
    finally:
        producers.close()
    return Produced(records, chunks)


class TailraceArrowWriter(DataSourceArrowWriter):
    """Batch write (``df.write.format("tailrace").mode("append")``); at-least-once."""

    def __init__(self, options: WriteOptions):
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Produced:
        return produce(iterator, self.options)

    def commit(self, messages: list) -> None:
        """Nothing to commit: every record was acknowledged by the broker inside its task."""

    def abort(self, messages: list) -> None:
        """Nothing to undo: a log cannot take records back; readers may see a failed job's
        records (at-least-once)."""


class TailraceStreamArrowWriter(DataSourceStreamArrowWriter):
    """Streaming write (``writeStream.format("tailrace")``); at-least-once per micro-batch."""

    def __init__(self, options: WriteOptions):
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Produced:
        return produce(iterator, self.options)

    def commit(self, messages: list, batchId: int) -> None:
        """Nothing to commit (see TailraceArrowWriter.commit)."""

    def abort(self, messages: list, batchId: int) -> None:
        """Nothing to undo; Spark re-runs the micro-batch, which may write its records twice."""
