"""One partition's log (Kafka's ``UnifiedLog`` role): its offsets, its index, its journal reads.

A ``PartitionLog`` owns what fetch, list-offsets, seek by time, retention and recovery used to
read each on their own, reaching into the control row and the index:

- the offsets, from the partition's control-table row (shm/layout.py): ``log_start_offset``
  (line 0: boot and retention move it, never down: ``advance_log_start``), ``high_watermark``
  (``next_offset``, line 1: the owner's), ``durable_watermark`` (``durable_offset``) and
  ``flushed_offset`` (line 2: the flusher's). Every read is one int64 load: what one call sees
  is consistent per word only;
- the dense index file of the slot (persistence/index.py), opened on first use and opened again
  when the cached one was unlinked (a deleted topic's index goes when the flusher clears its
  slot, persistence/retire.py, and a new topic that takes the slot gets a fresh file: a
  descriptor cached by slot alone would go on reading the old topic's entries). What retention
  asks of it: the batches and their sizes in a range of offsets, the journal position of an
  offset's batch, the first offset at a position or a time, and the blocks below the log start
  given back; what recovery asks: how many entries lie below a journal position, whether the
  last of them matches the journal, the scanned batches' entries written, the index cut to the
  journal's truth and synced;
- the journal read of a fetch below the ring (``read``: batches through the index, one reply
  buffer), and the time lookup (``offset_for_time``: the indexed part by binary search,
  persistence/timesearch.py, the rest from the ring).

Three kinds, one class: a worker's (``PartitionLog(row, data_dir, slot, journal)``: reads the
row, never stores to it, its own read-only index descriptor); the flusher's (``of_flusher``:
retention's, the index from the flusher's writable cache, persistence/handles.py
``IndexCache``, and one store, the log start, through shm/rows.py ``FlusherColumns``); and
recovery's (``at_recovery``: before any control table, so no row, and its own writable index).

Concurrency contract: one object belongs to one thread (the worker's loop, its disk-reader
thread, the flusher's main thread), each with its own; not safe to share between threads. Only
the flusher's stores (the log start, one word, never down) and only the flusher's and
recovery's write an index (the flusher is the index's one writer). Replication will add the
leader epoch and the follower state here.

Vocabulary (README glossary): an offset is a record number, a position a byte in the journal.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.client.protocol import ErrorCode
from tailrace.client.records import COUNT, COUNT_AT, PREFIX_BYTES, align8_array, iter_batches, read_header
from tailrace.client.ring_reader import TailStatus
from tailrace.shm.layout import COL, ROW_WORDS

from .index import ENTRY_DTYPE, IndexFile, first_at_position, punch_below
from .journal import JournalReader
from .timesearch import first_at_or_after

READ_DELAY_S = 0.0  # fault injection for tests (settings.debug_read_delay_ms): a slow disk
RING_SCAN_BYTES = 4 << 20  # one ring read of the time lookup's unindexed tail
CHUNK = 1 << 16  # index entries read at once by the batch walks (batch_sizes, next_batch_start)
_LOG_START, _NEXT, _DURABLE, _FLUSHED = (COL[n] for n in ("log_start_offset", "next_offset", "durable_offset", "flushed_offset"))
_ACTIVE, _TOPIC_ID, _CUT = COL["active"], COL["topic_id"], COL["truncate_request"]
_NO_ROW = np.zeros(ROW_WORDS, dtype=np.int64)  # a slot without a row (recovery; past the table): reads as not active
_NO_ROW.flags.writeable = False


def active_slots(rows: np.ndarray) -> set[int]:
    """The slots whose control-table row is active: every partition the table serves (one numpy
    pass over the table, no Python step per row)."""
    return set(np.flatnonzero(rows[:, _ACTIVE] == 1).tolist())


@dataclass
class FetchResult:
    code: int
    parts: list  # buffers to join into the body frame
    next_offset: int
    source: str


@dataclass
class DiskRead:
    """A fetch that must read the journal: offsets ``offset..limit`` are flushed and indexed."""

    slot: int
    offset: int
    max_bytes: int
    max_records: int
    limit: int  # min(watermark, flushed_offset) when the fetch arrived


class PartitionLog:
    def __init__(self, row: np.ndarray, data_dir: str, slot: int, journal: JournalReader | None,
                 indexes=None, cols=None, writable: bool = False):
        self.row = row  # the slot's int64 control words, read only here
        self.data_dir, self.slot, self.journal = data_dir, slot, journal
        self.indexes = indexes  # the flusher's IndexCache (its writable files, never closed here), or None: our own
        self.cols = cols  # the flusher's FlusherColumns: the log start's one store, or None: the row read only
        self.writable = writable or indexes is not None  # whether this log may write its index
        self._index: IndexFile | None = None

    @classmethod
    def of_flusher(cls, cols, indexes, slot: int, journal: JournalReader) -> "PartitionLog":
        """The flusher's (retention's) log of ``slot``: the row through its columns (a slot past
        the table reads as a row not active), the index from its cache, the log start storable."""
        rows = cols.rows
        row = rows[slot] if slot < len(rows) else _NO_ROW
        return cls(row, indexes.data_dir, slot, journal, indexes=indexes, cols=cols)

    @classmethod
    def at_recovery(cls, data_dir, slot: int) -> "PartitionLog":
        """Recovery's log of ``slot``: no control table yet (the row reads as zeros), its own
        index opened writable (made if missing), closed by ``close``."""
        return cls(_NO_ROW, data_dir, slot, None, writable=True)

    # --- offsets ---------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return int(self.row[_LOG_START])

    @property
    def high_watermark(self) -> int:
        return int(self.row[_NEXT])

    @property
    def durable_watermark(self) -> int:
        return int(self.row[_DURABLE])

    @property
    def flushed_offset(self) -> int:
        return int(self.row[_FLUSHED])

    def offsets(self) -> tuple[int, int, int]:
        """(log start, high watermark, durable watermark) in one call: a fetch reply's three."""
        return int(self.row[_LOG_START]), int(self.row[_NEXT]), int(self.row[_DURABLE])

    def watermark(self, isolation: str) -> int:
        return int(self.row[_DURABLE if isolation == "durable" else _NEXT])

    @property
    def active(self) -> bool:
        return bool(self.row[_ACTIVE])

    @property
    def topic_id(self) -> int:
        return int(self.row[_TOPIC_ID])

    @property
    def cutting(self) -> bool:
        """Whether the owner asked for a cut of the log not yet made (persistence/truncation.py)."""
        return bool(self.row[_CUT])

    def durable_indexed_end(self) -> int:
        """The end of what is both durable and indexed: min(durable watermark, flushed offset),
        the most retention may judge."""
        return min(int(self.row[_DURABLE]), int(self.row[_FLUSHED]))

    def kept_end(self, active: bool) -> int:
        """The end of what the partition keeps on disk: its flushed offset while its row is
        ``active`` (as the caller saw it), else its index's entry count (only the index says)."""
        return int(self.row[_FLUSHED]) if active else self.index().entry_count()

    def advance_log_start(self, start: int) -> None:
        """Move the published log start up to ``start`` (never down), the flusher's one store to
        the row (shm/rows.py ``FlusherColumns.advance_log_starts``). Retention calls it only
        once the new start is durable (persistence/retention.py, ``log_starts.json``)."""
        assert self.cols is not None, f"slot {self.slot}: a reader's PartitionLog stores nothing: use PartitionLog.of_flusher"
        if self.row is not _NO_ROW:
            self.cols.advance_log_starts([self.slot], [start])

    # --- the index -------------------------------------------------------------------------
    def index(self) -> IndexFile:
        """The slot's index file, opened again if the cached one was unlinked (one fstat); the
        flusher's comes from its cache, which forgets a slot before its file is removed."""
        if self.indexes is not None:
            return self.indexes.get(self.slot)
        index = self._index
        if index is not None and os.fstat(index.fd).st_nlink == 0:
            index.close()
            index = None
        if index is None:
            index = self._index = IndexFile(self.data_dir, self.slot, writable=self.writable)
        return index

    def index_unlinked(self) -> bool:
        """Whether the cached index file was deleted (its topic was): ``close`` lets its blocks go."""
        return self._index is not None and os.fstat(self._index.fd).st_nlink == 0

    # --- the index, as retention asks ------------------------------------------------------
    def batch_sizes(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, frame bytes) of the batches starting in offsets ``[a, b)``, read from the
        index ``CHUNK`` entries at a time."""
        index = self.index()
        offs, sizes = [], []
        while a < b:
            e = index.read(a, min(CHUNK, b - a))
            if not len(e):
                break
            starts = np.flatnonzero(e["rel"] == 0)
            offs.append(starts + a)
            sizes.append(align8_array(e["length"][starts]))
            a += len(e)
        if not offs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(offs), np.concatenate(sizes)

    def next_batch_start(self, a: int, end: int) -> int:
        """The first batch start at or after offset ``a`` (``end`` if none before it)."""
        index = self.index()
        while a < end:
            e = index.read(a, min(CHUNK, end - a))
            if not len(e):
                break
            starts = np.flatnonzero(e["rel"] == 0)
            if len(starts):
                return a + int(starts[0])
            a += len(e)
        return end

    def position_of(self, offset: int) -> int | None:
        """The journal position of the batch holding ``offset``; None if the index has no entry there."""
        e = self.index().read(offset, 1)
        return int(e["position"][0]) if len(e) else None

    def first_at_position(self, lo: int, hi: int, position: int) -> int:
        """The first offset in ``[lo, hi)`` whose batch sits at or after journal ``position`` (``hi`` if none)."""
        return first_at_position(self.index(), lo, hi, position)

    def first_indexed_at_or_after(self, t_us: int, lo: int, hi: int) -> tuple[int, int] | None:
        """The first batch of indexed offsets ``[lo, hi)`` appended at or after ``t_us``: (its first
        offset, its append time us), or None (persistence/timesearch.py, through ``journal``)."""
        return first_at_or_after(self.index(), self.journal, lo, hi, t_us)

    def release_index_below(self, offset: int) -> bool:
        """Give back the index blocks wholly below ``offset``'s entry (a log start: the entries
        read as zeros from then on); False where the filesystem cannot punch holes."""
        return punch_below(self.index().fd, offset)

    # --- the index, as recovery asks -------------------------------------------------------
    def entry_count(self) -> int:
        return self.index().entry_count()

    def entries_below(self, position: int) -> int:
        """How many index entries lie below journal ``position`` (a binary search over the
        entries' positions, which only grow in a sound index)."""
        index = self.index()
        n = index.entry_count()
        if not n:
            return 0
        mm = np.memmap(index.path, dtype=ENTRY_DTYPE, mode="r", shape=(n,))
        try:
            return int(np.searchsorted(mm["position"], position, side="left"))
        finally:
            del mm

    def last_entry_matches(self, n: int, topic_id: int, partition: int, segment_bytes: int) -> bool:
        """Does index entry ``n - 1`` point at a batch of this partition that ends exactly at
        offset ``n``? (Its journal header, read from the segment file, says.)"""
        e = self.index().read(n - 1, 1)
        if not len(e):
            return False
        pos, rel = int(e["position"][0]), int(e["rel"][0])
        seg = pos - pos % segment_bytes
        try:
            with open(os.path.join(self.data_dir, JOURNAL_DIR, segment_name(seg)), "rb") as f:
                f.seek(pos - seg)
                raw = f.read(PREFIX_BYTES)
        except OSError:
            return False
        if len(raw) < PREFIX_BYTES:
            return False
        h = read_header(raw)
        return (h["topic_id"] == topic_id and h["partition"] == partition and h["base_offset"] == n - 1 - rel
                and h["base_offset"] + h["record_count"] == n and h["length"] == int(e["length"][0]))

    def write_entries(self, first_offset: int, entries: np.ndarray) -> None:
        """Write index entries (persistence/index.py ``entries_for``) from ``first_offset`` on."""
        assert self.writable, f"slot {self.slot}: a reader's PartitionLog writes no index: use at_recovery or of_flusher"
        self.index().write(first_offset, entries)

    def truncate_index(self, end: int) -> None:
        """Cut (or extend with zeros) the index to ``end`` entries: the journal's truth, or a log
        start above the records that are left."""
        assert self.writable, f"slot {self.slot}: a reader's PartitionLog truncates no index"
        index = self.index()
        if index.entry_count() != end:
            index.truncate(end)

    def sync_index(self) -> None:
        self.index().sync()

    # --- reads -----------------------------------------------------------------------------
    def read(self, r: DiskRead) -> FetchResult:
        """Batches from ``r.offset`` out of the journal through the dense index: every run of
        adjacent batches straight into one reply buffer (one copy from the page cache, one
        allocation), the Python steps per run, never per record."""
        offset, max_bytes, max_records, limit = r.offset, r.max_bytes, r.max_records, r.limit
        if READ_DELAY_S:
            time.sleep(READ_DELAY_S)
        entries = self.index().read(offset, min(limit - offset, max(max_records, 1), 1 << 16))
        if len(entries) == 0:
            return FetchResult(ErrorCode.INTERNAL, [], offset, "disk")
        starts = entries["rel"] == 0
        starts[0] = True
        idx = np.flatnonzero(starts)
        bpos = entries["position"][idx]
        sizes = align8_array(entries["length"][idx])
        bases = offset + idx - entries["rel"][idx]
        k = max(1, int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")))
        bpos, sizes = bpos[:k], sizes[:k]
        ends = bpos + sizes
        journal = self.journal
        seg = journal.segment_bytes
        breaks = np.flatnonzero((bpos[1:] != ends[:-1]) | (bpos[1:] // seg != bpos[:-1] // seg)) + 1
        run_starts = np.concatenate(([0], breaks)).tolist()
        run_stops = np.concatenate((breaks, [k])).tolist()
        out = bytearray(int(sizes.sum()))
        mv = memoryview(out)
        at = 0
        for a, b in zip(run_starts, run_stops):
            n = int(ends[b - 1] - bpos[a])
            journal.read_into(mv[at : at + n], int(bpos[a]))
            at += n
        mv.release()
        last_count = COUNT.unpack_from(out, len(out) - int(sizes[k - 1]) + COUNT_AT)[0]
        return FetchResult(ErrorCode.OK, [out], int(bases[k - 1]) + last_count, "disk")

    def offset_for_time(self, t_us: int, ring_tail) -> tuple[int, int] | None:
        """The first batch appended at or after ``t_us``: (its first offset, its append time
        us), or None if all are older. The indexed part by binary search over the dense index
        and the journal; the rest (offsets from ``flushed_offset``: a few batches, the flusher
        keeps up) from the ring, through ``ring_tail()`` (client/ring_reader.py's view of it)."""
        for attempt in range(3):  # a log start that moved during the search took its segment with it: again
            lo, flushed, hi = self.log_start_offset, self.flushed_offset, self.high_watermark
            flushed = max(lo, min(flushed, hi))
            if flushed <= lo:
                break
            try:
                found = first_at_or_after(self.index(), self.journal, lo, flushed, t_us)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue
            if found is not None:
                return found
            break
        if hi <= flushed:
            return None
        tail = ring_tail()
        start = flushed
        while start < hi:
            got = tail.read(start, RING_SCAN_BYTES, 1 << 20)
            if got.status != TailStatus.DATA:
                raise OSError(f"partition slot {self.slot}: offsets {start}-{hi} not readable from its ring ({got.status.name})")
            for v in iter_batches(got.body):  # one step per batch, on an admin request
                if v.time_key_us >= t_us:
                    return max(v.base_offset, flushed), v.time_key_us
            start = got.next_offset
        return None

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
