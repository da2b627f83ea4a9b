"""Reading batches: a buffer of back-to-back frames (a fetch reply, a ring copy, a journal read)
as ``BatchView``s, one Python step per batch and none per record. Both versions; a compressed
v2 section is inflated here, in the reader (the client, the same-host ring reader, Spark), into
a buffer of exactly its declared size. Trusts the broker (no CRC check), but a section that does
not inflate or parse raises ``BatchError`` rather than yielding part of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import codecs
from . import records as R
from .columns import CREATE_TIME, LOG_APPEND_TIME
from .sections import A_KEYS, HeaderArrays, SectionError, parse_section


@dataclass(slots=True)
class BatchView:
    """A decoded view of one batch inside a larger buffer (or its inflated section). (Not
    frozen: a frozen dataclass's __init__ costs ~3 us, paid once per batch read by a tailing
    consumer.)"""

    base_offset: int
    record_count: int
    partition: int
    append_time_us: int
    create_time_us: int  # the producer's time of record 0 (all records, without time_deltas)
    value_offsets: np.ndarray  # int32[count + 1], starts at 0
    values: memoryview
    key_offsets: np.ndarray | None
    keys: memoryview | None
    version: int = R.VERSION_1
    timestamp_type: int = CREATE_TIME
    time_deltas: np.ndarray | None = None  # int64[count]: record i's create time - create_time_us
    headers: HeaderArrays | None = None
    leader_epoch: int = 0
    time_key_us: int = 0  # what lookups by time compare (records.time_key)
    codec: int = 0

    def value(self, i: int) -> bytes:
        return bytes(self.values[self.value_offsets[i] : self.value_offsets[i + 1]])

    def key(self, i: int) -> bytes | None:
        if self.key_offsets is None:
            return None
        return bytes(self.keys[self.key_offsets[i] : self.key_offsets[i + 1]])

    def timestamp_us(self, i: int) -> int:
        if self.timestamp_type == LOG_APPEND_TIME:
            return self.append_time_us
        return self.create_time_us + (0 if self.time_deltas is None else int(self.time_deltas[i]))


def iter_batches(buf) -> list[BatchView]:
    """Split a buffer of back-to-back padded batches (a fetch reply body) into views."""
    mv = memoryview(buf).cast("B")
    views = []
    pos, end = 0, mv.nbytes
    while pos + R.PREFIX_BYTES <= end:
        version = mv[pos + R.VERSION_AT]
        if version == R.VERSION_2:
            v = _view_v2(mv, pos)
        elif version == R.VERSION_1:
            v = _view_v1(mv, pos)
        else:
            if R.LENGTH.unpack_from(mv, pos)[0] < R.PREFIX_BYTES:
                break  # zeros: the end of data
            raise R.BatchError("malformed", f"batch version {version} at byte {pos}: this reader knows {R.VERSIONS}")
        if v is None:
            break
        views.append(v)
        pos += R.align8(R.LENGTH.unpack_from(mv, pos)[0])
    return views


def _view_v1(mv: memoryview, pos: int) -> BatchView | None:
    h = R.HEADER_STRUCT.unpack_from(mv, pos)  # a tuple, not a Header dict: once per batch read
    if h[R._LENGTH] < R.HEADER_V1_BYTES:
        return None
    n = h[R._COUNT]
    arr = pos + R.HEADER_V1_BYTES
    voffs = np.frombuffer(mv, dtype=R.OFFSETS_DTYPE, count=n + 1, offset=arr)
    arr += 4 * (n + 1)
    koffs = keys = None
    if h[R._ATTRIBUTES] & R.HAS_KEYS:
        koffs = np.frombuffer(mv, dtype=R.OFFSETS_DTYPE, count=n + 1, offset=arr)
        arr += 4 * (n + 1)
    vend = arr + int(voffs[-1])
    if koffs is not None:
        keys = mv[vend : vend + int(koffs[-1])]
    return BatchView(h[R._BASE], n, h[R._PARTITION], h[R._APPEND_TIME], h[R._CREATE_TIME], voffs, mv[arr:vend], koffs,
                     keys, R.VERSION_1, CREATE_TIME, None, None, 0, h[R._APPEND_TIME], 0)


def _view_v2(mv: memoryview, pos: int) -> BatchView | None:
    if pos + R.HEADER_V2_BYTES > mv.nbytes:
        raise R.BatchError("malformed", f"a version 2 header at byte {pos} runs past the buffer")
    h = R.HEADER_V2_STRUCT.unpack_from(mv, pos)
    length, n, attrs = h[R._LENGTH], h[R._COUNT], h[R._ATTRS2]
    if length < R.HEADER_V2_BYTES or pos + length > mv.nbytes:
        raise R.BatchError("malformed", f"batch at byte {pos}: length {length} outside the buffer")
    body = mv[pos + R.HEADER_V2_BYTES : pos + length]
    codec = attrs & R.A_CODEC
    try:
        if codec:
            body = memoryview(codecs.decompress(codec, body, h[R._REC_BYTES]))
        if n == 1 and not attrs & ~A_KEYS & ~R.A_CODEC:  # a single message: no section parse
            voffs = np.frombuffer(body, dtype=R.OFFSETS_DTYPE, count=2)
            koffs = keys = None
            arr = 8
            if attrs & A_KEYS:
                koffs = np.frombuffer(body, dtype=R.OFFSETS_DTYPE, count=2, offset=8)
                arr = 16
            vend = arr + int(voffs[1])
            values = body[arr:vend]
            if koffs is not None:
                keys = body[vend : vend + int(koffs[1])]
            deltas = headers = None
        else:
            s = parse_section(body, n, attrs, check=False)
            voffs, values, koffs, keys, deltas, headers = s.value_offsets, s.values, s.key_offsets, s.keys, s.deltas, s.headers
    except (codecs.CodecError, SectionError, ValueError) as exc:
        raise R.BatchError("malformed", f"batch at offset {h[R._BASE]}: {exc}") from None
    ts_type = LOG_APPEND_TIME if h[R._FLAGS] & R.F_LOG_APPEND_TIME else CREATE_TIME
    return BatchView(h[R._BASE], n, h[R._PARTITION], h[R._APPEND_TIME], h[R._BASE_TIME], voffs, values, koffs, keys,
                     R.VERSION_2, ts_type, deltas, headers, h[R._LEPOCH], h[R._MAX_TIME], codec)
