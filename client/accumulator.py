"""The producer's accumulator (Kafka's RecordAccumulator): records queued per partition, sealed
into batches with their producer id and sequence numbers, counted against ``buffer_memory``.

``Accumulator`` is ``ProducerCore``'s queueing half, a mixin without state of its own: the
fields it works on (``_pending``, ``_ready``, ``_lingering``, ``_seq``, ``_pids``,
``_buffered_bytes``...) are declared, with their shapes, in ``ProducerCore.__init__``
(producer.py), which also decides when a lingering batch is sealed and what is sent.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import BatchTooLargeError
from .partitioners import hash_partitions, key_hash, sticky
from .records import HEADER_BYTES, encode_batch, encode_batch_buffers, now_us, restamp

__all__ = ["DEFAULT_MAX_BATCH_BYTES", "Accumulator", "batch_times", "header_bytes"]

DEFAULT_MAX_BATCH_BYTES = 1 << 20  # the broker's default max_batch_bytes: the limit until DESCRIBE says
_BATCH_SLACK_BYTES = HEADER_BYTES + 8 * 3  # a batch's bytes besides its records' (offset arrays' ends, padding)


def _objects(seq: Sequence) -> np.ndarray:
    """``seq`` as a 1-D object array (each item stays itself, whatever its length)."""
    a = np.empty(len(seq), dtype=object)
    a[:] = seq
    return a


@dataclass
class _Pending:
    values: list = field(default_factory=list)
    keys: list = field(default_factory=list)
    keyed: bool = False
    nbytes: int = 0  # values' bytes
    charged: int = 0  # values' and keys' bytes, counted against buffer_memory
    since: float = 0.0
    waiters: list | None = None  # one future per record (the asyncio producer), else None
    headers: list | None = None  # one header list (or None) per record, once a record has headers
    times: list | None = None  # one create time (us) per record, once a record has its own
    t0_us: int = 0  # wall clock when the first record came: the time of records without one


def batch_times(timestamps_ms, n: int) -> np.ndarray | None:
    """``send_batch``'s per-record create times (ms) as an int64 array of us, or None."""
    if timestamps_ms is None:
        return None
    times = np.asarray(timestamps_ms, dtype=np.int64)
    if times.shape != (n,):
        raise ValueError(f"timestamps_ms and values differ in length: timestamps_ms={len(times)} values={n}")
    return times * 1000


def headers_sample_bytes(headers, sample: int) -> int:
    """The header bytes of the first ``sample`` records (per-record lists, or None)."""
    return 0 if headers is None else sum(map(header_bytes, headers[:sample]))


def header_bytes(headers) -> int:
    """What a record's headers add to its batch (keys, values, 9 bytes of arrays each)."""
    if not headers:
        return 0
    pairs = headers.items() if isinstance(headers, dict) else headers
    return sum(len(k.encode() if isinstance(k, str) else k) + (0 if v is None else len(v)) + 9 for k, v in pairs)


class Accumulator:
    """Queueing: partition choice, per-partition pending records and sealed batches, sequence
    numbers, the buffer_memory count (the module docstring)."""

    # --- queueing ----------------------------------------------------------------------------
    def _choose(self, topic: str, key: bytes | None, partition: int | None, partitions: int) -> int:
        if partition is not None:
            return partition
        self._counter += 1
        return self.partitioner(key, partitions, self._counter)

    @property
    def max_batch_bytes(self) -> int:
        """The broker's batch limit (DESCRIBE_TOPIC's), its default until one was heard."""
        return self.routes.max_batch_bytes or DEFAULT_MAX_BATCH_BYTES

    def _encoding(self) -> dict:
        """The producer's compression, as encode_batch's keywords."""
        return {"compression": self.compression, "compression_level": self.compression_level} if self.compression else {}

    def _too_large(self, value: bytes, key: bytes | None, extra: int = 0) -> BatchTooLargeError | None:
        """The error for a record that cannot fit in any batch the broker takes, else None
        (``extra``: its headers' and time's bytes)."""
        size = len(value) + (0 if key is None else len(key) + 8) + _BATCH_SLACK_BYTES + extra
        limit = self.max_batch_bytes
        if size <= limit:
            return None
        return BatchTooLargeError(f"BATCH_TOO_LARGE: a record of {size - _BATCH_SLACK_BYTES} bytes makes a batch of "
                                  f"{size} bytes; the broker takes at most max_batch_bytes={limit} (not sent)")

    def _add(self, tp, value: bytes, key: bytes | None, waiter=None, headers=None, time_us: int | None = None,
             extra: int = 0) -> None:
        """Queue one record for partition ``tp`` (and its future, if it has one; its headers and
        own create time, if it has them: ``extra`` is their bytes). The caller checked it with
        ``_too_large``."""
        rec = len(value) + (0 if key is None else len(key)) + extra
        pend = self._pending.get(tp)
        if pend is None:
            pend = self._pending[tp] = _Pending(since=time.monotonic())
        elif not pend.values:
            pend.since = time.monotonic()
        elif pend.charged + rec + 8 * (len(pend.values) + 1) * (1 + pend.keyed) + _BATCH_SLACK_BYTES > self.max_batch_bytes:
            self._seal(tp, pend)  # with this record the batch would be over the broker's limit
            pend.since = time.monotonic()
        if not pend.values:
            pend.t0_us = now_us()
        if headers and pend.headers is None:
            pend.headers = [None] * len(pend.values)
        if pend.headers is not None:
            pend.headers.append(headers or None)
        if time_us is not None and pend.times is None:
            pend.times = [pend.t0_us] * len(pend.values)
        if pend.times is not None:
            pend.times.append(now_us() if time_us is None else time_us)
        self._buffered_bytes += rec
        pend.charged += rec
        if key is not None and not pend.keyed:
            pend.keyed = True
            pend.keys = [b""] * len(pend.values)
        pend.values.append(value)
        if waiter is not None:
            if pend.waiters is None:
                pend.waiters = [None] * (len(pend.values) - 1)
            pend.waiters.append(waiter)
        elif pend.waiters is not None:
            pend.waiters.append(None)
        self._lingering.add(tp)
        if pend.keyed:
            pend.keys.append(b"" if key is None else key)
        pend.nbytes += len(value)
        if len(pend.values) >= self.batch_records or pend.nbytes >= self.batch_bytes:
            self._seal(tp, pend)

    def _split_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes] | None,
                     partitions: int, headers=None, times=None) -> list[tuple]:
        """``send_batch``'s partitioning: (partition, values, keys, headers, times) groups. With
        a key-hash partitioner and keys, by key; otherwise the whole call to one partition."""
        if keys is not None and self.partitioner in (key_hash, sticky):
            parts = hash_partitions(keys, partitions)
            order = np.argsort(parts, kind="stable")  # by partition, send order kept within each
            sorted_parts = parts[order]
            cuts = (np.flatnonzero(sorted_parts[1:] != sorted_parts[:-1]) + 1).tolist()
            cols = [_objects(c)[order] for c in (values, keys, headers) if c is not None]
            if times is not None:
                cols.append(np.asarray(times, dtype=np.int64)[order])
            starts = [0, *cuts]
            pieces = [np.split(c, cuts) for c in cols]
            out = []
            for j, a in enumerate(starts):
                got = [p[j] for p in pieces]
                vs, ks = got[0].tolist(), got[1].tolist()
                hs = got[2].tolist() if headers is not None else None
                ts = got[-1] if times is not None else None
                out.append((int(sorted_parts[a]), vs, ks, hs, ts))
            return out
        return [(self._choose(topic, None, None, partitions), values, keys, headers, times)]

    def _queue_batch(self, tp, values: Sequence[bytes], keys: Sequence[bytes] | None, headers=None,
                     times=None) -> None:
        """Queue ``values`` for ``tp`` as batches of at most batch_records / batch_bytes (with
        their keys, per-record header lists and create times in us, where given)."""
        step = self.batch_records
        sample = min(len(values), 64)
        avg = max(1, (sum(map(len, values[:sample])) + headers_sample_bytes(headers, sample)) // sample)
        step = max(1, min(step, self.batch_bytes // avg, (self.max_batch_bytes - _BATCH_SLACK_BYTES) // (avg + 8)))
        q = self._ready.setdefault(tp, deque())
        enc = self._encoding()
        for i in range(0, len(values), step):
            chunk = values[i : i + step]
            frame = self._encode(encode_batch, chunk, None if keys is None else keys[i : i + step],
                                 headers=None if headers is None else headers[i : i + step],
                                 timestamps_us=None if times is None else times[i : i + step],
                                 **enc, **self._ids(tp, len(chunk)))
            q.append((frame, len(chunk), None))

    def _queue_buffers(self, tp, values, value_offsets, keys, key_offsets, headers=None, times=None) -> None:
        frame = self._encode(encode_batch_buffers, values, value_offsets, keys, key_offsets, headers=headers,
                             timestamps_us=times, **self._encoding(), **self._ids(tp, len(value_offsets) - 1))
        self._ready.setdefault(tp, deque()).append((frame, len(value_offsets) - 1, None))

    def _encode(self, fn, *args, **kwargs) -> bytes:
        """A batch's frame (``fn``: encode_batch or encode_batch_buffers), counted against
        buffer_memory. (Compressing on a second thread, the codecs releasing the GIL, was tried
        and measured no faster on two cores: docs/BENCHMARKS.md "Record format v2".)"""
        frame = fn(*args, **kwargs)
        self._buffered_bytes += len(frame)
        return frame

    def _ids(self, tp, count: int) -> dict:
        """Producer id and base sequence for the next batch of ``count`` records to ``tp``."""
        if self.producer_id < 0:
            return {}
        seq = self._seq.get(tp, 0)
        self._seq[tp] = (seq + count) & 0x7FFFFFFF
        return {"producer_id": self._pids.get(tp, self.producer_id), "base_sequence": seq}

    def _restart_sequence(self, tp) -> None:
        """A batch to ``tp`` failed for good: its sequence numbers are a gap, and the partition
        refuses every later batch of this producer id that skips it (OUT_OF_ORDER_SEQUENCE,
        actors/dedup.py). Kafka's producer bumps its epoch here; ours takes a new producer id
        for ``tp`` (one the partition does not know may start anywhere) and numbers from 0 again,
        re-stamping the batches already encoded for ``tp`` and not yet sent, in send order. A
        batch waiting to be resent keeps its bytes (its first try may be stored: only the same
        bytes are answered as a duplicate)."""
        pid = self._pids[tp] = random.getrandbits(62)
        seq = 0
        q = self._ready.get(tp)
        if q:
            fresh = deque()
            for frame, count, waiters in q:
                fresh.append((restamp(frame, pid, seq), count, waiters))
                seq = (seq + count) & 0x7FFFFFFF
            self._ready[tp] = fresh
        self._seq[tp] = seq

    def _seal(self, tp, pend: _Pending) -> None:
        self._lingering.discard(tp)
        waiters = pend.waiters
        if waiters is not None and any(w is not None and w.cancelled() for w in waiters):
            # a cancelled send not yet in a batch is never sent (aio.py: "acked once or not stored")
            keep = [i for i, w in enumerate(waiters) if w is None or not w.cancelled()]
            pend.values = [pend.values[i] for i in keep]
            if pend.keyed:
                pend.keys = [pend.keys[i] for i in keep]
            waiters = [waiters[i] for i in keep]
            if pend.headers is not None:
                pend.headers = [pend.headers[i] for i in keep]
            if pend.times is not None:
                pend.times = [pend.times[i] for i in keep]
        self._buffered_bytes -= pend.charged  # the records' bytes become the frame's
        if pend.values:
            frame = self._encode(encode_batch, pend.values, pend.keys if pend.keyed else None,
                                 headers=pend.headers, timestamps_us=pend.times, create_time_us=pend.t0_us or None,
                                 **self._encoding(), **self._ids(tp, len(pend.values)))
            self._ready.setdefault(tp, deque()).append((frame, len(pend.values), waiters))
        pend.values, pend.keys, pend.keyed, pend.nbytes, pend.charged, pend.waiters = [], [], False, 0, 0, None
        pend.headers = pend.times = None

    def _seal_all(self) -> None:
        for tp in list(self._lingering):
            self._seal(tp, self._pending[tp])

    # --- buffer_memory -----------------------------------------------------------------------
    @property
    def buffered_bytes(self) -> int:
        """Bytes held for records queued or unacknowledged (bounded by ``buffer_memory``)."""
        return self._buffered_bytes

    def _room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be queued now (always, into an empty buffer)."""
        return self._buffered_bytes + nbytes <= self.buffer_memory or self._buffered_bytes <= 0
