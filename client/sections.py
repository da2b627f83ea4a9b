"""The record section of a v2 batch (docs/FORMAT.md 1.2): what follows the 80-byte header, and
what a codec compresses. Columnar, as v1's body is: arrays of offsets over bytes back to back,
so a section is built and read with numpy, never a Python step per record.

With ``n`` records and ``H`` headers in all, in this order (each part only when its attribute
bit is set; every integer little-endian)::

    time_deltas     int64[n]     A_TIMES    record i's create time = base_time_us + time_deltas[i]
    value_offsets   int32[n+1]   always     value i = values[value_offsets[i] : value_offsets[i+1]]
    key_offsets     int32[n+1]   A_KEYS     the same over keys
    header_starts   int32[n+1]   A_HEADERS  record i's headers are entries header_starts[i] .. [i+1]
    hkey_offsets    int32[H+1]   A_HEADERS  header j's key = hkeys[hkey_offsets[j] : ... [j+1]] (UTF-8)
    hvalue_offsets  int32[H+1]   A_HEADERS  header j's value, the same over hvalues
    hvalue_null     uint8[H]     A_HEADERS  1: header j's value is null (its range is empty)
    values, keys, hkeys, hvalues            bytes, back to back, in that order

A v1 body is exactly a v2 section without times or headers (value offsets, key offsets, values,
keys), which is why a v1 batch converts to v2 by writing a new header in front of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat
from operator import length_hint
from typing import Sequence

import numpy as np

A_KEYS, A_HEADERS, A_TIMES = 0x0100, 0x0200, 0x0400
I32 = np.dtype("<i4")
I64 = np.dtype("<i8")
_INT32_MAX = int(np.iinfo(np.int32).max)


class SectionError(ValueError):
    """A section whose arrays contradict each other or its size (``MALFORMED``)."""


@dataclass(slots=True)
class HeaderArrays:
    """The headers of a run of records, columnar: record i's headers are entries
    ``starts[i] .. starts[i+1]``; entry j's key is ``keys[key_offsets[j]:key_offsets[j+1]]``
    (UTF-8), its value the same over ``values``, null where ``valid[j]`` is False."""

    starts: np.ndarray  # int32[n + 1], from 0
    key_offsets: np.ndarray  # int32[H + 1], from 0
    keys: np.ndarray | memoryview  # uint8
    value_offsets: np.ndarray  # int32[H + 1], from 0
    values: np.ndarray | memoryview  # uint8
    valid: np.ndarray  # bool[H]

    def pairs(self, a: int = 0, b: int | None = None) -> list[tuple[str, bytes | None]]:
        """Header entries a..b as Python pairs (the record path: one step per header)."""
        b = len(self.valid) if b is None else b
        ko, vo, ok = self.key_offsets[a : b + 1].tolist(), self.value_offsets[a : b + 1].tolist(), self.valid[a:b].tolist()
        k, v = bytes(self.keys), bytes(self.values)
        return [(k[ko[j] : ko[j + 1]].decode(), v[vo[j] : vo[j + 1]] if ok[j] else None) for j in range(b - a)]

    def lists(self) -> list[tuple]:
        """Every record's headers, as a tuple of (key, value) pairs each (one pass)."""
        flat = self.pairs()
        s = self.starts.tolist()
        return [tuple(flat[s[i] : s[i + 1]]) for i in range(len(s) - 1)]


def _offsets(lengths) -> np.ndarray:
    out = np.empty(len(lengths) + 1, dtype=I32)
    out[0] = 0
    np.cumsum(lengths, out=out[1:])
    return out


def headers_from_lists(headers: Sequence, n: int) -> HeaderArrays | None:
    """Per-record header lists (each None, a list of (key, value) pairs, or a dict) as columns;
    None when no record has any. The loops here are C's (map, chain, join), not Python's."""
    if len(headers) != n:
        raise ValueError(f"headers and values differ in length: headers={len(headers)} values={n}")
    if any(map(isinstance, headers, repeat(dict))):  # dicts: their pairs (the one path with a step per record)
        headers = [h.items() if isinstance(h, dict) else h for h in headers]
    counts = np.fromiter(map(length_hint, headers), dtype=np.int64, count=n)  # None: 0
    total = int(counts.sum())
    if total == 0:
        return None
    flat = list(chain.from_iterable(filter(None, headers)))
    try:
        keys, values = zip(*flat)
    except (TypeError, ValueError):
        raise ValueError("each header is a (key, value) pair") from None
    try:
        joined = "".join(keys)
    except TypeError:
        raise ValueError("header keys are str (UTF-8 on the wire)") from None
    if joined.isascii():
        kbytes, klens = joined.encode(), np.fromiter(map(len, keys), dtype=np.int64, count=total)
    else:
        enc = list(map(str.encode, keys))
        kbytes, klens = b"".join(enc), np.fromiter(map(len, enc), dtype=np.int64, count=total)
    valid = np.ones(total, dtype=bool)
    if None in values:
        obj = np.empty(total, dtype=object)
        obj[:] = values
        valid = obj != None  # noqa: E711 (elementwise, in C)
    try:
        vbytes = b"".join(filter(None, values))  # the nulls (and empty values) add no bytes
    except TypeError:
        raise ValueError("header values are bytes or None") from None
    vlens = np.fromiter(map(length_hint, values), dtype=np.int64, count=total)  # a null's: 0
    return HeaderArrays(_offsets(counts), _offsets(klens), np.frombuffer(kbytes, np.uint8), _offsets(vlens),
                        np.frombuffer(vbytes, np.uint8), np.asarray(valid, dtype=bool))


def section_size(n: int, values_bytes: int, keys_bytes: int | None, headers: HeaderArrays | None, times: bool) -> int:
    size = 4 * (n + 1) + values_bytes + (8 * n if times else 0)
    if keys_bytes is not None:
        size += 4 * (n + 1) + keys_bytes
    if headers is not None:
        h = len(headers.valid)
        size += 4 * (n + 1) + 8 * (h + 1) + h + len(headers.keys) + len(headers.values)
    return size


def write_section(out: memoryview, n: int, deltas: np.ndarray | None, value_offsets: np.ndarray, values,
                  key_offsets: np.ndarray | None, keys, headers: HeaderArrays | None) -> int:
    """Write a section into ``out`` (exactly ``section_size`` bytes); return the attribute bits."""
    attrs, pos = 0, 0

    def put(data) -> None:
        nonlocal pos
        mv = memoryview(data).cast("B")
        out[pos : pos + mv.nbytes] = mv
        pos += mv.nbytes

    if deltas is not None:
        attrs |= A_TIMES
        put(np.ascontiguousarray(deltas, dtype=I64))
    put(np.ascontiguousarray(value_offsets, dtype=I32))
    if key_offsets is not None:
        attrs |= A_KEYS
        put(np.ascontiguousarray(key_offsets, dtype=I32))
    if headers is not None:
        attrs |= A_HEADERS
        put(np.ascontiguousarray(headers.starts, dtype=I32))
        put(np.ascontiguousarray(headers.key_offsets, dtype=I32))
        put(np.ascontiguousarray(headers.value_offsets, dtype=I32))
        put((~np.asarray(headers.valid, dtype=bool)).view(np.uint8))
    put(values)
    if key_offsets is not None:
        put(keys)
    if headers is not None:
        put(headers.keys)
        put(headers.values)
    assert pos == len(out), (pos, len(out))
    return attrs


@dataclass(slots=True)
class Section:
    """A parsed section: views into its buffer, no copies."""

    deltas: np.ndarray | None  # int64[n]
    value_offsets: np.ndarray
    values: memoryview
    key_offsets: np.ndarray | None
    keys: memoryview | None
    headers: HeaderArrays | None


def _array(mv: memoryview, dtype, count: int, at: int, what: str) -> np.ndarray:
    if count < 0 or at + count * dtype.itemsize > mv.nbytes:
        raise SectionError(f"{what} ({count} entries at byte {at}) runs past the section's {mv.nbytes} bytes")
    return np.frombuffer(mv, dtype=dtype, count=count, offset=at)


def _monotone(a: np.ndarray, what: str) -> int:
    """Check offsets start at 0 and never decrease; return the last."""
    if int(a[0]) != 0 or (len(a) > 1 and (a[1:] < a[:-1]).any()):
        raise SectionError(f"{what} must start at 0 and never decrease")
    return int(a[-1])


def parse_section(buf, n: int, attrs: int, check: bool) -> Section:
    """Views of a section of ``n`` records (``buf`` is exactly the section). With ``check``
    every array is bounded and consistent with the size, header keys are UTF-8 and null values
    empty: what the broker does on produce (SectionError otherwise). Without, the reader's path:
    bounds only, trusting the broker."""
    mv = memoryview(buf).cast("B")
    pos = 0
    deltas = None
    if attrs & A_TIMES:
        deltas = _array(mv, I64, n, pos, "time_deltas")
        pos += 8 * n
    voffs = _array(mv, I32, n + 1, pos, "value_offsets")
    pos += 4 * (n + 1)
    koffs = hstarts = None
    if attrs & A_KEYS:
        koffs = _array(mv, I32, n + 1, pos, "key_offsets")
        pos += 4 * (n + 1)
    total_h = 0
    if attrs & A_HEADERS:
        hstarts = _array(mv, I32, n + 1, pos, "header_starts")
        pos += 4 * (n + 1)
        total_h = _monotone(hstarts, "header_starts") if check else int(hstarts[-1])
        hk = _array(mv, I32, total_h + 1, pos, "hkey_offsets")
        pos += 4 * (total_h + 1)
        hv = _array(mv, I32, total_h + 1, pos, "hvalue_offsets")
        pos += 4 * (total_h + 1)
        hnull = _array(mv, np.dtype(np.uint8), total_h, pos, "hvalue_null")
        pos += total_h
    vlen = _monotone(voffs, "value_offsets") if check else int(voffs[-1])
    klen = (_monotone(koffs, "key_offsets") if check else int(koffs[-1])) if koffs is not None else 0
    hklen = hvlen = 0
    if hstarts is not None:
        hklen = _monotone(hk, "hkey_offsets") if check else int(hk[-1])
        hvlen = _monotone(hv, "hvalue_offsets") if check else int(hv[-1])
    end = pos + vlen + klen + hklen + hvlen
    if end != mv.nbytes and (check or end > mv.nbytes):
        raise SectionError(f"section arrays describe {end} bytes, the section holds {mv.nbytes}")
    values = mv[pos : pos + vlen]
    pos += vlen
    keys = None
    if koffs is not None:
        keys = mv[pos : pos + klen]
        pos += klen
    headers = None
    if hstarts is not None:
        hkeys = mv[pos : pos + hklen]
        hvalues = mv[pos + hklen : pos + hklen + hvlen]
        if check:
            _check_headers(hk, hkeys, hv, hnull)
        headers = HeaderArrays(hstarts, hk, hkeys, hv, hvalues, hnull == 0)
    return Section(deltas, voffs, values, koffs, keys, headers)


def _check_headers(hk: np.ndarray, hkeys: memoryview, hv: np.ndarray, hnull: np.ndarray) -> None:
    if len(hnull) and hnull.any() and (hnull.max() > 1 or ((hnull == 1) & (hv[1:] != hv[:-1])).any()):
        raise SectionError("hvalue_null holds 0 or 1, and a null value's range is empty")
    kb = np.frombuffer(hkeys, dtype=np.uint8)
    if not len(kb) or kb.max() < 0x80:  # ASCII keys (the common case): UTF-8, each on its own
        return
    try:
        bytes(hkeys).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SectionError(f"header keys are not UTF-8: {exc.reason} at byte {exc.start}") from None
    starts = hk[:-1][hk[1:] > hk[:-1]]  # the first byte of each non-empty key
    if len(starts) and bool(np.any((kb[starts] & 0xC0) == 0x80)):
        raise SectionError("a header key starts inside a UTF-8 character (each key is UTF-8 on its own)")
