"""THE record-batch format: the same bytes on the wire, in the shared-memory ring and in the journal.

A batch carries ``record_count`` records of one partition. The client writes everything from
``crc`` on; the broker stamps ``base_offset``, ``append_time_us``, ``partition`` and
``topic_id`` in place when it appends, which is why those fields sit *before* the CRC-covered
part: stamping needs no CRC recompute. All integers are little-endian.

::

     0               8               16              24              32              40
     +-------+---+-+-+---------------+---------------+-------+-------+-------+-------+
     |length |mag|v|a|  base_offset  | append_time_us|  part | topic | crc   | count |
     +-------+---+-+-+---------------+---------------+-------+-------+-------+-------+
     40              48              56              64
     +---------------+-------+-------+---------------+
     |  producer_id  | bseq  | rsvd  | create_time_us|
     +---------------+-------+-------+---------------+
     64: value_offsets  int32[count + 1]   value_offsets[0] == 0, non-decreasing
         key_offsets    int32[count + 1]   only when attributes & HAS_KEYS
         values         bytes  (value_offsets[count] bytes, all values back to back)
         keys           bytes  (key_offsets[count] bytes)
     length: end of the batch; the frame that carries it is padded with zeros to a multiple of 8

     crc = CRC-32C (Castagnoli) of bytes [CRC_START, length)   (CRC_START = 36)

Why this shape: the values of a batch are one contiguous buffer with an Arrow-compatible int32
offsets array, so a consumer (the Spark bridge) builds an Arrow ``binary`` column from a fetch
reply with numpy alone, no Python object per message. Per-record timestamps are the batch's
``create_time_us`` (the producer's clock) and ``append_time_us`` (the broker's clock).

Vocabulary: an *offset* is a record's logical number in its partition; a *position* is a byte
location (in a ring or the journal); a *relative offset* is ``offset - base_offset``.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from crc32c import crc32c

from tailrace.shm.layout import FRAME_ALIGN, align_frame, align_frames

MAGIC = 0x5452  # "TR"
VERSION = 1
HAS_KEYS = 0x01

HEADER_DTYPE = np.dtype(
    [
        ("length", "<i4"),
        ("magic", "<u2"),
        ("version", "u1"),
        ("attributes", "u1"),
        ("base_offset", "<i8"),
        ("append_time_us", "<i8"),
        ("partition", "<i4"),
        ("topic_id", "<u4"),
        ("crc", "<u4"),
        ("record_count", "<i4"),
        ("producer_id", "<i8"),
        ("base_sequence", "<i4"),
        ("reserved", "<i4"),
        ("create_time_us", "<i8"),
    ]
)
HEADER_BYTES = HEADER_DTYPE.itemsize
CRC_START = HEADER_DTYPE.fields["record_count"][1]
OFFSETS_DTYPE = np.dtype("<i4")

# The same header as a struct, for reading one header without making a numpy view.
HEADER_STRUCT = struct.Struct("<iHBBqqiIIiqiiq")
HEADER_FIELDS = HEADER_DTYPE.names
_LENGTH, _MAGIC, _VERSION, _ATTRIBUTES, _CRC, _COUNT, _BASE, _PARTITION, _APPEND_TIME, _CREATE_TIME = (
    HEADER_FIELDS.index(f) for f in ("length", "magic", "version", "attributes", "crc", "record_count", "base_offset",
                                     "partition", "append_time_us", "create_time_us"))
_TWO_OFFSETS = struct.Struct("<ii")  # the offsets array of a one-record batch
assert HEADER_BYTES == 64 == HEADER_STRUCT.size, HEADER_BYTES
assert HEADER_DTYPE.fields["crc"][1] == 32 and CRC_START == 36
assert HEADER_DTYPE.fields["base_offset"][1] == 8
assert HEADER_BYTES % FRAME_ALIGN == 0

# Single fields, for code that reads or writes one without a numpy view (the broker's append path,
# recovery, same-host readers). Positions derive from HEADER_DTYPE, never retyped.
LENGTH = struct.Struct("<i")  # at LENGTH_AT: the batch's own length (its frame is align8 of it)
LENGTH_AT = HEADER_DTYPE.fields["length"][1]
STAMP = struct.Struct("<qqiI")  # what the broker stamps at append: base_offset, append_time_us, partition, topic_id
STAMP_AT = HEADER_DTYPE.fields["base_offset"][1]
BASE_OFFSET = struct.Struct("<q")  # at STAMP_AT
CRC = struct.Struct("<I")  # at CRC_AT: CRC-32C of bytes [CRC_START, length)
CRC_AT = HEADER_DTYPE.fields["crc"][1]
COUNT = struct.Struct("<i")  # record_count, at COUNT_AT
COUNT_AT = HEADER_DTYPE.fields["record_count"][1]
IDEMPOTENCE = struct.Struct("<qi")  # producer_id, base_sequence, at IDEMPOTENCE_AT
IDEMPOTENCE_AT = HEADER_DTYPE.fields["producer_id"][1]
assert LENGTH_AT == 0 and STAMP_AT == 8 and COUNT_AT == CRC_START == 36 and IDEMPOTENCE_AT == 40
assert STAMP_AT + STAMP.size == HEADER_DTYPE.fields["crc"][1]  # the stamp ends where the CRC'd part begins
assert HEADER_DTYPE.fields["base_sequence"][1] == IDEMPOTENCE_AT + 8
assert [HEADER_DTYPE.fields[f][0].str for f in ("base_offset", "append_time_us", "partition", "topic_id")] == [
    "<i8", "<i8", "<i4", "<u4"]  # STAMP's "<qqiI", field by field

# Largest count a header may claim before we even look at the body (keeps a lying count from
# making us allocate): one record needs at least one int32 offset.
MAX_RECORDS_PER_BATCH = 1 << 24


align8 = align_frame  # a frame's size for a batch of n bytes (the ring's FRAME_ALIGN)
align8_array = align_frames  # the same over an array of lengths, as int64


def now_us() -> int:
    return time.time_ns() // 1000


class BatchError(ValueError):
    """Raised when bytes do not form a valid batch; ``reason`` is a short machine word."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _lengths_to_offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.empty(len(lengths) + 1, dtype=OFFSETS_DTYPE)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def encode_batch(
    values: Sequence[bytes],
    keys: Sequence[bytes] | None = None,
    *,
    create_time_us: int | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Encode a list of values (and optional keys of the same length) as one padded batch frame."""
    n = len(values)
    if n == 1 and keys is None:  # a single-message send: the same bytes without numpy
        return _encode_one(values[0], create_time_us, producer_id, base_sequence)
    value_lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    value_bytes = b"".join(values)
    key_lengths = key_bytes = None
    if keys is not None:
        if len(keys) != n:
            raise ValueError(f"keys and values differ in length: keys={len(keys)} values={n}")
        key_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
        key_bytes = b"".join(keys)
    return encode_batch_buffers(
        value_bytes,
        _lengths_to_offsets(value_lengths),
        key_bytes,
        None if key_lengths is None else _lengths_to_offsets(key_lengths),
        create_time_us=create_time_us,
        producer_id=producer_id,
        base_sequence=base_sequence,
    )


def encode_batch_buffers(
    values: bytes | memoryview | np.ndarray,
    value_offsets: np.ndarray,
    keys: bytes | memoryview | np.ndarray | None = None,
    key_offsets: np.ndarray | None = None,
    *,
    create_time_us: int | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Encode a batch from one values buffer plus an offsets array (count + 1 entries, from 0).

    This is the zero-Python-per-message path: the caller already holds its values back to back.
    """
    value_offsets = np.asarray(value_offsets, dtype=OFFSETS_DTYPE)
    n = len(value_offsets) - 1
    if n < 1:
        raise ValueError(f"a batch needs at least one record: count={n}")
    values_mv = memoryview(values).cast("B")
    if int(value_offsets[0]) != 0 or int(value_offsets[-1]) != values_mv.nbytes:
        raise ValueError(
            f"value_offsets must start at 0 and end at len(values): "
            f"first={int(value_offsets[0])} last={int(value_offsets[-1])} len={values_mv.nbytes}"
        )
    has_keys = keys is not None
    parts_len = HEADER_BYTES + 4 * (n + 1) + values_mv.nbytes
    if has_keys:
        key_offsets = np.asarray(key_offsets, dtype=OFFSETS_DTYPE)
        keys_mv = memoryview(keys).cast("B")
        if len(key_offsets) != n + 1 or int(key_offsets[-1]) != keys_mv.nbytes:
            raise ValueError("key_offsets must have count + 1 entries ending at len(keys)")
        parts_len += 4 * (n + 1) + keys_mv.nbytes
    length = parts_len
    buf = bytearray(align8(length))
    _pack_header(buf, length, HAS_KEYS if has_keys else 0, n, create_time_us, producer_id, base_sequence)
    pos = HEADER_BYTES
    buf[pos : pos + 4 * (n + 1)] = value_offsets.tobytes()
    pos += 4 * (n + 1)
    if has_keys:
        buf[pos : pos + 4 * (n + 1)] = key_offsets.tobytes()
        pos += 4 * (n + 1)
    buf[pos : pos + values_mv.nbytes] = values_mv
    pos += values_mv.nbytes
    if has_keys:
        buf[pos : pos + keys_mv.nbytes] = keys_mv
    CRC.pack_into(buf, CRC_AT, crc32c(memoryview(buf)[CRC_START:length]))
    return bytes(buf)


def _pack_header(buf: bytearray, length: int, attributes: int, n: int, create_time_us: int | None, producer_id: int,
                 base_sequence: int) -> None:
    """A new batch's header into ``buf`` (one struct pack): base offset and partition -1 until
    the broker stamps them, append time and topic id 0, CRC 0 until computed."""
    HEADER_STRUCT.pack_into(buf, 0, length, MAGIC, VERSION, attributes, -1, 0, -1, 0, 0, n, producer_id, base_sequence, 0,
                            now_us() if create_time_us is None else create_time_us)


def _encode_one(value: bytes, create_time_us: int | None, producer_id: int, base_sequence: int) -> bytes:
    """``encode_batch([value])`` in plain Python: header, the offsets [0, len], the value, CRC."""
    if type(value) is not bytes:  # any bytes-like: its length in bytes, whatever its item size
        value = memoryview(value).cast("B")
    size = len(value)
    length = HEADER_BYTES + 8 + size
    buf = bytearray(align8(length))
    _pack_header(buf, length, 0, 1, create_time_us, producer_id, base_sequence)
    _TWO_OFFSETS.pack_into(buf, HEADER_BYTES, 0, size)
    buf[HEADER_BYTES + 8 : length] = value
    CRC.pack_into(buf, CRC_AT, crc32c(memoryview(buf)[CRC_START:length]))
    return bytes(buf)


def restamp(frame: bytes, producer_id: int, base_sequence: int) -> bytes:
    """``frame`` with a new producer id and base sequence, its CRC computed again (one C pass
    over the batch): the producer's way past a sequence gap, when a batch before it failed for
    good and later ones were already encoded (client/producer.py ``_restart_sequence``)."""
    buf = bytearray(frame)
    length = LENGTH.unpack_from(buf, LENGTH_AT)[0]
    IDEMPOTENCE.pack_into(buf, IDEMPOTENCE_AT, producer_id, base_sequence)
    CRC.pack_into(buf, CRC_AT, crc32c(memoryview(buf)[CRC_START:length]))
    return bytes(buf)


class Header(dict):
    """One batch header as plain ints (keys are HEADER_DTYPE's field names)."""


def read_header(buf, pos: int = 0) -> Header:
    return Header(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(buf, pos)))


def validate_frame(buf, pos: int, end: int, max_batch_bytes: int) -> tuple[int, int]:
    """Check the batch starting at ``pos`` (structure and CRC); return (padded frame size, count).

    Raises BatchError with a reason of ``malformed``, ``too_large`` or ``crc``. Reads at most
    the bytes in ``[pos, end)``; never trusts a length or count before bounding it.
    """
    avail = end - pos
    if avail < HEADER_BYTES:
        raise BatchError("malformed", f"batch header needs {HEADER_BYTES} bytes, got {avail}")
    h = HEADER_STRUCT.unpack_from(buf, pos)  # a tuple: this runs once per produce request
    length, magic, version, attributes, n = h[_LENGTH], h[_MAGIC], h[_VERSION], h[_ATTRIBUTES], h[_COUNT]
    if magic != MAGIC:
        raise BatchError("malformed", f"bad batch magic: magic={magic:#x} expected={MAGIC:#x}")
    if version != VERSION:
        raise BatchError("malformed", f"unsupported batch version: version={version} supported={VERSION}")
    if length > max_batch_bytes:
        raise BatchError("too_large", f"batch of {length} bytes over the limit of {max_batch_bytes}")
    keyed = bool(attributes & HAS_KEYS)
    if n < 1 or n > MAX_RECORDS_PER_BATCH:
        raise BatchError("malformed", f"record_count out of range: record_count={n}")
    arrays = 4 * (n + 1) * (2 if keyed else 1)
    if length < HEADER_BYTES + arrays or align8(length) > avail:
        raise BatchError(
            "malformed", f"batch length lies: length={length} count={n} frame bytes available={avail}"
        )
    mv = memoryview(buf)
    if crc32c(mv[pos + CRC_START : pos + length]) != h[_CRC]:
        raise BatchError("crc", f"CRC-32C mismatch in batch of {n} records at byte {pos}")
    body = length - HEADER_BYTES - arrays
    at = pos + HEADER_BYTES
    if n == 1:  # one record (the single-message produce): two struct reads instead of numpy
        v0, total = _TWO_OFFSETS.unpack_from(buf, at)
        k0 = k1 = 0
        if keyed:
            k0, k1 = _TWO_OFFSETS.unpack_from(buf, at + 8)
        if k0 != 0 or k1 < 0:
            raise BatchError("malformed", "key_offsets must start at 0 and never decrease")
        if v0 != 0 or total < 0 or total + k1 != body:
            raise BatchError("malformed", "value_offsets must start at 0, never decrease and match the body")
        return align8(length), n
    voffs = np.frombuffer(buf, dtype=OFFSETS_DTYPE, count=n + 1, offset=at)
    total = int(voffs[-1])
    if keyed:
        koffs = np.frombuffer(buf, dtype=OFFSETS_DTYPE, count=n + 1, offset=at + 4 * (n + 1))
        total += int(koffs[-1])
        if koffs[0] != 0 or bool(np.any(koffs[1:] < koffs[:-1])):
            raise BatchError("malformed", "key_offsets must start at 0 and never decrease")
    if voffs[0] != 0 or total != body or bool(np.any(voffs[1:] < voffs[:-1])):
        raise BatchError("malformed", "value_offsets must start at 0, never decrease and match the body")
    return align8(length), n


@dataclass(slots=True)
class BatchView:
    """A decoded view of one batch inside a larger buffer (no copies). (Not frozen: a frozen
    dataclass's __init__ costs ~3 us, paid once per batch read by a tailing consumer.)"""

    base_offset: int
    record_count: int
    partition: int
    append_time_us: int
    create_time_us: int
    value_offsets: np.ndarray  # int32[count + 1], starts at 0
    values: memoryview
    key_offsets: np.ndarray | None
    keys: memoryview | None

    def value(self, i: int) -> bytes:
        return bytes(self.values[self.value_offsets[i] : self.value_offsets[i + 1]])

    def key(self, i: int) -> bytes | None:
        if self.key_offsets is None:
            return None
        return bytes(self.keys[self.key_offsets[i] : self.key_offsets[i + 1]])


def iter_batches(buf) -> list[BatchView]:
    """Split a buffer of back-to-back padded batches (a fetch reply body) into views.

    One Python step per batch, none per record. Trusts the broker (no CRC check here).
    """
    mv = memoryview(buf).cast("B")
    views = []
    pos, end = 0, mv.nbytes
    while pos + HEADER_BYTES <= end:
        h = HEADER_STRUCT.unpack_from(mv, pos)  # a tuple, not a Header dict: once per batch read
        length = h[_LENGTH]
        if length < HEADER_BYTES:
            break
        n = h[_COUNT]
        keyed = bool(h[_ATTRIBUTES] & HAS_KEYS)
        arr = pos + HEADER_BYTES
        voffs = np.frombuffer(mv, dtype=OFFSETS_DTYPE, count=n + 1, offset=arr)
        arr += 4 * (n + 1)
        koffs = None
        if keyed:
            koffs = np.frombuffer(mv, dtype=OFFSETS_DTYPE, count=n + 1, offset=arr)
            arr += 4 * (n + 1)
        vend = arr + int(voffs[-1])
        values = mv[arr:vend]
        keys = mv[vend : vend + int(koffs[-1])] if keyed else None
        views.append(BatchView(h[_BASE], n, h[_PARTITION], h[_APPEND_TIME], h[_CREATE_TIME], voffs, values, koffs, keys))
        pos += align8(length)
    return views


@dataclass(slots=True)
class Columns:
    """Records of many batches as flat columns: what Arrow's binary arrays are made of. (Not
    frozen: a frozen dataclass's __init__ is one object.__setattr__ per field, paid per partition
    in every poll of a tailing consumer.)"""

    offsets: np.ndarray  # int64[n]: record offsets
    timestamps_us: np.ndarray  # int64[n]: producer create time of each record's batch
    value_offsets: np.ndarray  # int32[n + 1], from 0
    values: np.ndarray  # uint8[value_offsets[-1]]
    key_offsets: np.ndarray  # int32[n + 1]; all-equal runs where a batch had no keys
    keys: np.ndarray  # uint8
    key_valid: np.ndarray  # bool[n]: False where the batch had no keys (null key)

    def __len__(self) -> int:
        return len(self.offsets)


_INT32_MAX = int(np.iinfo(np.int32).max)


def batches_to_columns(views: list[BatchView], start_offset: int = 0, end_offset: int | None = None) -> Columns:
    """Flatten batch views to columns, keeping records with start_offset <= offset < end_offset.

    numpy over the whole set; the only Python steps are one per batch.
    """
    keep = []
    for v in views:
        lo = max(start_offset - v.base_offset, 0)
        hi = v.record_count if end_offset is None else min(end_offset - v.base_offset, v.record_count)
        if hi > lo:
            keep.append((v, lo, hi))
    if not keep:
        z = np.zeros(0, dtype=np.int64)
        return Columns(z, z, np.zeros(1, OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(1, OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(0, bool))
    if len(keep) == 1:
        return _one_batch_columns(*keep[0])
    return _many_batch_columns(keep)


def _one_batch_columns(v: BatchView, lo: int, hi: int) -> Columns:
    """``batches_to_columns`` of one batch (a tailing read): the same columns in a third of the
    numpy calls. Values and keys are copied, as in the general case, so the columns outlive
    the buffer they were read from."""
    n = hi - lo
    vo = v.value_offsets[lo : hi + 1]
    keyed = v.key_offsets is not None
    if keyed:
        ko = v.key_offsets[lo : hi + 1]
        key_offsets, keys = ko - ko[0], np.frombuffer(v.keys, dtype=np.uint8)[ko[0] : ko[-1]].copy()
        key_valid = np.ones(n, dtype=bool)
    else:
        key_offsets, keys, key_valid = np.zeros(n + 1, dtype=OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(n, dtype=bool)
    timestamps = np.empty(n, dtype=np.int64)
    timestamps.fill(v.create_time_us)  # np.full is a Python function around the same two calls
    return Columns(
        offsets=np.arange(v.base_offset + lo, v.base_offset + hi, dtype=np.int64),
        timestamps_us=timestamps,
        value_offsets=vo - vo[0],
        values=np.frombuffer(v.values, dtype=np.uint8)[vo[0] : vo[-1]].copy(),
        key_offsets=key_offsets,
        keys=keys,
        key_valid=key_valid,
    )


def _many_batch_columns(keep: list[tuple[BatchView, int, int]]) -> Columns:
    """The general case: one numpy step per batch for each column piece (shifted as it is cut,
    so joining the pieces is one concatenate), then one step per column. Batches without keys
    (the common case) add no key piece: with none keyed, the key columns are made at once."""
    vpieces, kpieces, vbufs, kbufs, counts, bases, times, keyed = [], [], [], [], [], [], [], []
    vshift = kshift = 0  # bytes of values / keys taken so far
    for v, lo, hi in keep:
        vo = v.value_offsets[lo : hi + 1]
        v0, v1 = int(vo[0]), int(vo[-1])
        vpieces.append(vo[1:] + (vshift - v0))  # int32: exact while the total fits (checked below)
        vbufs.append(np.frombuffer(v.values, dtype=np.uint8)[v0:v1])
        vshift += v1 - v0
        if v.key_offsets is not None:
            if not kbufs:  # the first keyed batch: the unkeyed ones before it had empty keys
                kpieces = [np.zeros(c, dtype=OFFSETS_DTYPE) for c in counts]
            ko = v.key_offsets[lo : hi + 1]
            k0, k1 = int(ko[0]), int(ko[-1])
            kpieces.append(ko[1:] + (kshift - k0))
            kbufs.append(np.frombuffer(v.keys, dtype=np.uint8)[k0:k1])
            kshift += k1 - k0
        elif kbufs:
            kpieces.append(np.full(hi - lo, kshift, dtype=OFFSETS_DTYPE))
        counts.append(hi - lo)
        bases.append(v.base_offset + lo)
        times.append(v.create_time_us)
        keyed.append(v.key_offsets is not None)
    if vshift > _INT32_MAX or kshift > _INT32_MAX:
        raise OverflowError("more than 2 GiB of values in one column set")
    counts_a = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts_a)
    n = int(ends[-1])
    offsets = np.repeat(np.asarray(bases, dtype=np.int64) - (ends - counts_a), counts_a)
    offsets += np.arange(n, dtype=np.int64)
    value_offsets = np.empty(n + 1, dtype=OFFSETS_DTYPE)
    value_offsets[0] = 0
    np.concatenate(vpieces, out=value_offsets[1:])
    if kbufs:
        key_offsets = np.empty(n + 1, dtype=OFFSETS_DTYPE)
        key_offsets[0] = 0
        np.concatenate(kpieces, out=key_offsets[1:])
        keys, key_valid = np.concatenate(kbufs), np.repeat(np.asarray(keyed, dtype=bool), counts_a)
    else:
        key_offsets, keys, key_valid = np.zeros(n + 1, dtype=OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(n, bool)
    return Columns(
        offsets=offsets,
        timestamps_us=np.repeat(np.asarray(times, dtype=np.int64), counts_a),
        value_offsets=value_offsets,
        values=np.concatenate(vbufs),
        key_offsets=key_offsets,
        keys=keys,
        key_valid=key_valid,
    )
