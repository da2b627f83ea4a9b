"""One partition's log as one thread of one process reads it (Kafka's ``UnifiedLog`` role).

A ``PartitionLog`` owns the reads of a partition's offsets and files that fetch, list-offsets
and seek by time used to make each on their own, reaching into the control row and the index:

- the offsets, from the partition's control-table row (shm/layout.py): ``log_start_offset``
  (line 0: boot and retention move it, never down), ``high_watermark`` (``next_offset``, line 1:
  the owner's), ``durable_watermark`` (``durable_offset``) and ``flushed_offset`` (line 2: the
  flusher's). Every read is one int64 load: what one call sees is consistent per word only;
- the dense index file of the slot (persistence/index.py), opened on first use and opened again
  when the cached one was unlinked (a deleted topic's index goes when the flusher clears its
  slot, persistence/retire.py, and a new topic that takes the slot gets a fresh file: a
  descriptor cached by slot alone would go on reading the old topic's entries);
- the journal read of a fetch below the ring (``read``: batches through the index, one reply
  buffer), and the time lookup (``offset_for_time``: the indexed part by binary search,
  persistence/timesearch.py, the rest from the ring).

Concurrency contract: a ``PartitionLog`` reads the row and never stores to it; it holds its own
index descriptor and uses the ``JournalReader`` it is given, so one object belongs to one thread
(the worker's loop, or its disk-reader thread, each with its own). Not safe to share between
threads. Retention and recovery still read the row and the index themselves (a later step);
replication will add the leader epoch and the follower state here.

Vocabulary (README glossary): an offset is a record number, a position a byte in the journal.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from tailrace.client.protocol import ErrorCode
from tailrace.client.records import COUNT, COUNT_AT, align8_array, iter_batches
from tailrace.client.ring_reader import TailStatus
from tailrace.shm.layout import COL

from .index import IndexFile
from .journal import JournalReader
from .timesearch import first_at_or_after

READ_DELAY_S = 0.0  # fault injection for tests (settings.debug_read_delay_ms): a slow disk
RING_SCAN_BYTES = 4 << 20  # one ring read of the time lookup's unindexed tail
_LOG_START, _NEXT, _DURABLE, _FLUSHED = (COL[n] for n in ("log_start_offset", "next_offset", "durable_offset", "flushed_offset"))


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
    def __init__(self, row: np.ndarray, data_dir: str, slot: int, journal: JournalReader):
        self.row = row  # the slot's int64 control words, read only here
        self.data_dir, self.slot, self.journal = data_dir, slot, journal
        self._index: IndexFile | None = None

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

    # --- the index -------------------------------------------------------------------------
    def index(self) -> IndexFile:
        """The slot's index file, opened again if the cached one was unlinked (one fstat)."""
        index = self._index
        if index is not None and os.fstat(index.fd).st_nlink == 0:
            index.close()
            index = None
        if index is None:
            index = self._index = IndexFile(self.data_dir, self.slot)
        return index

    def index_unlinked(self) -> bool:
        """Whether the cached index file was deleted (its topic was): ``close`` lets its blocks go."""
        return self._index is not None and os.fstat(self._index.fd).st_nlink == 0

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
                if v.append_time_us >= t_us:
                    return max(v.base_offset, flushed), v.append_time_us
            start = got.next_offset
        return None

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
