"""The per-partition dense index: ``<data_dir>/index/<slot>.index``.

File format: an array of fixed 16-byte entries, one per record offset, so the entry of offset
``o`` is at byte ``o * 16`` (JMQ4's / RocketMQ's consume queue: O(1) lookup, no search)::

     0                8           12          16
     +----------------+-----------+-----------+
     |  position i64  | length i32| rel   i32 |
     +----------------+-----------+-----------+
     position: journal position of the batch holding the record
     length:   that batch's length in bytes (unpadded)
     rel:      relative offset of the record in its batch (offset - base_offset)

The index is derived data: every entry can be rebuilt from the journal, and recovery does so for
any part written after the last checkpoint. Entries are written by the flusher (page cache, no
fsync per write); they are synced before a checkpoint names a journal position past them.

Concurrency contract: the flusher is the only writer; workers read entries below the partition's
``flushed_offset`` (published in the control table after the entries were written).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path

import numpy as np

from tailrace.broker.datadir import INDEX_DIR, index_name

ENTRY_DTYPE = np.dtype([("position", "<i8"), ("length", "<i4"), ("rel", "<i4")])
ENTRY_BYTES = ENTRY_DTYPE.itemsize
ENTRY = struct.Struct("<qii")  # one entry without numpy (the flusher's few-batch path)
assert ENTRY_BYTES == 16 == ENTRY.size
assert [ENTRY_DTYPE.fields[f][1] for f in ENTRY_DTYPE.names] == [0, 8, 12]
assert np.array([(-2, -3, 5)], dtype=ENTRY_DTYPE).tobytes() == ENTRY.pack(-2, -3, 5)  # one encoding, two spellings

log = logging.getLogger("tailrace.retention")  # punch_below is retention's step

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
PAGE = 4096
PAGE_ENTRIES = PAGE // ENTRY_BYTES  # the entries of one page: fewer than that below a start frees nothing


def index_path(data_dir: str | os.PathLike, slot: int) -> Path:
    return Path(data_dir) / INDEX_DIR / index_name(slot)


def entries_for(positions: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Entries for consecutive batches (vectorised: no Python step per record)."""
    counts = counts.astype(np.int64)
    total = int(counts.sum())
    out = np.empty(total, dtype=ENTRY_DTYPE)
    out["position"] = np.repeat(positions.astype(np.int64), counts)
    out["length"] = np.repeat(lengths.astype(np.int32), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    out["rel"] = np.arange(total, dtype=np.int64) - starts
    return out


def punch_below(fd: int, entries: int) -> bool:
    """Free the index file's blocks wholly below entry ``entries`` (the offsets stay where they
    are: reads there give zeros). False where the filesystem cannot punch holes."""
    length = entries * ENTRY_BYTES // PAGE * PAGE
    if length <= 0:
        return True
    if _libc.fallocate(fd, _FALLOC_PUNCH, ctypes.c_long(0), ctypes.c_long(length)) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS):
        log.warning("punching the index below entry %d: %s", entries, os.strerror(err))
    return False


def first_at_position(index: "IndexFile", lo: int, hi: int, position: int) -> int:
    """The first offset in ``[lo, hi)`` whose batch sits at or after journal ``position`` (``hi``
    if none): a partition's positions only grow, so a binary search of O(log n) entry reads."""
    while lo < hi:
        mid = (lo + hi) // 2
        e = index.read(mid, 1)
        if len(e) and int(e["position"][0]) >= position:
            hi = mid
        else:
            lo = mid + 1
    return lo


class IndexFile:
    def __init__(self, data_dir: str | os.PathLike, slot: int, writable: bool = False):
        self.path = index_path(data_dir, slot)
        self.writable = writable
        if writable:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        else:
            self.fd = os.open(self.path, os.O_RDONLY)
        self.dirty = False

    def entry_count(self) -> int:
        return os.fstat(self.fd).st_size // ENTRY_BYTES

    def write(self, first_offset: int, entries: np.ndarray | bytes) -> None:
        """Write entries (an ENTRY_DTYPE array, or their bytes) from ``first_offset`` on."""
        os.pwrite(self.fd, entries if isinstance(entries, bytes) else entries.tobytes(), first_offset * ENTRY_BYTES)
        self.dirty = True

    def read(self, first_offset: int, count: int) -> np.ndarray:
        raw = os.pread(self.fd, count * ENTRY_BYTES, first_offset * ENTRY_BYTES)
        return np.frombuffer(raw, dtype=ENTRY_DTYPE, count=len(raw) // ENTRY_BYTES)

    def truncate(self, entries: int) -> None:
        os.ftruncate(self.fd, entries * ENTRY_BYTES)
        self.dirty = True

    def sync(self) -> None:
        if self.dirty:
            os.fsync(self.fd)
            self.dirty = False

    def close(self) -> None:
        os.close(self.fd)
