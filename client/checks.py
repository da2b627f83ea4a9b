"""What the broker checks of a batch before it stores it (docs/FORMAT.md 1.4), and the one
rewrite it may make (a topic whose ``compression.type`` names a codec recompresses what came).

Every check bounds a length or a count before trusting it; a compressed section is inflated
into a buffer of exactly the size its header declares (at most ``max_batch_bytes``), so a zip
bomb fails on the first byte past it. Failures are ``BatchError`` with reason ``malformed``,
``too_large`` or ``crc``: the partition answers MALFORMED, BATCH_TOO_LARGE or CORRUPT_BATCH and
nothing of the batch is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import codecs
from . import records as R
from .sections import A_KEYS, A_TIMES, SectionError, parse_section

_V1 = R.HEADER_STRUCT
_V2 = R.HEADER_V2_STRUCT


@dataclass(slots=True)
class Checked:
    """A batch that passed: its padded frame size and count, and what the broker's append needs."""

    size: int
    count: int
    version: int
    codec: int = 0
    section: object = None  # a compressed batch's inflated section (when checked deep), else None
    min_time_us: int = 0  # the records' create times (the producer's clock)
    max_time_us: int = 0


def validate_frame(buf, pos: int, end: int, max_batch_bytes: int, deep: bool = True) -> tuple[int, int]:
    """Check the batch starting at ``pos`` (structure and CRC); return (padded frame size, count)."""
    c = check_batch(buf, pos, end, max_batch_bytes, deep)
    return c.size, c.count


def check_batch(buf, pos: int, end: int, max_batch_bytes: int, deep: bool = True) -> Checked:
    """Check the batch at ``pos``, reading at most ``[pos, end)``. ``deep``: also inflate a
    compressed section and check every array in it (produce); without, a compressed section is
    trusted to its CRC (recovery, which reads what a produce already checked)."""
    avail = end - pos
    if avail < R.PREFIX_BYTES:
        raise R.BatchError("malformed", f"batch header needs {R.PREFIX_BYTES} bytes, got {avail}")
    version = buf[pos + R.VERSION_AT]
    if version == R.VERSION_2:
        if avail < R.HEADER_V2_BYTES:
            raise R.BatchError("malformed", f"a version 2 batch header needs {R.HEADER_V2_BYTES} bytes, got {avail}")
        h = _V2.unpack_from(buf, pos)
    else:
        h = _V1.unpack_from(buf, pos)
    length, magic, n = h[R._LENGTH], h[R._MAGIC], h[R._COUNT]
    if magic != R.MAGIC:
        raise R.BatchError("malformed", f"bad batch magic: magic={magic:#x} expected={R.MAGIC:#x}")
    if version not in R.VERSIONS:
        raise R.BatchError("malformed", f"unsupported batch version: version={version} supported={R.VERSIONS}")
    if length > max_batch_bytes:
        raise R.BatchError("too_large", f"batch of {length} bytes over the limit of {max_batch_bytes}")
    if n < 1 or n > R.MAX_RECORDS_PER_BATCH:
        raise R.BatchError("malformed", f"record_count out of range: record_count={n}")
    if version == R.VERSION_1:
        return _check_v1(buf, pos, h, avail)
    return _check_v2(buf, pos, h, avail, max_batch_bytes, deep)


def _check_v1(buf, pos: int, h: tuple, avail: int) -> Checked:
    length, n = h[R._LENGTH], h[R._COUNT]
    keyed = bool(h[R._ATTRIBUTES] & R.HAS_KEYS)
    arrays = 4 * (n + 1) * (2 if keyed else 1)
    if length < R.HEADER_V1_BYTES + arrays or R.align8(length) > avail:
        raise R.BatchError("malformed", f"batch length lies: length={length} count={n} frame bytes available={avail}")
    if R.batch_crc(buf, pos, length, R.VERSION_1) != h[R._CRC]:
        raise R.BatchError("crc", f"CRC-32C mismatch in batch of {n} records at byte {pos}")
    _check_plain(buf, pos + R.HEADER_V1_BYTES, length - R.HEADER_V1_BYTES, n, A_KEYS if keyed else 0)
    t = h[R._CREATE_TIME]
    return Checked(R.align8(length), n, R.VERSION_1, 0, None, t, t)


def _check_v2(buf, pos: int, h: tuple, avail: int, max_batch_bytes: int, deep: bool) -> Checked:
    length, n, attrs, records_bytes = h[R._LENGTH], h[R._COUNT], h[R._ATTRS2], h[R._REC_BYTES]
    if length < R.HEADER_V2_BYTES or R.align8(length) > avail:
        raise R.BatchError("malformed", f"batch length lies: length={length} count={n} frame bytes available={avail}")
    if attrs & ~R.A_SUPPORTED:
        what = " (transactional and control batches are reserved, not served yet)" if attrs & (R.A_TRANSACTIONAL | R.A_CONTROL) else ""
        raise R.BatchError("malformed", f"attribute bits {attrs & ~R.A_SUPPORTED:#06x} not supported{what}")
    codec = attrs & R.A_CODEC
    if codec not in codecs.NAMES:
        raise R.BatchError("malformed", f"unknown codec id {codec}: one of {sorted(codecs.NAMES)}")
    if records_bytes > max_batch_bytes:
        raise R.BatchError("too_large", f"records section of {records_bytes} bytes (inflated) over the limit of {max_batch_bytes}")
    body = length - R.HEADER_V2_BYTES
    if records_bytes < 0 or (not codec and records_bytes != body):
        raise R.BatchError("malformed", f"records_bytes={records_bytes} does not fit a body of {body} bytes (codec {codec})")
    if 4 * (n + 1) > records_bytes:  # the value offsets alone would not fit: a lying count
        raise R.BatchError("malformed", f"batch length lies: count={n} needs more than records_bytes={records_bytes}")
    if R.batch_crc(buf, pos, length, R.VERSION_2) != h[R._CRC]:
        raise R.BatchError("crc", f"CRC-32C mismatch in batch of {n} records at byte {pos}")
    at = pos + R.HEADER_V2_BYTES
    base = h[R._BASE_TIME]
    if not codec:
        deltas = _check_plain(buf, at, body, n, attrs)
        section = None
    elif not deep:
        return Checked(R.align8(length), n, R.VERSION_2, codec, None, base, base)
    else:
        try:
            section = codecs.decompress(codec, memoryview(buf)[at : at + body], records_bytes)
        except codecs.CodecError as exc:
            raise R.BatchError("malformed", f"compressed section: {exc}") from None
        deltas = _check_plain(section, 0, records_bytes, n, attrs)
    lo = hi = base
    if deltas is not None:
        lo, hi = base + int(deltas.min()), base + int(deltas.max())
    return Checked(R.align8(length), n, R.VERSION_2, codec, section, lo, hi)


def _check_plain(buf, at: int, size: int, n: int, attrs: int):
    """Check an uncompressed section of ``size`` bytes at ``at``; return its time deltas or None."""
    if n == 1 and not attrs & ~A_KEYS:  # one record (the single-message produce): struct reads, no numpy
        v0, total = R._TWO_OFFSETS.unpack_from(buf, at) if size >= 8 else (-1, -1)
        k0 = k1 = 0
        if attrs & A_KEYS:
            if size < 16:
                raise R.BatchError("malformed", "key_offsets run past the section")
            k0, k1 = R._TWO_OFFSETS.unpack_from(buf, at + 8)
        if k0 != 0 or k1 < 0:
            raise R.BatchError("malformed", "key_offsets must start at 0 and never decrease")
        arrays = 16 if attrs & A_KEYS else 8
        if v0 != 0 or total < 0 or arrays + total + k1 != size:
            raise R.BatchError("malformed", "value_offsets must start at 0, never decrease and match the body")
        return None
    try:
        sec = parse_section(memoryview(buf)[at : at + size], n, attrs, check=True)
    except SectionError as exc:
        raise R.BatchError("malformed", str(exc)) from None
    return sec.deltas if attrs & A_TIMES else None


def rewrite_batch(frame, checked: Checked, codec: int, level: int | None = None) -> bytes:
    """``frame`` (checked, as the client sent it) as a v2 batch compressed with ``codec`` (0:
    none), the producer's fields kept: a topic's ``compression.type`` applied on the broker."""
    mv = memoryview(frame)
    length = R.LENGTH.unpack_from(mv, 0)[0]
    if checked.version == R.VERSION_1:
        h = _V1.unpack_from(mv, 0)
        section = mv[R.HEADER_V1_BYTES : length]
        attrs = A_KEYS if h[R._ATTRIBUTES] & R.HAS_KEYS else 0
        pid, seq, pepoch, base_time = h[R._PID], h[R._PID + 1], -1, h[R._CREATE_TIME]
    else:
        h = _V2.unpack_from(mv, 0)
        if checked.codec and checked.section is None:
            checked.section = codecs.decompress(checked.codec, mv[R.HEADER_V2_BYTES : length], h[R._REC_BYTES])
        section = checked.section if checked.codec else mv[R.HEADER_V2_BYTES : length]
        attrs = h[R._ATTRS2] & ~R.A_CODEC
        pid, seq, pepoch, base_time = h[R._PID], h[R._PID + 1], h[R._PEPOCH], h[R._BASE_TIME]
    size = memoryview(section).nbytes
    packed = memoryview(section).cast("B") if not codec else codecs.compress(codec, section, level)
    out_len = R.HEADER_V2_BYTES + packed.nbytes
    buf = bytearray(R.align8(out_len))
    buf[R.HEADER_V2_BYTES : out_len] = packed
    R._pack_v2(buf, out_len, attrs | codec, checked.count, size, base_time, pid, seq, pepoch)
    return bytes(buf)
