"""Retention: log starts that advance with time, and journal segments that go when no one needs them.

A topic keeps records for ``retention.ms`` (its own config, else the broker's ``retention_ms``;
-1 keeps them forever) and, per partition, at most ``retention.bytes`` of batches (else the
broker's ``retention_bytes``; -1: no limit). Every ``retention_check_ms``, and whenever the
journal rolls to a new segment, the flusher (``Retention.run``) moves each partition's *log
start* up to its first record appended within that time, found by the same binary search as seek
by time (persistence/timesearch.py), and further, whole batches at a time, until what is left
fits the byte limit (``ByteCount``: the bytes of each partition's kept batches, counted from the
index as batches arrive and leave, each entry read twice in its life). Readers see it at once: a fetch below
the log start is ``OFFSET_OUT_OF_RANGE`` carrying the new start, whether or not the bytes are gone.

The journal is shared by all partitions, so bytes go only as whole segments, oldest first, and
only once no partition still keeps records in them: a segment goes when it ends at or below the
journal position of every partition's log-start record (``pin``). A partition whose records are
all expired pins nothing. A long-retention topic therefore keeps every segment from its oldest
record on, for everyone (docs/DESIGN.md, "Retention": the ``journal_pinned_by`` gauge names it).

Crash safety, in this order, each step durable before the next:

1. new log starts are written to ``journal/log_starts.json`` (atomic rename, fsynced) and only
   then published in the control table: a log start never moves backwards, even through a host
   crash (it never passes the durable watermark, so recovery never finds the journal below it);
2. segments are deleted by the log starts just written: a fetch that read a log start just
   before it moved and finds its segment gone is answered ``OFFSET_OUT_OF_RANGE`` (what it asked
   for has expired), and the other readers of the journal start at the log start as it is now;
3. the checkpoint's segment and every later one are never deleted (recovery scans from it), and
   recovery treats index entries below a log start as gone (persistence/recovery.py).

A full disk deletes nothing inside retention by default: the flusher refuses produce until
there is room again (persistence/diskguard.py; RocketMQ's delete-the-oldest is an opt-in policy
there, which uses ``expire_below`` below).

The pass takes a narrow handle (persistence/handles.py ``Storage``: settings, catalog, the
table's columns, the index cache, the journal bounds), never the flusher. It reads no row and
no index itself: each partition's offsets, index and log-start store are its ``PartitionLog``
(persistence/log.py ``PartitionLog.of_flusher``, one per slot, over those handles), which
stores one word of the control table, ``log_start_offset``, through the documented exception
for it (shm/rows.py ``FlusherColumns.advance_log_starts``: the flusher is that word's one
writer once a row is active; a start never moves down). What stays here is the policy and the
files all partitions share: the times and byte limits, the stored starts (``log_starts.json``),
and the journal's segments.

Index files shrink with the log: the entries below a log start are punched out of the file
(``fallocate(PUNCH_HOLE)``: the file keeps its offsets, the blocks are freed).

Truncation (persistence/truncation.py): a partition whose owner asked for a cut of its log keeps
its log start until the cut is made; a cut forgets the partition's byte count (``cut``); a cut
marker goes once every segment below its journal position is deleted (``delete_segments``), and
with its slot's topic (``forget``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from tailrace.broker import datadir
from tailrace.broker.datadir import JOURNAL_DIR, LOG_STARTS_FILE, fsync_dir, segment_name, write_atomic
from tailrace.shm.rows import FlusherHeader

from .diskguard import DiskGuard
from .handles import Storage
from .index import PAGE_ENTRIES
from .journal import JournalReader, list_segments
from . import log as log_mod
from .log import PartitionLog, active_slots

log = logging.getLogger("tailrace.retention")

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
FOREVER = -1


def log_starts_path(data_dir) -> Path:
    return Path(data_dir) / JOURNAL_DIR / LOG_STARTS_FILE


def read_log_starts(data_dir) -> dict[int, int]:
    """{slot: log start} as last written (slots not in it start at 0)."""
    try:
        doc = json.loads(log_starts_path(data_dir).read_text())
        return {int(k): int(v) for k, v in doc["log_starts"].items()}
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def read_log_start_topics(data_dir) -> dict[int, int]:
    """{slot: the topic id its stored log start belongs to} (a file written before topic ids were
    stored has none: those starts are trusted only where the slot's row says nothing else)."""
    try:
        doc = json.loads(log_starts_path(data_dir).read_text())
        return {int(k): int(v) for k, v in doc.get("topic_ids", {}).items()}
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_log_starts(data_dir, starts: dict[int, int], topics: dict[int, int] | None = None) -> None:
    """Store each slot's log start with the id of the topic it belongs to: a slot is given to a
    new topic once its deleted one's is cleared, and a start must never be read as the new one's."""
    kept = {k: int(v) for k, v in sorted(starts.items()) if v > 0}
    doc = {"log_starts": {str(k): v for k, v in kept.items()}}
    if topics:
        doc["topic_ids"] = {str(k): int(topics[k]) for k in kept if k in topics}
    body = json.dumps(doc).encode()
    write_atomic(log_starts_path(data_dir), body)


def retention_ms(topic, default_ms: int) -> int:
    return int((getattr(topic, "config", None) or {}).get(RETENTION_MS, default_ms))


def retention_bytes(topic, default_bytes: int) -> int:
    return int((getattr(topic, "config", None) or {}).get(RETENTION_BYTES, default_bytes))


class ByteCount:
    """The bytes of the batches of one partition that start in ``[start, end)``, read through
    its ``PartitionLog`` (``batch_sizes``, ``next_batch_start``)."""

    __slots__ = ("start", "end", "bytes")

    def __init__(self, start: int):
        self.start = self.end = start
        self.bytes = 0

    def moved_to(self, plog: PartitionLog, start: int, end: int) -> None:
        """Follow the log start up to ``start`` and the indexed end up to ``end``."""
        if start >= self.end:  # everything counted has gone: count afresh from there
            self.start = self.end = start
            self.bytes = 0
        elif start > self.start:
            self.bytes -= int(plog.batch_sizes(self.start, start)[1].sum())
            self.start = start
        if end > self.end:
            self.bytes += int(plog.batch_sizes(self.end, end)[1].sum())
            self.end = end

    def start_within(self, plog: PartitionLog, limit: int) -> int:
        """The first batch start from which the kept batches fit ``limit`` bytes: the oldest
        batches are read until they cover the excess (what came since the last pass)."""
        excess = self.bytes - limit
        at = self.start
        while excess > 0 and at < self.end:
            hi = min(self.end, at + log_mod.CHUNK)
            offs, sizes = plog.batch_sizes(at, hi)
            cum = np.cumsum(sizes)
            k = int(np.searchsorted(cum, excess, side="left"))  # dropping batches 0..k is enough
            if k < len(offs):
                return int(offs[k + 1]) if k + 1 < len(offs) else plog.next_batch_start(hi, self.end)
            excess -= int(cum[-1]) if len(cum) else 0
            at = hi
        return self.start if excess <= 0 else self.end


def crash_point(s, step: str) -> None:
    """Fault injection (``debug_crash_at``): die here as a kill -9 would, once per data directory."""
    if s.debug_crash_at != step:
        return
    marker = Path(s.data_dir) / datadir.crash_marker_name(step)
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    log.error("debug_crash_at=%s: dying here", step)
    os._exit(137)


class Retention:
    """The flusher's retention pass (``run``), with what it has published and deleted."""

    def __init__(self, store: Storage, header: FlusherHeader, truncations=None):
        self.s = store.s
        self.cols = store.cols  # the control table: given to each PartitionLog (reads; its log start store)
        self.catalog = store.catalog
        self.indexes = store.indexes
        self.bounds = store.bounds
        self.journal_dir = Path(self.s.data_dir) / JOURNAL_DIR
        self.starts: dict[int, int] = read_log_starts(self.s.data_dir)  # slot -> log start, as written
        self.start_topics: dict[int, int] = read_log_start_topics(self.s.data_dir)  # slot -> topic id of its stored start
        self.punched: dict[int, int] = {}  # slot -> index entries punched out so far
        self.reader: JournalReader | None = None
        self.next_ns = 0
        self.segments_deleted = 0
        self.bytes_deleted = 0
        self.pinned_by = -1  # the slot whose log start keeps the oldest segment (-1: none)
        self.counts: dict[int, ByteCount] = {}  # slot -> bytes kept, for partitions with a byte limit
        self.first_times: dict[int, tuple[int, int]] = {}  # slot -> (log start, its append time us), as last read
        # slot -> (a log start, its batch's journal position): an index entry never changes once
        # written (a cut forgets it), so a pass reads the index of the partitions whose start moved
        # only (10,000 idle partitions were 10,000 index reads a pass)
        self.pins: dict[int, tuple[int, int]] = {}
        self.logs: dict[int, PartitionLog] = {}  # slot -> its log: offsets, index, log-start store (``log_of``)
        self.guard = DiskGuard(store, header, self)  # storage full: refuse produce, or delete inside retention (opt in)
        # the cut markers (persistence/truncation.py ``Truncations``): a marker goes with the last segment
        # it could cut from, and with its slot's topic (``forget``); None: an in-process probe without them
        self.truncations = truncations

    def forget(self, slots) -> None:
        """Drop what is kept of ``slots`` (a deleted topic's, persistence/retire.py); if a stored
        log start went with them, write the file without it; their truncation markers too."""
        stored = False
        for slot in slots:
            stored |= self.starts.pop(slot, None) is not None
            self.start_topics.pop(slot, None)
            for d in (self.punched, self.counts, self.first_times, self.pins, self.logs):
                d.pop(slot, None)
        if self.pinned_by in slots:
            self.pinned_by = -1
        if stored:
            write_log_starts(self.s.data_dir, self.starts, self.start_topics)
        if self.truncations is not None:
            self.truncations.forget(slots)

    def cut(self, slot: int) -> None:
        """``slot``'s log was cut back (persistence/truncation.py): what was counted of its tail
        (its kept bytes, the time at its log start) is counted again from the index."""
        self.counts.pop(slot, None)
        self.first_times.pop(slot, None)
        self.pins.pop(slot, None)

    def log_of(self, slot: int) -> PartitionLog:
        """The flusher's ``PartitionLog`` of ``slot`` (made on first use, over this pass's
        journal reader, the table's columns and the index cache)."""
        plog = self.logs.get(slot)
        if plog is None:
            if self.reader is None:
                self.reader = JournalReader(self.s.data_dir, self.s.segment_bytes)
            plog = self.logs[slot] = PartitionLog.of_flusher(self.cols, self.indexes, slot, self.reader)
        return plog

    def publish(self) -> None:
        """Put the stored log starts into the control table (at boot, after recovery)."""
        for slot, start in self.starts.items():
            plog = self.log_of(slot)
            if plog.active and self._owns(slot, plog.topic_id):
                plog.advance_log_start(min(start, plog.high_watermark))

    def _owns(self, slot: int, topic_id: int) -> bool:
        """Whether the stored start of ``slot`` belongs to topic ``topic_id`` (a start stored
        without a topic id, by an older broker, is taken to)."""
        owner = self.start_topics.get(slot)
        return owner is None or owner == topic_id

    def stored_start(self, slot: int, active: bool) -> int:
        """The stored log start of ``slot`` if it is its present topic's (the row's, or the
        catalog's for a row not active), else 0: never a deleted topic's start for a new one."""
        if slot not in self.starts:
            return 0
        if active:
            topic_id = self.log_of(slot).topic_id
        else:
            entry = self.catalog.by_slot.get(slot)
            if entry is None:
                return 0
            topic_id = entry[0].topic_id
        return self.starts[slot] if self._owns(slot, topic_id) else 0

    def _store(self, moved: dict[int, int]) -> None:
        """Record new starts with their topics' ids and write them, durably."""
        for slot in moved:
            plog = self.log_of(slot)
            row_topic = plog.topic_id if plog.active else 0
            entry = self.catalog.by_slot.get(slot)
            self.start_topics[slot] = row_topic or (entry[0].topic_id if entry else 0)
        self.starts.update(moved)
        write_log_starts(self.s.data_dir, self.starts, self.start_topics)

    def due(self, now_ns: int) -> bool:
        return now_ns >= self.next_ns

    def run(self, now_ns: int, bytes_only: bool = False) -> None:
        """A pass: move log starts, delete what no partition needs, shrink indexes. With
        ``bytes_only`` (at each new journal segment) only byte limits are applied: they must keep
        up with the writes, times need not."""
        if not bytes_only:
            self.next_ns = now_ns + self.s.retention_check_ms * 1_000_000
        self.catalog.reload()  # one stat; a topic it did not know would pin nothing
        self._advance(bytes_only)
        self.delete_segments()
        self.guard.check(now_ns)
        self._punch(self.starts)

    # --- 1. log starts -------------------------------------------------------------------
    def _advance(self, bytes_only: bool = False) -> None:
        now_us = time.time_ns() // 1000
        moved: dict[int, int] = {}
        for slot, (topic, _p) in self.catalog.by_slot.items():
            keep_ms = -1 if bytes_only else retention_ms(topic, self.s.retention_ms)
            keep_bytes = retention_bytes(topic, self.s.retention_bytes)
            if bytes_only and keep_bytes < 0:
                continue
            plog = self.log_of(slot)  # a slot past the table reads as not active
            if (keep_ms < 0 and keep_bytes < 0) or not plog.active:
                self.counts.pop(slot, None)
                continue
            if plog.cutting:  # a cut is asked (persistence/truncation.py): its log start waits for it
                continue
            start = plog.log_start_offset
            end = plog.durable_indexed_end()
            if end <= start:
                continue
            new = start
            if keep_ms >= 0:
                cutoff = now_us - keep_ms * 1000
                known = self.first_times.get(slot)
                if known is None or known[0] != start or known[1] < cutoff:  # else nothing can have expired: no read
                    found = plog.first_indexed_at_or_after(cutoff, start, end)
                    new = end if found is None else found[0]
                    if found is not None:
                        self.first_times[slot] = found  # the append time at the (new) log start
            if keep_bytes >= 0:
                count = self.counts.get(slot)
                if count is None:
                    count = self.counts[slot] = ByteCount(start)
                count.moved_to(plog, new, end)
                new = max(new, count.start_within(plog, keep_bytes))
                count.moved_to(plog, new, end)
            else:
                self.counts.pop(slot, None)
            if new > start:
                moved[slot] = new
        if not moved:
            return
        self._store(moved)  # durable before any reader sees them
        crash_point(self.s, "log_starts_written")
        for slot, new in moved.items():
            self.log_of(slot).advance_log_start(new)
        log.info("retention: log start moved in %d partitions (%s)", len(moved),
                 ", ".join(f"slot {s} -> {o}" for s, o in list(moved.items())[:8]))

    # --- 2. segments ---------------------------------------------------------------------
    def pin(self, starts: dict[int, int]) -> tuple[int, int]:
        """(the lowest journal position a partition still needs, the slot that needs it)."""
        low, who = 1 << 62, -1
        active = active_slots(self.cols.rows)
        for slot in sorted(active | set(self.catalog.by_slot)):  # every partition there is, by either account
            plog, live = self.log_of(slot), slot in active
            # the stored start only if it is this topic's: a deleted topic's start on a slot a new
            # topic took would say the new one's records had all expired, and its segments would go
            stored = self.stored_start(slot, live) if starts is self.starts else starts.get(slot, 0)
            start = max(stored, plog.log_start_offset if live else 0)
            end = plog.kept_end(live)
            if start >= end:
                continue  # every record expired (or none): pins nothing
            pinned = self.pins.get(slot)
            if pinned is not None and pinned[0] == start:
                position = pinned[1]
            else:
                position = plog.position_of(start)
                if position is None:
                    position = 0  # no entry where one must be: keep everything
                else:
                    self.pins[slot] = (start, position)
            if position < low:
                low, who = position, slot
        return low, who

    def delete_segments(self) -> None:
        """Delete the segments below every partition's log-start record (as stored), the
        checkpoint's segment and the one being written."""
        low, who = self.pin(self.starts)
        self.pinned_by = who
        keep = min(low - low % self.s.segment_bytes, self.bounds.keep_from(self.s.segment_bytes))
        gone = [seg for seg in list_segments(self.journal_dir) if seg + self.s.segment_bytes <= keep]
        for seg in gone:
            path = self.journal_dir / segment_name(seg)
            size = path.stat().st_size
            path.unlink()
            self.segments_deleted += 1
            self.bytes_deleted += size
            if len(gone) > 1:
                crash_point(self.s, "one_segment_deleted")
        if gone:
            fsync_dir(self.journal_dir)
            if self.reader is not None:
                self.reader.drop_unlinked()  # our own cached descriptors of them
            log.info("retention: deleted %d journal segments below position %d (oldest kept record: slot %d)",
                     len(gone), keep, who)
        if self.truncations is not None and self.truncations.marks:
            left = list_segments(self.journal_dir)
            if left:
                self.truncations.prune(left[0])  # a marker below every segment left has nothing to cut

    # --- the disk guard (persistence/diskguard.py) ---------------------------------------
    def expire_below(self, position: int) -> int:
        """Move every log start whose record lies below journal ``position`` past it, durably
        first (the disk guard's ``delete_oldest`` only); the number of records it took."""
        active = active_slots(self.cols.rows)
        moved, was = {}, {}  # slot -> new log start, slot -> the start it had
        for slot in sorted(active | set(self.catalog.by_slot)):
            plog, live = self.log_of(slot), slot in active
            start = max(self.stored_start(slot, live), plog.log_start_offset if live else 0)
            end = plog.kept_end(live)
            if start >= end or (live and plog.cutting):
                continue
            at = plog.position_of(start)
            if at is not None and at < position:
                moved[slot], was[slot] = plog.first_at_position(start, end, position), start
        if not moved:
            return 0
        self._store(moved)
        for slot in moved:
            if slot in active:
                self.log_of(slot).advance_log_start(moved[slot])
        log.warning("disk guard: log start moved inside retention in %d partitions (%s)", len(moved),
                    ", ".join(f"slot {s} -> {o} ({o - was[s]} records)" for s, o in list(moved.items())[:8]))
        return sum(new - was[slot] for slot, new in moved.items())

    # --- 3. indexes ----------------------------------------------------------------------
    def _punch(self, starts: dict[int, int]) -> None:
        for slot, start in starts.items():
            if start - self.punched.get(slot, 0) >= PAGE_ENTRIES and slot in self.catalog.by_slot \
                    and self.stored_start(slot, False) == start:  # this topic's start, not a deleted one's
                if self.log_of(slot).release_index_below(start):
                    self.punched[slot] = start

    def close(self) -> None:
        self.logs.clear()  # nothing of their own to close: the index cache's files are the flusher's
        if self.reader is not None:
            self.reader.close()
            self.reader = None
