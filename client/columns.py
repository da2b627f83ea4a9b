"""Records of many batches as flat columns (``Columns``): what Arrow's arrays are made of, built
from batch views (client/records.py ``iter_batches``) with numpy, one Python step per batch and
none per record. The consumer's ``poll_columns``, its records and the Spark bridge all read
these.

A record's ``timestamp`` follows its batch's type (Kafka's): the producer's create time
(``CreateTime``: the batch's base time plus the record's delta when the batch has per-record
times) or the broker's append time (``LogAppendTime``, the topic's ``message.timestamp.type`` when
the batch was appended). v1 batches carry one create time per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sections import HeaderArrays

OFFSETS_DTYPE = np.dtype("<i4")
CREATE_TIME, LOG_APPEND_TIME = 0, 1  # Record.timestamp_type (Kafka's TimestampType ids)
TIMESTAMP_TYPES = {CREATE_TIME: "CreateTime", LOG_APPEND_TIME: "LogAppendTime"}  # their names (the CLI prints them)
_INT32_MAX = int(np.iinfo(np.int32).max)


@dataclass(slots=True)
class Columns:
    """Records of many batches as flat columns. (Not frozen: a frozen dataclass's __init__ is
    one object.__setattr__ per field, paid per partition in every poll of a tailing consumer.)"""

    offsets: np.ndarray  # int64[n]: record offsets
    timestamps_us: np.ndarray  # int64[n]: each record's timestamp (its batch's timestamp type)
    value_offsets: np.ndarray  # int32[n + 1], from 0
    values: np.ndarray  # uint8[value_offsets[-1]]
    key_offsets: np.ndarray  # int32[n + 1]; all-equal runs where a batch had no keys
    keys: np.ndarray  # uint8
    key_valid: np.ndarray  # bool[n]: False where the batch had no keys (null key)
    timestamp_types: np.ndarray | None = None  # uint8[n]: CREATE_TIME / LOG_APPEND_TIME; None: all CreateTime
    headers: HeaderArrays | None = None  # None: no record here has headers

    def __len__(self) -> int:
        return len(self.offsets)

    def timestamp_type(self, i: int) -> int:
        return CREATE_TIME if self.timestamp_types is None else int(self.timestamp_types[i])


def _empty() -> Columns:
    z = np.zeros(0, dtype=np.int64)
    return Columns(z, z, np.zeros(1, OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(1, OFFSETS_DTYPE),
                   np.zeros(0, np.uint8), np.zeros(0, bool))


def batches_to_columns(views: list, start_offset: int = 0, end_offset: int | None = None) -> Columns:
    """Flatten batch views (records.BatchView) to columns, keeping records with
    start_offset <= offset < end_offset. numpy over the whole set; one Python step per batch."""
    keep = []
    for v in views:
        lo = max(start_offset - v.base_offset, 0)
        hi = v.record_count if end_offset is None else min(end_offset - v.base_offset, v.record_count)
        if hi > lo:
            keep.append((v, lo, hi))
    if not keep:
        return _empty()
    if len(keep) == 1:
        return _one_batch_columns(*keep[0])
    return _many_batch_columns(keep)


def _times(v, lo: int, hi: int) -> np.ndarray:
    """The timestamps of records lo..hi of batch ``v`` (int64, its type's)."""
    if v.timestamp_type == LOG_APPEND_TIME:
        t = np.empty(hi - lo, dtype=np.int64)
        t.fill(v.append_time_us)
        return t
    if v.time_deltas is not None:
        return v.time_deltas[lo:hi] + v.create_time_us
    t = np.empty(hi - lo, dtype=np.int64)
    t.fill(v.create_time_us)  # np.full is a Python function around the same two calls
    return t


def _one_batch_columns(v, lo: int, hi: int) -> Columns:
    """``batches_to_columns`` of one batch (a tailing read): the same columns in a third of the
    numpy calls. Values, keys and headers are copied, as in the general case, so the columns
    outlive the buffer they were read from."""
    n = hi - lo
    vo = v.value_offsets[lo : hi + 1]
    if v.key_offsets is not None:
        ko = v.key_offsets[lo : hi + 1]
        key_offsets, keys = ko - ko[0], np.frombuffer(v.keys, dtype=np.uint8)[ko[0] : ko[-1]].copy()
        key_valid = np.ones(n, dtype=bool)
    else:
        key_offsets, keys, key_valid = np.zeros(n + 1, dtype=OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(n, dtype=bool)
    types = None
    if v.timestamp_type != CREATE_TIME:
        types = np.empty(n, dtype=np.uint8)
        types.fill(v.timestamp_type)
    headers = None
    h = v.headers
    if h is not None:
        st = h.starts[lo : hi + 1]
        a, b = int(st[0]), int(st[-1])
        hk, hv = h.key_offsets[a : b + 1], h.value_offsets[a : b + 1]
        headers = HeaderArrays(st - a, hk - hk[0], np.frombuffer(h.keys, dtype=np.uint8)[hk[0] : hk[-1]].copy(),
                               hv - hv[0], np.frombuffer(h.values, dtype=np.uint8)[hv[0] : hv[-1]].copy(),
                               h.valid[a:b].copy())
    return Columns(
        offsets=np.arange(v.base_offset + lo, v.base_offset + hi, dtype=np.int64),
        timestamps_us=_times(v, lo, hi),
        value_offsets=vo - vo[0],
        values=np.frombuffer(v.values, dtype=np.uint8)[vo[0] : vo[-1]].copy(),
        key_offsets=key_offsets,
        keys=keys,
        key_valid=key_valid,
        timestamp_types=types,
        headers=headers,
    )


class _Bytes:
    """One offsets-over-bytes column cut from many batches: pieces shifted as they are cut, so
    joining them is one concatenate."""

    def __init__(self):
        self.pieces, self.bufs, self.shift = [], [], 0

    def add(self, offs: np.ndarray, buf, lo: int, hi: int) -> None:
        o = offs[lo : hi + 1]
        a, b = int(o[0]), int(o[-1])
        self.pieces.append(o[1:] + (self.shift - a))  # int32: exact while the total fits (checked below)
        self.bufs.append(np.frombuffer(buf, dtype=np.uint8)[a:b])
        self.shift += b - a

    def empty(self, count: int) -> None:
        """``count`` empty entries (records of a batch without this column)."""
        self.pieces.append(np.full(count, self.shift, dtype=OFFSETS_DTYPE))

    def offsets(self, n: int) -> np.ndarray:
        if self.shift > _INT32_MAX:
            raise OverflowError("more than 2 GiB in one column set")
        out = np.empty(n + 1, dtype=OFFSETS_DTYPE)
        out[0] = 0
        if n:
            np.concatenate(self.pieces, out=out[1:])
        return out

    def data(self) -> np.ndarray:
        return np.concatenate(self.bufs) if self.bufs else np.zeros(0, np.uint8)


def _many_batch_columns(keep: list) -> Columns:
    """The general case: one numpy step per batch for each column piece, then one per column.
    Batches without keys (the common case) add no key piece: with none keyed, the key columns
    are made at once; likewise headers."""
    vals, keys, counts, bases, times, keyed, types = _Bytes(), None, [], [], [], [], []
    starts = hkeys = hvals = None  # header columns, once a batch with headers is met
    hvalid: list = []
    for v, lo, hi in keep:
        vals.add(v.value_offsets, v.values, lo, hi)
        if v.key_offsets is not None:
            if keys is None:  # the first keyed batch: the unkeyed ones before it had empty keys
                keys = _Bytes()
                for c in counts:
                    keys.empty(c)
            keys.add(v.key_offsets, v.keys, lo, hi)
        elif keys is not None:
            keys.empty(hi - lo)
        h = v.headers
        if h is not None:
            if starts is None:
                starts, hkeys, hvals = _Bytes(), _Bytes(), _Bytes()
                for c in counts:
                    starts.empty(c)
            a, b = int(h.starts[lo]), int(h.starts[hi])
            starts.pieces.append(h.starts[lo + 1 : hi + 1] + (starts.shift - a))
            starts.shift += b - a
            hkeys.add(h.key_offsets, h.keys, a, b)
            hvals.add(h.value_offsets, h.values, a, b)
            hvalid.append(h.valid[a:b])
        elif starts is not None:
            starts.empty(hi - lo)
        counts.append(hi - lo)
        bases.append(v.base_offset + lo)
        times.append(_times(v, lo, hi))
        keyed.append(v.key_offsets is not None)
        types.append(v.timestamp_type)
    counts_a = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts_a)
    n = int(ends[-1])
    offsets = np.repeat(np.asarray(bases, dtype=np.int64) - (ends - counts_a), counts_a)
    offsets += np.arange(n, dtype=np.int64)
    if keys is not None:
        key_offsets, key_bytes, key_valid = keys.offsets(n), keys.data(), np.repeat(np.asarray(keyed, dtype=bool), counts_a)
    else:
        key_offsets, key_bytes, key_valid = np.zeros(n + 1, dtype=OFFSETS_DTYPE), np.zeros(0, np.uint8), np.zeros(n, bool)
    headers = None
    if starts is not None:
        headers = HeaderArrays(starts.offsets(n), _join_offsets(hkeys),
                               hkeys.data(), _join_offsets(hvals), hvals.data(),
                               np.concatenate(hvalid) if hvalid else np.zeros(0, bool))
    ts_types = None if not any(types) else np.repeat(np.asarray(types, dtype=np.uint8), counts_a)
    return Columns(offsets=offsets, timestamps_us=np.concatenate(times), value_offsets=vals.offsets(n),
                   values=vals.data(), key_offsets=key_offsets, keys=key_bytes, key_valid=key_valid,
                   timestamp_types=ts_types, headers=headers)


def _join_offsets(col: _Bytes) -> np.ndarray:
    """The offsets of a column whose entries are not one per record (header keys, values)."""
    total = sum(len(p) for p in col.pieces)
    return col.offsets(total)
