"""The control table and the per-partition single-producer ring (layouts in shm/layout.py).

Concurrency contract: for a partition, exactly one actor (the owner, fenced by ``owner_epoch``)
claims, copies and publishes through ``RingWriter``, which stores only line 1 of the row (an
``OwnerRow``, shm/rows.py); the flusher reads ``[flushed, head)`` and never writes line 1; the
writer never overwrites bytes the flusher has not yet copied out (it checks ``flushed_position``
and ``flushed_desc`` before claiming space). Reads of already-published
batches by the owner (fetch) are safe because only the owner overwrites them.
NOT safe: two writers on one ring; a reader outside the owner relying on bytes below
``desc_tail`` (they may be overwritten at any time).
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from . import futex, layout
from .region import Region, control_name, ring_name
from .rows import OwnerRow


class LayoutMismatch(RuntimeError):
    """Raised when a region's magic or layout version is not the one this code was built for."""


class ControlTable:
    def __init__(self, region: Region):
        self.region = region
        self.header = np.frombuffer(region.buf, dtype=layout.TABLE_HEADER_DTYPE, count=1)[0]
        max_slots = int(self.header["max_slots"]) if not region.created else None
        self._max_slots = max_slots

    @classmethod
    def create(cls, instance: str, max_slots: int) -> "ControlTable":
        region = Region.create(control_name(instance), layout.control_table_bytes(max_slots))
        table = cls(region)
        h = table.header
        h["version"] = layout.LAYOUT_VERSION
        h["max_slots"] = max_slots
        h["state"] = layout.STATE_INITIALIZING
        h["magic"] = layout.CONTROL_MAGIC  # last: a half-made table never passes the check
        table._bind(max_slots)
        return table

    @classmethod
    def attach(cls, instance: str, read_only: bool = False) -> "ControlTable":
        region = Region.attach(control_name(instance), read_only)
        table = cls(region)
        magic, version = int(table.header["magic"]), int(table.header["version"])
        if magic != layout.CONTROL_MAGIC or version != layout.LAYOUT_VERSION:
            raise LayoutMismatch(
                f"control table {region.name}: magic={magic:#x} version={version}, "
                f"this build expects magic={layout.CONTROL_MAGIC:#x} version={layout.LAYOUT_VERSION}"
            )
        table._bind(int(table.header["max_slots"]))
        return table

    def _bind(self, max_slots: int) -> None:
        self._wake = np.frombuffer(self.region.buf, dtype=np.uint32, count=1, offset=layout.WAKE_AT)
        self.wake_addr = ctypes.c_void_p(self._wake.ctypes.data)  # made once: passed on every wake
        self._wakes = int(self._wake[0]) >> 8  # go on from the word's count: a restarted writer
        # must not store again the very value a reader loaded before it went to sleep
        self.max_slots = max_slots
        self.header_words = np.frombuffer(self.region.buf, dtype=np.int64, count=layout.TABLE_HEADER_BYTES // 8)  # shm/rows.py HeaderView
        self.rows = np.frombuffer(
            self.region.buf, dtype=np.int64, count=max_slots * layout.ROW_WORDS, offset=layout.TABLE_HEADER_BYTES
        ).reshape(max_slots, layout.ROW_WORDS)

    def wake_readers(self, writer_id: int) -> None:
        """Tell same-host ring readers that something was published (after the publishing
        stores: x86-64 keeps stores in order, so a woken reader sees them)."""
        self._wakes += 1
        self._wake[0] = ((self._wakes << 8) | writer_id) & 0xFFFFFFFF
        futex.wake(self.wake_addr)

    def wake_mark(self) -> int:
        """The wake word now: load it before looking for data, wait on it after finding none."""
        return int(self._wake[0])

    def wait_wake(self, mark: int, timeout_s: float) -> bool:
        return futex.wait(self.wake_addr, mark, timeout_s)

    @property
    def state(self) -> int:
        return int(self.header["state"])

    def row(self, slot: int) -> np.ndarray:
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot out of range: slot={slot} max_slots={self.max_slots}")
        return self.rows[slot]

    def close(self) -> None:
        self.header = self.header_words = None
        self.rows = None
        self._wake = None
        self.region.close()


class Ring:
    """A mapped ring region: header, descriptor array, data bytes."""

    def __init__(self, region: Region, slot: int, ring_bytes: int):
        self.region = region
        self.slot = slot
        self.ring_bytes = ring_bytes
        self.desc_capacity = layout.desc_capacity_for(ring_bytes)
        self.header = np.frombuffer(region.buf, dtype=layout.RING_HEADER_DTYPE, count=1)[0]
        self.desc = np.frombuffer(
            region.buf, dtype=layout.DESCRIPTOR_DTYPE, count=self.desc_capacity, offset=layout.RING_HEADER_BYTES
        )
        start = layout.ring_data_start(ring_bytes)
        self.data = np.frombuffer(region.buf, dtype=np.uint8, count=ring_bytes, offset=start)
        self.mv = memoryview(region.buf)[start : start + ring_bytes]

    @classmethod
    def create_or_attach(cls, instance: str, slot: int, ring_bytes: int) -> "Ring":
        name = ring_name(instance, slot)
        try:
            region = Region.create(name, layout.ring_region_bytes(ring_bytes), populate=False, fdless=True)  # pages as written
        except Exception as exc:  # posix_ipc.ExistentialError: someone made it already
            if type(exc).__name__ != "ExistentialError":
                raise
            return cls.attach(instance, slot, ring_bytes)
        ring = cls(region, slot, ring_bytes)
        h = ring.header
        h["slot"] = slot
        h["ring_bytes"] = ring_bytes
        h["desc_capacity"] = ring.desc_capacity
        h["version"] = layout.LAYOUT_VERSION
        h["magic"] = layout.RING_MAGIC  # last: a half-made ring never passes the check
        return ring

    @classmethod
    def attach(cls, instance: str, slot: int, ring_bytes: int | None = None, read_only: bool = False) -> "Ring":
        region = Region.attach(ring_name(instance, slot), read_only, populate=False, fdless=True)
        h = np.frombuffer(region.buf, dtype=layout.RING_HEADER_DTYPE, count=1)[0]
        magic, version = int(h["magic"]), int(h["version"])
        if magic != layout.RING_MAGIC or version != layout.LAYOUT_VERSION:
            region.close()
            raise LayoutMismatch(
                f"ring {region.name}: magic={magic:#x} version={version}, "
                f"this build expects magic={layout.RING_MAGIC:#x} version={layout.LAYOUT_VERSION}"
            )
        actual = int(h["ring_bytes"])
        if ring_bytes is not None and actual != ring_bytes:
            region.close()
            raise LayoutMismatch(f"ring {region.name}: ring_bytes={actual}, expected {ring_bytes}")
        return cls(region, slot, actual)

    def descriptors(self, first_seq: int, end_seq: int) -> np.ndarray:
        """Descriptors of seq in [first_seq, end_seq), oldest first (a view, or a copy at the wrap)."""
        n = end_seq - first_seq
        cap = self.desc_capacity
        assert 0 <= n <= cap, (first_seq, end_seq, cap)
        i = first_seq % cap
        if i + n <= cap:
            return self.desc[i : i + n]
        return np.concatenate((self.desc[i:], self.desc[: n - (cap - i)]))

    def find_seq(self, tail: int, head: int, offset: int) -> int:
        """Sequence number of the descriptor holding ``offset`` among seq [tail, head) (numpy
        search, no copy); ``tail - 1`` when ``offset`` is below them all."""
        cap = self.desc_capacity
        i, n = tail % cap, head - tail
        first = self.desc[i : min(cap, i + n)]
        if len(first) and offset < int(first[-1]["base_offset"]) + int(first[-1]["count"]):
            return tail + int(np.searchsorted(first["base_offset"], offset, side="right")) - 1
        second = self.desc[: n - len(first)]
        return tail + len(first) + int(np.searchsorted(second["base_offset"], offset, side="right")) - 1

    def copy_batches(self, descs: np.ndarray) -> list[memoryview]:
        """Memoryviews covering the frames of consecutive descriptors (1 view, 2 at a lap wrap)."""
        if len(descs) == 0:
            return []
        pos = descs["position"]
        ends = pos + layout.align_frames(descs["length"])
        # A run ends where positions jump (the skipped tail of a lap) and also where a batch
        # starts a new lap exactly at byte 0: contiguous positions, but not contiguous bytes.
        breaks = np.flatnonzero((pos[1:] != ends[:-1]) | (pos[1:] % self.ring_bytes == 0)) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [len(descs)]))
        out = []
        for a, b in zip(starts.tolist(), stops.tolist()):
            lo = int(pos[a]) % self.ring_bytes
            hi = lo + int(ends[b - 1] - pos[a])
            assert hi <= self.ring_bytes, (lo, hi, self.ring_bytes)  # a run never crosses the end
            out.append(self.mv[lo:hi])
        return out

    def close(self) -> None:
        self.header = self.desc = self.data = None
        self.mv.release()
        self.region.close()


READ_WINDOW = 4096  # descriptors one read looks at (a fetch on the worker, a same-host ring read)
NEAR_HEAD = 16  # newest descriptors walked in plain Python before a numpy search (near_head)


def cut_batches(descs: np.ndarray, offset: int, max_bytes: int, max_records: int, hw: int) -> int:
    """How many of these consecutive descriptors (the first holds ``offset``) one read returns:
    at least one; stop at ``max_bytes`` of frames, ``max_records`` records from ``offset``, and
    batches wholly below the watermark ``hw``."""
    bases, counts = descs["base_offset"], descs["count"]
    sizes = layout.align_frames(descs["length"])
    ends = bases + counts
    k = len(bases)
    k = min(k, int(np.searchsorted(ends, hw, side="right")))
    recs = np.cumsum(ends - np.maximum(bases, offset))
    k = min(k, int(np.searchsorted(recs, max_records, side="left")) + 1)
    k = min(k, int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")))
    return max(k, 1)


def near_head(ring: Ring, tail: int, head: int, offset: int, max_bytes: int, max_records: int, hw: int):
    """A read near the head in plain Python: when ``offset`` is in one of the ``NEAR_HEAD``
    newest batches, pick the batches from there as ``cut_batches`` would (the first always;
    then while wholly below ``hw``, within ``max_bytes``, until ``max_records``) and copy them.
    Returns (first seq, bytes, its base offset, its count, next offset), or None to search with
    numpy. A tailing reader's read, and a partition read from the start when it holds a few
    batches (one topic over many partitions): a dozen numpy calls on arrays of a few elements
    cost ~30 us, this walk ~3 us. Unchecked: the owner's stamp check, or a same-host reader's
    seqlock and stamp checks, decide whether the copy is good."""
    cap, desc, mv, ring_bytes = ring.desc_capacity, ring.desc, ring.mv, ring.ring_bytes
    seq, lowest = head - 1, max(tail, head - NEAR_HEAD)
    d = desc[seq % cap].item()  # (position, base offset, length, count)
    if d[1] <= offset:  # in the newest batch: the common tailing read
        at = d[0] % ring_bytes
        return seq, bytes(mv[at : at + layout.align_frame(d[2])]), d[1], d[3], d[1] + d[3]
    while d[1] > offset:
        seq -= 1
        if seq < lowest:
            return None
        d = desc[seq % cap].item()
    first, base, count = seq, d[1], d[3]
    parts, size, records = [], 0, 0
    while True:
        pos, b, length, n = d
        frame = layout.align_frame(length)
        if parts and (b + n > hw or size + frame > max_bytes):
            break
        at = pos % ring_bytes
        parts.append(mv[at : at + frame])
        size += frame
        records += b + n - max(b, offset)
        nxt = b + n
        seq += 1
        if records >= max_records or seq >= head:
            break
        d = desc[seq % cap].item()
    return first, b"".join(parts), base, count, nxt


class RingFull(Exception):
    """Internal signal: the batch does not fit until the flusher catches up."""


PAGE = 4096  # the unit pages are given back in (RING_ALIGN: the data area starts on one)


class Growth:
    """Whether a worker's rings may take pages they do not hold now (shared by its writers; the
    worker's ``RingKeeper``, actors/keeper.py, clears it while its rings hold their share)."""

    __slots__ = ("allowed",)

    def __init__(self) -> None:
        self.allowed = True


class RingWriter:
    """The single writer of one ring: ``claim`` a position, ``copy`` the frame in, ``publish``
    it (Aeron's tryClaim/commit). Between copy and publish the caller may change the frame's
    bytes (the partition actor stamps the header there): the ring itself knows no record field.
    Holds the owner epoch it was given and the row's ``OwnerRow`` (it stores line 1 only);
    ``fenced`` tells whether another owner has since taken over (then it must not write).

    A ring is a sparse tmpfs file: a page costs memory once written, and ``release`` gives the
    pages of flushed batches back (docs/DESIGN.md "Rings that give their pages back").
    ``released`` and ``released_seq`` are this writer's own record of how far it gave back; a
    new owner starts from 0, which over-counts what the ring holds (``resident_bytes``), never
    under-counts it."""

    def __init__(self, ring: Ring, row: OwnerRow, epoch: int, growth: Growth | None = None):
        self.ring = ring
        self.row = row
        self.epoch = epoch
        self.growth = growth if growth is not None else Growth()
        self.released = 0  # data pages at absolute positions below this were given back (this lap's)
        self.released_seq = 0  # descriptor pages of seq below this were given back

    @property
    def fenced(self) -> bool:
        return self.row.owner_epoch != self.epoch

    def claim(self, frame_bytes: int) -> int:
        """Return the absolute position where a frame of this size goes; raise RingFull."""
        row, cap = self.row, self.ring.ring_bytes
        if frame_bytes > cap // 2:
            raise ValueError(f"frame of {frame_bytes} bytes can never fit a ring of {cap}")
        pos = row.write_position
        idx = pos % cap
        if idx + frame_bytes > cap:
            pos += cap - idx  # skip to the next lap: batches never straddle the end
        if pos + frame_bytes - cap > row.flushed_position:
            raise RingFull
        if pos < self.released + cap and not self.growth.allowed:
            raise RingFull  # the bytes would land on pages given back (or never written): the worker holds its share
        if row.desc_head - row.flushed_desc >= self.ring.desc_capacity:
            raise RingFull
        return pos

    def copy(self, pos: int, frame: memoryview, base_offset: int) -> memoryview:
        """Copy a frame in at ``pos`` (from ``claim``); return the ring's bytes of it, which the
        caller may change (stamp) until it calls ``publish``. ``base_offset`` is the first
        offset the frame will hold (the ring's start offset when it drops every other batch).

        Crash order: first forget the batches whose bytes or descriptor slot this one reuses
        (``desc_tail``), then overwrite. A writer killed here leaves no descriptor pointing at
        overwritten bytes, only bytes no descriptor points to (never acknowledged)."""
        ring, n = self.ring, frame.nbytes
        self._drop_reused(pos + n - ring.ring_bytes, self.row.desc_head, base_offset)
        idx = pos % ring.ring_bytes
        view = ring.mv[idx : idx + n]
        view[:] = frame
        return view

    def publish(self, pos: int, frame_bytes: int, length: int, base_offset: int, count: int) -> None:
        """Make the frame copied at ``pos`` visible: its descriptor (position, base offset, the
        batch's own ``length``, ``count``: one store), then ``desc_head``, the commit point, then
        ``write_position`` and ``next_offset`` (``repair`` derives these two from the descriptors
        after a crash between)."""
        row, ring = self.row, self.ring
        head = row.desc_head
        ring.desc[head % ring.desc_capacity] = (pos, base_offset, length, count)
        row.desc_head = head + 1
        row.write_position = pos + frame_bytes
        row.next_offset = base_offset + count

    def repair(self) -> None:
        """Make line 1 of the row agree with the descriptors (call with ownership, at takeover).

        ``desc_head`` is the commit point of an append: a writer killed after it but before
        ``write_position``/``next_offset`` left those behind; one killed before it left bytes
        no descriptor points to (never acknowledged, overwritten by the next append)."""
        row, ring = self.row, self.ring
        head, tail = row.desc_head, row.desc_tail
        if head > tail:
            last = ring.desc[(head - 1) % ring.desc_capacity]
            row.write_position = int(last["position"]) + layout.align_frame(int(last["length"]))
            row.next_offset = int(last["base_offset"]) + int(last["count"])
            row.ring_start_offset = int(ring.desc[tail % ring.desc_capacity]["base_offset"])
        else:
            row.ring_start_offset = row.next_offset

    def _drop_reused(self, overwritten_below: int, head: int, new_base_offset: int) -> None:
        """Forget batches whose bytes (absolute positions below ``overwritten_below``) or whose
        descriptor slot (seq ``head - desc_capacity``) the next batch is about to reuse."""
        row, ring = self.row, self.ring
        tail = row.desc_tail
        floor = max(tail, head + 1 - ring.desc_capacity)
        while floor < head and int(ring.desc[floor % ring.desc_capacity]["position"]) < overwritten_below:
            floor += 1
        if floor != tail:
            start = int(ring.desc[floor % ring.desc_capacity]["base_offset"]) if floor < head else new_base_offset
            row.ring_start_offset = start
            row.desc_tail = floor

    # --- pages given back ----------------------------------------------------------------
    def resident_bytes(self) -> int:
        """What the ring's pages hold now, at most (written and not given back): data,
        descriptors and the header page."""
        row, ring = self.row, self.ring
        data = min(ring.ring_bytes, max(0, row.write_position - self.released))
        desc = min(ring.desc_capacity, max(0, row.desc_head - self.released_seq)) * layout.DESCRIPTOR_BYTES
        # + the header's page, a descriptor page the last release shared with live slots, and the
        # page the descriptor area ends in (data below ``released`` is page aligned: none)
        return -(-data // PAGE) * PAGE + -(-desc // PAGE) * PAGE + 3 * PAGE

    def release(self, keep_bytes: int, between=None) -> int:
        """Give back the data pages of flushed batches, all but the newest ``keep_bytes`` of the
        ring, and the descriptor pages of the batches dropped; returns how many fewer bytes
        ``resident_bytes`` says.

        Crash order, as ``copy``'s: first forget the batches (``ring_start_offset``, then
        ``desc_tail``: a same-host reader that copied one throws the copy away), then punch the
        pages (MADV_REMOVE: the tmpfs pages go, every mapping reads zeros, a later write takes a
        fresh page). A writer killed between leaves pages no descriptor points to. Only flushed
        batches go, so the flusher never looks below what is released.
        ``between``: called after the batches are forgotten, before a page is punched (a crash
        test's kill point)."""
        row, ring = self.row, self.ring
        cap, w = ring.ring_bytes, row.write_position
        hi = min(row.flushed_position, w - keep_bytes) // PAGE * PAGE
        lo = -(-max(self.released, w - cap) // PAGE) * PAGE  # below w - cap: rewritten this lap (held again)
        if hi <= lo:
            return 0
        before = self.resident_bytes()
        head, tail = row.desc_head, row.desc_tail
        if head > tail:
            descs = ring.descriptors(tail, head)
            floor = tail + int(np.searchsorted(descs["position"], hi, side="left"))
            if floor > tail:
                row.ring_start_offset = int(descs[floor - tail]["base_offset"]) if floor < head else row.next_offset
                row.desc_tail = floor
        if between is not None:
            between()
        reg, start = ring.region, layout.ring_data_start(cap)
        for a, b in _wrapped(lo, hi, cap):
            reg.madvise(mmap.MADV_REMOVE, start + a, b - a)
        # from a page's worth of slots before where the last release ended: the page it could not
        # punch then (live slots shared it) is wholly dead now
        self._release_descriptors(max(self.released_seq - PAGE // layout.DESCRIPTOR_BYTES - 1, head - ring.desc_capacity),
                                  row.desc_tail)
        self.released = hi
        return before - self.resident_bytes()

    def _release_descriptors(self, first: int, end: int) -> None:
        """Punch the descriptor pages wholly inside the slots of seq [first, end) (never the
        header's page, never a slot of a live descriptor: those are seq [end, head), and
        ``first >= head - desc_capacity``)."""
        dc, size = self.ring.desc_capacity, layout.DESCRIPTOR_BYTES
        if end > first:
            reg = self.ring.region
            for a, b in _wrapped(first * size, end * size, dc * size):
                a = -(-(layout.RING_HEADER_BYTES + a) // PAGE) * PAGE
                b = (layout.RING_HEADER_BYTES + b) // PAGE * PAGE
                if b > a:
                    reg.madvise(mmap.MADV_REMOVE, a, b - a)
        self.released_seq = max(self.released_seq, end)


def _wrapped(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """The byte ranges of absolute positions [lo, hi) (hi - lo <= size) in an area of ``size``."""
    a, b = lo % size, lo % size + (hi - lo)
    return [(a, b)] if b <= size else [(a, size), (0, b - size)]
