"""Seek by time: the earliest offset whose batch was appended at or after a time.

Every batch carries the broker's append time (``append_time_us``, stamped by the partition's
actor, shm/ring.py's writer: one clock per partition, so times only grow along a partition, as
Kafka's ``LogAppendTime``). The dense index (persistence/index.py) gives every record offset its
batch's journal position, so a binary search over offsets needs no time index of its own: each
probe reads one 16-byte index entry and the 24-byte stamp of the batch it points at, O(log n)
reads of the page cache or the disk (Kafka's ``.timeindex`` costs a file per segment and a write
per batch to save those reads).

The search covers what the flusher has indexed (offsets below ``flushed_offset``); the records
above it are still only in the ring, and the caller looks there (persistence/log.py).
"""

from __future__ import annotations

from tailrace.client.records import STAMP, STAMP_AT

from .index import IndexFile
from .journal import JournalReader


def batch_stamp(index: IndexFile, journal: JournalReader, offset: int) -> tuple[int, int]:
    """(base offset, append time us) of the batch holding ``offset`` (which the index has)."""
    e = index.read(offset, 1)
    if len(e) != 1:
        raise OSError(f"no index entry for offset {offset}")
    base, t_us, _partition, _topic = STAMP.unpack(journal.read(int(e["position"][0]) + STAMP_AT, STAMP.size))
    if base != offset - int(e["rel"][0]):
        raise OSError(f"index entry of offset {offset} points at the batch of {base}")
    return base, t_us


def first_at_or_after(index: IndexFile, journal: JournalReader, lo: int, hi: int, t_us: int) -> tuple[int, int] | None:
    """The first batch in offsets ``[lo, hi)`` appended at or after ``t_us``: (its first offset,
    at least ``lo``; its append time), or None if every batch there is older. About
    2 * log2(hi - lo) reads."""
    if hi <= lo:
        return None
    base, t = batch_stamp(index, journal, lo)
    if t >= t_us:  # the common case for retention: nothing has expired yet (two reads, no search)
        return lo, t
    base, t = batch_stamp(index, journal, hi - 1)
    if t < t_us:
        return None
    found = (base, t)
    a, b = lo, base  # the answer is in [a, base]: batches before ``base`` are tested below
    while a < b:
        mid = (a + b) // 2
        mb, mt = batch_stamp(index, journal, mid)
        if mt >= t_us:
            found, b = (mb, mt), mb
        else:
            a = mid + 1  # mid's batch is older, and so is everything before it
    return (max(found[0], lo), found[1])
