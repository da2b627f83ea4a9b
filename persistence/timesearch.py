"""Seek by time: the earliest offset whose batch holds a record at or after a time.

Every batch carries a time that only grows along its partition, stamped by the partition's actor
at append (client/records.py ``time_key``): a v2 batch's ``max_time_us``, the largest record
timestamp of the partition up to and including it (the records' create times on a CreateTime
topic, the append time on a LogAppendTime one: Kafka's time index holds the same running
maximum), and a v1 batch's append time. The dense index (persistence/index.py) gives every record offset its
batch's journal position, so a binary search over offsets needs no time index of its own: each
probe reads one 16-byte index entry and the 24-byte stamp of the batch it points at, O(log n)
reads of the page cache or the disk (Kafka's ``.timeindex`` costs a file per segment and a write
per batch to save those reads).

The search covers what the flusher has indexed (offsets below ``flushed_offset``); the records
above it are still only in the ring, and the caller looks there (persistence/log.py).
"""

from __future__ import annotations

from tailrace.client.records import PREFIX_BYTES, STAMP, STAMP_AT, STAMP_V2, STAMP_V2_AT, VERSION_2, VERSION_AT

from .index import IndexFile
from .journal import JournalReader


def batch_stamp(index: IndexFile, journal: JournalReader, offset: int) -> tuple[int, int]:
    """(base offset, time key us) of the batch holding ``offset`` (which the index has)."""
    e = index.read(offset, 1)
    if len(e) != 1:
        raise OSError(f"no index entry for offset {offset}")
    pos = int(e["position"][0])
    head = journal.read(pos, PREFIX_BYTES)
    base, t_us, _partition, _topic = STAMP.unpack_from(head, STAMP_AT)
    if base != offset - int(e["rel"][0]):
        raise OSError(f"index entry of offset {offset} points at the batch of {base}")
    if head[VERSION_AT] == VERSION_2:
        t_us = STAMP_V2.unpack(journal.read(pos + STAMP_V2_AT, STAMP_V2.size))[1]
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
