"""THE record-batch format: the same bytes on the wire, in the shared-memory ring and in the journal.

A batch carries ``record_count`` records of one partition. The client writes everything the CRC
covers; the broker stamps ``base_offset``, ``append_time_us``, ``partition`` and ``topic_id`` (and,
in version 2, the flags byte, ``leader_epoch`` and ``max_time_us``) in place when it appends: those
fields lie outside the CRC-covered bytes, so stamping needs no CRC recompute. All integers are
little-endian. docs/FORMAT.md section 1 is the byte-by-byte description.

Version 2 (what new batches are), an 80-byte header::

     0       4   6 7 8               16              24      28      32      36      40
     +-------+---+-+-+---------------+---------------+-------+-------+-------+-------+
     |length |mag|v|f|  base_offset  |append_time_us | part  | topic | crc   | count |
     +-------+---+-+-+---------------+---------------+-------+-------+-------+-------+
     40              48      52  54  56              64      68      72              80
     +---------------+-------+---+---+---------------+-------+-------+---------------+
     |  producer_id  | bseq  |pep|att| base_time_us  |rec_len|l_epoch|  max_time_us  |
     +---------------+-------+---+---+---------------+-------+-------+---------------+
     80: the record section (client/sections.py), compressed as one block when att & 7 != 0
     crc = CRC-32C of bytes [36, 68) continued over [80, length)

Version 1 (still read and stored, never written by this client unless asked): a 64-byte header
whose bytes 0..51 mean the same, byte 7 is the attributes (``HAS_KEYS``), 52..55 reserved, 56..63
the batch's one create time; its body is a v2 section without times or headers, uncompressed;
crc = CRC-32C of bytes [36, length).

Why this shape: the values of a batch are one contiguous buffer with an Arrow-compatible int32
offsets array, so a consumer (the Spark bridge) builds Arrow columns from a fetch reply with
numpy alone, no Python object per message; headers are columns of the same kind.

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

from . import codecs
from .columns import CREATE_TIME, LOG_APPEND_TIME, OFFSETS_DTYPE, Columns, batches_to_columns  # noqa: F401 (re-exported)
from .sections import (A_HEADERS, A_KEYS, A_TIMES, HeaderArrays, SectionError, headers_from_lists, parse_section,
                       section_size, write_section)

MAGIC = 0x5452  # "TR"
VERSION_1, VERSION_2 = 1, 2
VERSION = VERSION_2  # what encode_batch writes
VERSIONS = (VERSION_1, VERSION_2)
HAS_KEYS = 0x01  # v1's attribute byte (byte 7)

# Version 1's header; its bytes 0..51 are every version's (the *prefix* one-field readers use).
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
HEADER_V2_DTYPE = np.dtype(
    HEADER_DTYPE.descr[:3]  # length, magic, version: every version's
    + [("flags", "u1")]  # v1's attributes byte, the broker's in v2
    + HEADER_DTYPE.descr[4:12]  # base_offset .. base_sequence: every version's
    + [
        ("producer_epoch", "<i2"),
        ("attributes", "<u2"),
        ("base_time_us", "<i8"),
        ("records_bytes", "<i4"),
        ("leader_epoch", "<i4"),
        ("max_time_us", "<i8"),
    ]
)
HEADER_V1_BYTES = HEADER_DTYPE.itemsize  # 64
HEADER_V2_BYTES = HEADER_V2_DTYPE.itemsize  # 80
PREFIX_BYTES = HEADER_V1_BYTES  # every version's header is at least this long; its shared fields lie within
HEADER_BYTES = HEADER_V2_BYTES  # a new batch's header
CRC_START = HEADER_DTYPE.fields["record_count"][1]
CRC_GAP = (HEADER_V2_DTYPE.fields["leader_epoch"][1], HEADER_V2_BYTES)  # v2: bytes [68, 80) are stamped, not CRC'd

# The same headers as structs, for reading one without making a numpy view.
HEADER_STRUCT = struct.Struct("<iHBBqqiIIiqiiq")
HEADER_V2_STRUCT = struct.Struct("<iHBBqqiIIiqihHqiiq")
HEADER_FIELDS = HEADER_DTYPE.names
HEADER_V2_FIELDS = HEADER_V2_DTYPE.names
_LENGTH, _MAGIC, _VERSION, _ATTRIBUTES, _CRC, _COUNT, _BASE, _PARTITION, _APPEND_TIME, _CREATE_TIME = (
    HEADER_FIELDS.index(f) for f in ("length", "magic", "version", "attributes", "crc", "record_count", "base_offset",
                                     "partition", "append_time_us", "create_time_us"))
_FLAGS, _PEPOCH, _ATTRS2, _BASE_TIME, _REC_BYTES, _LEPOCH, _MAX_TIME, _PID = (
    HEADER_V2_FIELDS.index(f) for f in ("flags", "producer_epoch", "attributes", "base_time_us", "records_bytes",
                                        "leader_epoch", "max_time_us", "producer_id"))
_TWO_OFFSETS = struct.Struct("<ii")  # the offsets array of a one-record batch
assert HEADER_V1_BYTES == 64 == HEADER_STRUCT.size and HEADER_V2_BYTES == 80 == HEADER_V2_STRUCT.size
assert HEADER_DTYPE.fields["crc"][1] == 32 and CRC_START == 36 and CRC_GAP == (68, 80)
assert all(HEADER_DTYPE.fields[f] == HEADER_V2_DTYPE.fields[f] for f in HEADER_FIELDS[:12] if f != "attributes")
assert HEADER_V2_DTYPE.fields["base_time_us"][1] == HEADER_DTYPE.fields["create_time_us"][1] == 56
assert HEADER_BYTES % FRAME_ALIGN == 0 and PREFIX_BYTES % FRAME_ALIGN == 0

# Single fields, for code that reads or writes one without a numpy view (the broker's append path,
# recovery, same-host readers). Positions derive from the dtypes, never retyped; the same in
# every version.
LENGTH = struct.Struct("<i")  # at LENGTH_AT: the batch's own length (its frame is align8 of it)
LENGTH_AT = HEADER_DTYPE.fields["length"][1]
VERSION_AT = HEADER_DTYPE.fields["version"][1]
FLAGS_AT = HEADER_V2_DTYPE.fields["flags"][1]  # v2: the broker's flags byte
F_LOG_APPEND_TIME = 0x01  # flags: the records' timestamp is the append time (the topic's type at append)
STAMP = struct.Struct("<qqiI")  # what the broker stamps at append: base_offset, append_time_us, partition, topic_id
STAMP_AT = HEADER_DTYPE.fields["base_offset"][1]
STAMP_V2 = struct.Struct("<iq")  # v2's other stamp: leader_epoch, max_time_us
STAMP_V2_AT = HEADER_V2_DTYPE.fields["leader_epoch"][1]
BASE_OFFSET = struct.Struct("<q")  # at STAMP_AT
CRC = struct.Struct("<I")  # at CRC_AT
CRC_AT = HEADER_DTYPE.fields["crc"][1]
COUNT = struct.Struct("<i")  # record_count, at COUNT_AT
COUNT_AT = HEADER_DTYPE.fields["record_count"][1]
IDEMPOTENCE = struct.Struct("<qi")  # producer_id, base_sequence, at IDEMPOTENCE_AT
IDEMPOTENCE_AT = HEADER_DTYPE.fields["producer_id"][1]
assert LENGTH_AT == 0 and STAMP_AT == 8 and COUNT_AT == CRC_START == 36 and IDEMPOTENCE_AT == 40 and VERSION_AT == 6
assert STAMP_AT + STAMP.size == HEADER_DTYPE.fields["crc"][1]  # the stamp ends where the CRC'd part begins
assert STAMP_V2_AT + STAMP_V2.size == HEADER_V2_BYTES
assert HEADER_DTYPE.fields["base_sequence"][1] == IDEMPOTENCE_AT + 8
assert [HEADER_DTYPE.fields[f][0].str for f in ("base_offset", "append_time_us", "partition", "topic_id")] == [
    "<i8", "<i8", "<i4", "<u4"]  # STAMP's "<qqiI", field by field

# v2 attributes (u16 at 54, CRC-covered): codec in bits 0-2; bit 3 reserved (Kafka's timestamp
# type: ours is the broker's flags byte); TRANSACTIONAL and CONTROL (Kafka's bits 4, 5) reserved
# for transactions: refused until served; the section's parts in bits 8-10.
A_CODEC = codecs.CODEC_MASK
A_TRANSACTIONAL, A_CONTROL = 0x0010, 0x0020
A_SUPPORTED = A_CODEC | A_KEYS | A_HEADERS | A_TIMES

# Largest count a header may claim before we even look at the body (keeps a lying count from
# making us allocate): one record needs at least one int32 offset.
MAX_RECORDS_PER_BATCH = 1 << 24

align8 = align_frame  # a frame's size for a batch of n bytes (the ring's FRAME_ALIGN)
align8_array = align_frames  # the same over an array of lengths, as int64


def now_us() -> int:
    return time.time_ns() // 1000


class BatchError(ValueError):
    """Raised when bytes do not form a valid batch; ``reason`` is a short machine word
    (``malformed``, ``too_large``, ``crc``)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _offsets(lengths) -> np.ndarray:
    out = np.empty(len(lengths) + 1, dtype=OFFSETS_DTYPE)
    out[0] = 0
    np.cumsum(lengths, out=out[1:])
    return out


def batch_crc(buf, pos: int, length: int, version: int) -> int:
    """The CRC a batch at ``pos`` must carry (v2 skips its stamped bytes [68, 80))."""
    mv = memoryview(buf)
    if version == VERSION_1:
        return crc32c(mv[pos + CRC_START : pos + length])
    return crc32c(mv[pos + HEADER_V2_BYTES : pos + length], crc32c(mv[pos + CRC_START : pos + CRC_GAP[0]]))


# --- encoding ------------------------------------------------------------------------------------
def encode_batch(
    values: Sequence[bytes],
    keys: Sequence[bytes] | None = None,
    *,
    headers: Sequence | None = None,
    timestamps_us: Sequence[int] | np.ndarray | None = None,
    create_time_us: int | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
    producer_epoch: int = -1,
    compression: int = codecs.NONE,
    compression_level: int | None = None,
    version: int = VERSION,
) -> bytes:
    """Encode values (and optional keys, per-record header lists, per-record create times in
    microseconds) as one padded batch frame. ``compression`` is a codec id (client/codecs.py)."""
    n = len(values)
    if n == 1 and keys is None and headers is None and timestamps_us is None and not compression and version == VERSION:
        return _encode_one(values[0], create_time_us, producer_id, base_sequence, producer_epoch)
    value_lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    key_offsets = key_bytes = None
    if keys is not None:
        if len(keys) != n:
            raise ValueError(f"keys and values differ in length: keys={len(keys)} values={n}")
        key_offsets = _offsets(np.fromiter(map(len, keys), dtype=np.int64, count=n))
        key_bytes = b"".join(keys)
    return encode_batch_buffers(
        b"".join(values), _offsets(value_lengths), key_bytes, key_offsets,
        headers=None if headers is None else headers_from_lists(headers, n), timestamps_us=timestamps_us,
        create_time_us=create_time_us, producer_id=producer_id, base_sequence=base_sequence,
        producer_epoch=producer_epoch, compression=compression, compression_level=compression_level, version=version,
    )


def encode_batch_buffers(
    values: bytes | memoryview | np.ndarray,
    value_offsets: np.ndarray,
    keys: bytes | memoryview | np.ndarray | None = None,
    key_offsets: np.ndarray | None = None,
    *,
    headers: HeaderArrays | None = None,
    timestamps_us: Sequence[int] | np.ndarray | None = None,
    create_time_us: int | None = None,
    producer_id: int = -1,
    base_sequence: int = -1,
    producer_epoch: int = -1,
    compression: int = codecs.NONE,
    compression_level: int | None = None,
    version: int = VERSION,
) -> bytes:
    """Encode a batch from one values buffer plus an offsets array (count + 1 entries, from 0),
    and, as columns, keys, headers (``HeaderArrays``) and per-record create times.

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
    keys_mv = None
    if keys is not None:
        key_offsets = np.asarray(key_offsets, dtype=OFFSETS_DTYPE)
        keys_mv = memoryview(keys).cast("B")
        if len(key_offsets) != n + 1 or int(key_offsets[-1]) != keys_mv.nbytes:
            raise ValueError("key_offsets must have count + 1 entries ending at len(keys)")
    if version == VERSION_1:
        if headers is not None or timestamps_us is not None or compression:
            raise ValueError("a version 1 batch has no headers, per-record times or compression")
        return _encode_v1(values_mv, value_offsets, keys_mv, key_offsets, n, create_time_us, producer_id, base_sequence)
    if version != VERSION_2:
        raise ValueError(f"batch version {version}: one of {VERSIONS}")
    deltas = None
    if timestamps_us is not None:
        ts = np.asarray(timestamps_us, dtype=np.int64)
        if len(ts) != n:
            raise ValueError(f"timestamps and values differ in length: timestamps={len(ts)} values={n}")
        create_time_us = int(ts[0])
        deltas = ts - create_time_us
        if not deltas.any():
            deltas = None  # one time for all: as cheap as a batch without
    if headers is not None and len(headers.starts) != n + 1:
        raise ValueError(f"header starts must have count + 1 entries: {len(headers.starts)} for {n} records")
    size = section_size(n, values_mv.nbytes, None if keys_mv is None else keys_mv.nbytes, headers, deltas is not None)
    codec = compression & A_CODEC
    if compression != codec:
        raise ValueError(f"compression={compression}: a codec id, one of {sorted(codecs.NAMES)}")
    if not codec:
        buf = bytearray(align8(HEADER_V2_BYTES + size))
        attrs = write_section(memoryview(buf)[HEADER_V2_BYTES : HEADER_V2_BYTES + size], n, deltas, value_offsets,
                              values_mv, key_offsets, keys_mv, headers)
        length = HEADER_V2_BYTES + size
    else:
        section = bytearray(size)
        attrs = write_section(memoryview(section), n, deltas, value_offsets, values_mv, key_offsets, keys_mv, headers)
        packed = codecs.compress(codec, section, compression_level)
        length = HEADER_V2_BYTES + packed.nbytes
        buf = bytearray(align8(length))
        buf[HEADER_V2_BYTES:length] = packed
    _pack_v2(buf, length, attrs | codec, n, size, create_time_us, producer_id, base_sequence, producer_epoch)
    return bytes(buf)


def _pack_v2(buf: bytearray, length: int, attrs: int, n: int, records_bytes: int, create_time_us: int | None,
             producer_id: int, base_sequence: int, producer_epoch: int) -> None:
    """A new v2 batch's header and CRC into ``buf`` (section already in place): base offset and
    partition -1 until the broker stamps them; append time, topic id, flags, leader epoch 0."""
    t = now_us() if create_time_us is None else create_time_us
    HEADER_V2_STRUCT.pack_into(buf, 0, length, MAGIC, VERSION_2, 0, -1, 0, -1, 0, 0, n, producer_id, base_sequence,
                               producer_epoch, attrs, t, records_bytes, 0, t)
    CRC.pack_into(buf, CRC_AT, batch_crc(buf, 0, length, VERSION_2))


def _encode_one(value: bytes, create_time_us: int | None, producer_id: int, base_sequence: int,
                producer_epoch: int) -> bytes:
    """``encode_batch([value])`` in plain Python: header, the offsets [0, len], the value, CRC."""
    if type(value) is not bytes:  # any bytes-like: its length in bytes, whatever its item size
        value = memoryview(value).cast("B")
    size = len(value)
    length = HEADER_V2_BYTES + 8 + size
    buf = bytearray(align8(length))
    _TWO_OFFSETS.pack_into(buf, HEADER_V2_BYTES, 0, size)
    buf[HEADER_V2_BYTES + 8 : length] = value
    _pack_v2(buf, length, 0, 1, 8 + size, create_time_us, producer_id, base_sequence, producer_epoch)
    return bytes(buf)


def _encode_v1(values_mv, value_offsets, keys_mv, key_offsets, n, create_time_us, producer_id, base_sequence) -> bytes:
    """The version 1 writer, kept for the upgrade tests and v1-speaking peers (FORMAT.md 1.7)."""
    size = section_size(n, values_mv.nbytes, None if keys_mv is None else keys_mv.nbytes, None, False)
    length = HEADER_V1_BYTES + size
    buf = bytearray(align8(length))
    write_section(memoryview(buf)[HEADER_V1_BYTES:length], n, None, value_offsets, values_mv, key_offsets, keys_mv, None)
    HEADER_STRUCT.pack_into(buf, 0, length, MAGIC, VERSION_1, HAS_KEYS if keys_mv is not None else 0, -1, 0, -1, 0, 0,
                            n, producer_id, base_sequence, 0, now_us() if create_time_us is None else create_time_us)
    CRC.pack_into(buf, CRC_AT, batch_crc(buf, 0, length, VERSION_1))
    return bytes(buf)


def restamp(frame: bytes, producer_id: int, base_sequence: int) -> bytes:
    """``frame`` with a new producer id and base sequence, its CRC computed again (one C pass
    over the batch): the producer's way past a sequence gap, when a batch before it failed for
    good and later ones were already encoded (client/producer.py ``_restart_sequence``)."""
    buf = bytearray(frame)
    length = LENGTH.unpack_from(buf, LENGTH_AT)[0]
    IDEMPOTENCE.pack_into(buf, IDEMPOTENCE_AT, producer_id, base_sequence)
    CRC.pack_into(buf, CRC_AT, batch_crc(buf, 0, length, buf[VERSION_AT]))
    return bytes(buf)


class Header(dict):
    """One batch header as plain ints (keys are the version's dtype field names)."""


def read_header(buf, pos: int = 0) -> Header:
    """The header at ``pos``: v2's fields for a v2 batch with its 80 bytes there, else v1's
    names over the shared 64-byte prefix (what recovery and the index checks read)."""
    mv = memoryview(buf)
    if mv[pos + VERSION_AT] == VERSION_2 and len(mv) - pos >= HEADER_V2_BYTES:
        return Header(zip(HEADER_V2_FIELDS, HEADER_V2_STRUCT.unpack_from(buf, pos)))
    return Header(zip(HEADER_FIELDS, HEADER_STRUCT.unpack_from(buf, pos)))


def time_key(buf, pos: int = 0) -> int:
    """The time a lookup by time compares for the batch at ``pos`` (only grows along a
    partition): v2's ``max_time_us`` (the partition's largest record timestamp through this
    batch, stamped at append), v1's append time."""
    if buf[pos + VERSION_AT] == VERSION_2:
        return STAMP_V2.unpack_from(buf, pos + STAMP_V2_AT)[1]
    return STAMP.unpack_from(buf, pos + STAMP_AT)[1]


def newest_version(parts) -> int:
    """The highest batch version in buffers of back-to-back frames (one step per batch): what a
    FETCH from a client of protocol version 1, which reads only v1 batches, must not be sent."""
    top = 0
    for buf in parts:
        mv = memoryview(buf)
        pos, end = 0, mv.nbytes
        while pos + PREFIX_BYTES <= end:
            length = LENGTH.unpack_from(mv, pos)[0]
            if length < PREFIX_BYTES:
                break
            top = max(top, mv[pos + VERSION_AT])
            pos += align8(length)
    return top


V1_READER_REFUSAL = ("a version 2 batch is next in this partition, and a client of protocol version 1 reads only "
                     "version 1 batches: upgrade the client (docs/PROTOCOL.md 1)")


from .checks import Checked, check_batch, rewrite_batch, validate_frame  # noqa: E402,F401 (re-exported)
from .views import BatchView, iter_batches  # noqa: E402,F401 (re-exported)
