"""One share partition's in-flight state: numpy arrays over an offset window, no object per record.

A share group reads a partition as a window ``[start, end)`` of offsets (Kafka's share-partition
start and end offsets): below ``start`` every record is done (acknowledged or archived); from
``end`` on none was read yet. Inside it, one entry per offset in four parallel arrays:

    state   uint8    AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED, DEAD (client/share_protocol.py)
    count   uint16   how many times it was delivered (acquired)
    until   float64  ACQUIRED: when its lock ends; AVAILABLE: not before (a release with a delay)
    owner   int32    ACQUIRED: the member's index in its group

Every step is a vectorised pass over a slice: acquiring is "the first n available and due",
an acknowledgement is a range, an expiry a mask. ``start`` moves up past the done prefix.

The record bytes of the window are kept as the log's batches (``batches``: first offset, end
offset, bytes), from the first batch that holds ``start`` up to ``buf_end``: a redelivery is
served from memory, and a dead record's content is at hand for the dead-letter topic. After a
restart the state comes back from ``__share_group_state`` but the bytes do not: ``buf_end``
starts at ``start`` and the coordinator reads the window again before it serves from it.
"""

from __future__ import annotations

import logging
import time

import msgspec
import numpy as np

from tailrace.client import codecs
from tailrace.client import protocol as P
from tailrace.client import records as R
from tailrace.client import share_protocol as S
from tailrace.client.views import iter_batches
from tailrace.client.share_protocol import (ACCEPT, ACKNOWLEDGED, ACQUIRED, ARCHIVED, AVAILABLE, DEAD, RELEASE,
                                            AcquiredRange)

log = logging.getLogger("tailrace.router")

# RocketMQ's 18 retry levels: a RELEASE without a delay waits the level of the record's delivery count
DEFAULT_BACKOFF_MS = "1000,5000,10000,30000,60000,120000,180000,240000,300000,360000,420000,480000,540000,600000,1200000,1800000,3600000,7200000"
ARCHIVE = "none"  # share.dlq.topic: dead records are archived, not written anywhere

KEYS = ("share.record.lock.duration.ms", "share.delivery.count.limit", "share.retry.backoff.ms", "share.dlq.topic",
        "share.auto.offset.reset", "share.session.timeout.ms")


def check_config(name: str, value: str) -> str | None:
    """Why ``name=value`` is not a share group setting (None: it is; "" resets a known name)."""
    if name in KEYS and value == "":
        return None
    if name in ("share.record.lock.duration.ms", "share.delivery.count.limit", "share.session.timeout.ms"):
        if not value.isdigit() or not 0 < int(value) <= (255 if name == "share.delivery.count.limit" else 86_400_000):
            return f"{name} takes a positive whole number (ms, or deliveries up to 255), got {value!r}"
    elif name == "share.retry.backoff.ms":
        parts = value.split(",")
        if not all(p.strip().isdigit() for p in parts):
            return f"{name} takes a comma-separated list of delays in ms (one per delivery), got {value!r}"
    elif name == "share.dlq.topic":
        if not value or len(value.encode()) > P.MAX_TOPIC_BYTES or value.startswith("__"):
            return f"{name} takes a topic name (or {ARCHIVE!r} to archive dead records), got {value!r}"
    elif name == "share.auto.offset.reset":
        if value not in ("latest", "earliest"):
            return f"{name} is 'latest' or 'earliest', got {value!r}"
    else:
        return f"unknown share group setting {name!r} ({', '.join(KEYS)})"
    return None


def split_batches(body) -> list[tuple[int, int, memoryview]]:
    """A fetch body's batches as (first offset, end offset, bytes): one step per batch."""
    mv = memoryview(body).cast("B")
    out, pos, end = [], 0, mv.nbytes
    while pos + R.PREFIX_BYTES <= end:
        length = R.LENGTH.unpack_from(mv, pos)[0]
        if length < R.PREFIX_BYTES:
            break
        step = R.align8(length)
        base = R.BASE_OFFSET.unpack_from(mv, pos + R.STAMP_AT)[0]
        out.append((base, base + R.COUNT.unpack_from(mv, pos + R.COUNT_AT)[0], mv[pos : pos + step]))
        pos += step
    return out


_DONE = np.zeros(256, bool)
_DONE[[ACKNOWLEDGED, ARCHIVED]] = True


class SnapshotRecord(msgspec.Struct, omit_defaults=True):
    """A share partition in ``__share_group_state`` (keyed ``group \\0 topic \\0 partition``):
    its window, each offset's state (ACQUIRED stored as AVAILABLE: locks do not survive a
    restart) and delivery count, releases still delayed (offset, wall-clock ms due), last errors."""
    group: str
    topic: str
    partition: int
    start: int
    end: int
    states: bytes = b""  # uint8[end - start]
    counts: bytes = b""  # uint16[end - start], little-endian
    delayed: list[tuple[int, int]] = []
    errors: dict[int, str] = {}
    config: dict[str, str] | None = None  # a group's settings record (topic ""), in place of a partition
    deleted: bool = False
    topic_id: int = 0  # the topic's id (a cluster's, in a cluster): a topic deleted and made again starts afresh
    version: int = 0  # the share partition's (or the group's settings') count of writes: a cluster keeps the highest
    epoch: int = -1  # the partition's leader epoch when written (a cluster): a newer leader's records win


_SNAPSHOT = P.decoder(SnapshotRecord)


def encode_snapshots(recs: list[SnapshotRecord]) -> bytes:
    if not recs:
        return b""
    keys = [f"{r.group}\0{r.topic}\0{r.partition}".encode() for r in recs]
    return R.encode_batch([P.encode(r) for r in recs], keys, compression=codecs.ZSTD)


def snapshot_records(batch: bytes):
    """The snapshot records of a batch of them (a copy from another broker); others skipped."""
    for v in iter_batches(batch):
        for i in range(v.record_count):  # a few per group and partition: one step each
            try:
                yield _SNAPSHOT.decode(v.value(i))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("a share state copy holds a record that is not a snapshot: skipped")


class SharePartition:
    __slots__ = ("topic_id", "topic", "partition", "start", "end", "state", "count", "until", "owner", "errors", "batches",
                 "buf_end", "fetching", "dirty", "dead_total", "redelivered", "written_at", "dlq_busy", "version", "epoch")

    def __init__(self, topic: str, partition: int, start: int, topic_id: int = 0):
        self.topic, self.partition, self.topic_id = topic, partition, topic_id
        self.start = self.end = self.buf_end = start
        self.state = np.zeros(0, np.uint8)
        self.count = np.zeros(0, np.uint16)
        self.until = np.zeros(0, np.float64)
        self.owner = np.zeros(0, np.int32)
        self.errors: dict[int, str] = {}  # offset -> the last error text a consumer gave
        self.batches: list[tuple[int, int, bytes]] = []  # (first offset, end offset, the batch's bytes)
        self.fetching = 0  # the rid of the read in flight (one at a time), 0: none
        self.dirty = False  # changed since the last snapshot written
        self.dead_total = 0
        self.redelivered = 0
        self.written_at = 0.0
        self.dlq_busy = False
        self.version, self.epoch = 0, -1  # writes of its snapshot, and the leader epoch of the last (SnapshotRecord)

    def restart(self, start: int) -> None:
        """Start the window again at ``start`` (a new share partition's first read; the log
        behind what was read), keeping the count of writes."""
        version, epoch = self.version, self.epoch
        self.__init__(self.topic, self.partition, start, self.topic_id)
        self.version, self.epoch = version, epoch

    # --- the bytes ---------------------------------------------------------------------------
    def add_batches(self, batches: list[tuple[int, int, bytes]]) -> None:
        """Batches read from the log at ``buf_end`` (whole batches: the first may start below it)."""
        for first, end, data in batches:
            if end <= self.buf_end:
                continue
            self.batches.append((first, end, data))
            self.buf_end = end
        if self.buf_end > self.end:
            self._grow(self.buf_end)

    def _grow(self, new_end: int) -> None:
        n = new_end - self.end
        self.state = np.concatenate([self.state, np.full(n, AVAILABLE, np.uint8)])
        self.count = np.concatenate([self.count, np.zeros(n, np.uint16)])
        self.until = np.concatenate([self.until, np.zeros(n, np.float64)])
        self.owner = np.concatenate([self.owner, np.full(n, -1, np.int32)])
        self.end = new_end

    def skip_to(self, offset: int) -> None:
        """The log no longer holds what is below ``offset`` (retention): archive it."""
        if offset <= self.start:
            return
        if offset > self.end:
            self._grow(offset)
        self.state[: offset - self.start] = ARCHIVED
        self.buf_end = max(self.buf_end, offset)
        self.batches = [b for b in self.batches if b[1] > offset]
        self.dirty = True
        self.advance()

    def body_for(self, offsets: np.ndarray) -> list[bytes]:
        """The batches that hold ``offsets`` (sorted), in order."""
        if not len(offsets) or not self.batches:
            return []
        firsts = np.fromiter((b[0] for b in self.batches), np.int64, len(self.batches))
        which = np.unique(np.searchsorted(firsts, offsets, side="right") - 1)
        return [self.batches[i][2] for i in which.tolist() if i >= 0]

    # --- acquiring ---------------------------------------------------------------------------
    def acquire(self, member: int, n: int, now: float, lock_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` available and due records that are buffered: now ``member``'s until
        ``now + lock_s``. Returns (offsets, delivery counts)."""
        have = self.buf_end - self.start
        if n <= 0 or have <= 0:
            return _NONE, _NONE
        st, un = self.state[:have], self.until[:have]
        idx = np.flatnonzero((st == AVAILABLE) & (un <= now))[:n]
        if not len(idx):
            return _NONE, _NONE
        self.redelivered += int(np.count_nonzero(self.count[idx]))
        self.state[idx] = ACQUIRED
        self.count[idx] += 1
        self.until[idx] = now + lock_s
        self.owner[idx] = member
        return idx + self.start, self.count[idx].astype(np.int64)

    def wants_read(self, max_in_flight: int) -> bool:
        """Whether reading more of the log would give something to acquire: the window's bytes
        are missing (after a restart), or it has room for records never read."""
        return not self.fetching and (self.buf_end < self.end or self.end - self.start < max_in_flight)

    def due_at(self) -> float:
        """The earliest time something becomes acquirable again without an acknowledgement (a
        lock ending, a delayed release due), or inf."""
        have = self.end - self.start
        if not have:
            return float("inf")
        waiting = (self.state == ACQUIRED) | ((self.state == AVAILABLE) & (self.until > 0))
        return float(self.until[waiting].min()) if waiting.any() else float("inf")

    # --- acknowledging -------------------------------------------------------------------------
    def acknowledge(self, member: int, first: int, last: int, kind: int, delay_s: float | None, error: str,
                    now: float, limit: int, backoff_s: list[float]) -> int:
        """Apply one range for ``member``; returns how many offsets of it the member did not hold
        (nothing changed for those)."""
        lo, hi = max(first, self.start) - self.start, min(last + 1, self.end) - self.start
        asked = last - first + 1
        if hi <= lo:
            return asked
        held = (self.state[lo:hi] == ACQUIRED) & (self.owner[lo:hi] == member)
        idx = np.flatnonzero(held) + lo
        if len(idx):
            self.dirty = True
            if kind == ACCEPT:
                self.state[idx] = ACKNOWLEDGED
            elif kind == RELEASE:
                self._release(idx, now, limit, delay_s, backoff_s)
            else:  # REJECT: never delivered again; to the dead-letter topic
                self.state[idx] = DEAD
            if error and kind != ACCEPT:
                self.errors.update(dict.fromkeys((idx + self.start).tolist(), error))
            self.owner[idx] = -1
            self.advance()
        return asked - len(idx)

    def _release(self, idx: np.ndarray, now: float, limit: int, delay_s: float | None, backoff_s: list[float]) -> None:
        counts = self.count[idx]
        spent = counts >= limit
        self.state[idx] = np.where(spent, DEAD, AVAILABLE)
        if delay_s is None:  # the group's schedule, by delivery count (RocketMQ's retry levels)
            table = np.asarray(backoff_s or [0.0], np.float64)
            delay = table[np.minimum(counts.astype(np.int64), len(table)) - 1]
        else:
            delay = np.full(len(idx), delay_s)
        self.until[idx] = np.where(delay > 0, now + delay, 0.0)

    def expire(self, now: float, limit: int) -> int:
        """Locks past their end: the records go back (or to the dead letters at the limit)."""
        if self.end == self.start:
            return 0
        idx = np.flatnonzero((self.state == ACQUIRED) & (self.until <= now))
        if len(idx):
            self._release(idx, now, limit, 0.0, [])
            self.owner[idx] = -1
            self.dirty = True
            self.advance()
        return len(idx)

    def release_member(self, member: int, now: float, limit: int) -> int:
        """A member left or its session ended: what it held goes back now."""
        if self.end == self.start:
            return 0
        idx = np.flatnonzero((self.state == ACQUIRED) & (self.owner == member))
        if len(idx):
            self._release(idx, now, limit, 0.0, [])
            self.owner[idx] = -1
            self.dirty = True
        return len(idx)

    def dead(self, n: int) -> np.ndarray:
        """Up to ``n`` offsets waiting for the dead-letter topic, buffered ones only."""
        have = self.buf_end - self.start
        return np.flatnonzero(self.state[:max(have, 0)] == DEAD)[:n] + self.start

    def archive(self, offsets: np.ndarray) -> None:
        idx = offsets - self.start
        idx = idx[(idx >= 0) & (idx < self.end - self.start)]
        self.state[idx] = ARCHIVED
        self.dead_total += len(idx)
        for o in offsets.tolist():
            self.errors.pop(o, None)
        self.dirty = True
        self.advance()

    def advance(self) -> None:
        """Move ``start`` past the done prefix; drop the arrays' and the batches' part below it."""
        done = _DONE[self.state]
        k = len(done) if done.all() else int(np.argmin(done))
        if not k:
            return
        self.start += k
        self.state, self.count, self.until, self.owner = self.state[k:], self.count[k:], self.until[k:], self.owner[k:]
        self.buf_end = max(self.buf_end, self.start)
        cut = 0
        while cut < len(self.batches) and self.batches[cut][1] <= self.start:
            cut += 1
        if cut:
            del self.batches[:cut]
        if self.errors:
            self.errors = {o: e for o, e in self.errors.items() if o >= self.start}

    # --- describing and persisting ---------------------------------------------------------------
    def counts_by_state(self) -> dict[int, int]:
        return dict(zip(*(a.tolist() for a in np.unique(self.state, return_counts=True))))

    def histogram(self) -> list[int]:
        live = ~_DONE[self.state]
        return np.bincount(self.count[live]).tolist() if live.any() else []

    def dead_batch(self, group: str, offs: np.ndarray) -> bytes:
        """The dead records as one batch: their keys, values and headers, and where they came from
        (one step per dead record: a dead letter is the exception, not the stream)."""
        want = set(offs.tolist())
        values, keys, headers = [], [], []
        for v in iter_batches(b"".join(self.body_for(offs))):
            hs = v.headers.lists() if v.headers is not None else None
            for i in range(v.record_count):
                o = v.base_offset + i
                if o not in want:
                    continue
                want.discard(o)
                values.append(v.value(i))
                keys.append(v.key(i))
                idx = o - self.start
                prov = [(S.DLQ_TOPIC, self.topic.encode()), (S.DLQ_PARTITION, str(self.partition).encode()),
                        (S.DLQ_OFFSET, str(o).encode()), (S.DLQ_COUNT, str(int(self.count[idx])).encode()),
                        (S.DLQ_GROUP, group.encode())]
                if o in self.errors:
                    prov.append((S.DLQ_ERROR, self.errors[o].encode()))
                headers.append(list(hs[i] if hs else ()) + prov)
        keyless = all(k is None for k in keys)
        return R.encode_batch(values, None if keyless else [k or b"" for k in keys], headers=headers)

    def snapshot(self, group: str) -> SnapshotRecord:
        states = np.where(self.state == ACQUIRED, AVAILABLE, self.state).astype(np.uint8)
        wall = time.time() - time.monotonic()
        later = np.flatnonzero((self.state == AVAILABLE) & (self.until > 0))
        delayed = [(o, int((u + wall) * 1000)) for o, u in zip((later + self.start).tolist(), self.until[later].tolist())]
        return SnapshotRecord(group, self.topic, self.partition, self.start, self.end, states.tobytes(),
                              self.count.astype("<u2").tobytes(), delayed, dict(self.errors), topic_id=self.topic_id,
                              version=self.version, epoch=self.epoch)

    @classmethod
    def restore(cls, rec: SnapshotRecord) -> "SharePartition":
        sp = cls(rec.topic, rec.partition, rec.start, rec.topic_id)
        n = rec.end - rec.start
        sp._grow(rec.end)
        sp.buf_end = rec.start  # the bytes are read again
        if n:
            sp.state[:] = np.frombuffer(rec.states, np.uint8)[:n]
            sp.count[:] = np.frombuffer(rec.counts, "<u2")[:n]
        wall = time.time() - time.monotonic()
        for offset, due_ms in rec.delayed:
            if rec.start <= offset < rec.end:
                sp.until[offset - rec.start] = due_ms / 1000 - wall
        sp.errors = {int(o): e for o, e in rec.errors.items()}
        sp.version, sp.epoch = rec.version, rec.epoch
        return sp


_NONE = np.zeros(0, np.int64)


def ranges(offsets: np.ndarray, counts: np.ndarray) -> list[AcquiredRange]:
    """Sorted offsets and their delivery counts as runs of consecutive offsets with one count."""
    if not len(offsets):
        return []
    breaks = np.flatnonzero((np.diff(offsets) != 1) | (np.diff(counts) != 0)) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks - 1, [len(offsets) - 1]])
    return [AcquiredRange(int(f), int(l), int(c)) for f, l, c in
            zip(offsets[firsts].tolist(), offsets[lasts].tolist(), counts[firsts].tolist())]
