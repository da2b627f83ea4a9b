"""Same-host reads straight from the broker's rings: a consumer on the broker's host, running as
the broker's user, maps the control table and a partition's ring read-only and copies published
batches out, with no fetch request (the way an Aeron IPC subscriber tails its publication).

The ring is written by one actor at a time (shm/ring.py) and published in a fixed order (shm/
layout.py): batch bytes, descriptor, ``desc_head``, ``write_position``, ``next_offset``. Before
it overwrites a batch's bytes or reuses its descriptor slot, the writer first advances
``desc_tail`` past it. A read here is a seqlock on that tail:

1. load the watermark (``next_offset``; ``durable_offset`` for isolation "durable"), then
   ``desc_head``, ``desc_tail``, ``ring_start_offset``: x86-64 keeps loads in order, so every
   descriptor and byte below the loaded head is complete;
2. find the descriptor holding the offset, copy the descriptors, then the bytes;
3. load ``desc_tail`` again. If the first sequence copied is still at or above the tail, the
   writer had not started to reuse anything copied: the copy is good. Otherwise it is thrown
   away and the read tried again. The copy must also hold the asked offset and carry the
   base offset, partition and topic id the broker stamps into every batch in a ring, which
   also rejects what a lagging reader's search over half-rewritten descriptors found.

A broker restarted on fresh shared memory unlinks the old regions and makes new ones; the
reader's old mappings then go on showing a ring nobody writes. ``SharedRings.is_current``
(an inode check per region, which the consumer runs once a second) finds out, and the consumer
maps the new ones.

An offset below the ring (``ring_start_offset``), or a ring that cannot be read consistently,
is ``BELOW``: the caller reads it with an ordinary fetch (the journal has it). Nothing here
writes shared memory: the mappings are PROT_READ. Like the rest of tailrace's shared memory,
this relies on x86-64's ordering (shm/layout.py).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

from tailrace.shm.layout import C_DURABLE_OFFSET, C_NEXT_OFFSET
from tailrace.shm.ring import READ_WINDOW, ControlTable, LayoutMismatch, Ring, cut_batches
from tailrace.shm.ring import near_head as _near_head
from tailrace.shm.rows import RowView

from .records import STAMP, STAMP_AT

ATTEMPTS = 3  # copies thrown away before a read falls back to a fetch
WATERMARK_COLUMN = {"memory": C_NEXT_OFFSET, "durable": C_DURABLE_OFFSET}  # row column per isolation


class TailStatus(enum.IntEnum):
    DATA = 0  # batches copied out
    EMPTY = 1  # nothing past the offset yet
    BELOW = 2  # not in the ring (or out of range): read it with a fetch
    GONE = 3  # the slot no longer holds this partition, or the mapping is stale: describe again


@dataclass
class TailRead:
    status: TailStatus
    body: bytes | None = None
    next_offset: int = 0
    high_watermark: int = -1  # the row's, as loaded for this read (DATA only)
    durable_watermark: int = -1
    log_start_offset: int = -1


class SharedRings:
    """The control table of one broker instance, mapped read-only, and the rings opened on it.

    Raises ``OSError``/``posix_ipc`` errors or ``LayoutMismatch`` when the broker's shared memory
    cannot be mapped here (another host, another user, another build): the caller then fetches.
    """

    def __init__(self, instance: str, data_id: int):
        self.instance = instance
        self.table = ControlTable.attach(instance, read_only=True)
        if data_id and int(self.table.header["data_id"]) != data_id:
            self.table.close()
            raise LayoutMismatch(f"control table of instance {instance} belongs to another data directory")
        self.rows = self.table.rows
        self.rings: dict[int, Ring] = {}

    def partition(self, slot: int, topic_id: int, partition: int) -> "PartitionTail":
        ring = self.rings.get(slot)
        if ring is None or not ring.region.is_current():
            if ring is not None:
                ring.close()
            ring = self.rings[slot] = Ring.attach(self.instance, slot, read_only=True)
        return PartitionTail(self, ring, slot, topic_id, partition)

    def is_current(self) -> bool:
        """Whether every name mapped here still names the region mapped (a broker that started on
        fresh memory unlinked them and made new ones: re-map). One stat per region."""
        return self.table.region.is_current() and all(r.region.is_current() for r in self.rings.values())

    def watermarks(self, slots: np.ndarray, isolation: str) -> np.ndarray:
        """The watermark of every slot given, in one numpy gather (the idle check of a consumer)."""
        return self.rows[slots, WATERMARK_COLUMN[isolation]]

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()
        self.rows = None
        self.table.close()


class PartitionTail:
    """Reads one partition's batches from its ring (see the module docstring for the protocol)."""

    def __init__(self, rings: SharedRings, ring: Ring, slot: int, topic_id: int, partition: int):
        self.rings, self.ring, self.slot = rings, ring, slot
        self.topic_id, self.partition = topic_id, partition
        self.row = RowView(rings.rows[slot])  # read only: this process maps the table PROT_READ
        self.torn = 0  # copies thrown away because the writer reused them meanwhile

    def read(self, offset: int, max_bytes: int, max_records: int, isolation: str = "memory") -> TailRead:
        for _ in range(ATTEMPTS):
            got = self._try(offset, max_bytes, max_records, WATERMARK_COLUMN[isolation])
            if got is not None:
                return got
            self.torn += 1
        return TailRead(TailStatus.BELOW, None, offset)

    def _try(self, offset: int, max_bytes: int, max_records: int, wm_col: int) -> TailRead | None:
        row, ring, header = self.row, self.ring, self.rings.table.header
        boot = int(header["boot_id"])
        if (row.topic_id != self.topic_id or row.partition != self.partition
                or not row.active or int(ring.header["slot"]) != self.slot):
            return TailRead(TailStatus.GONE, None, offset)
        hw = row.cells[wm_col]  # loads in this order (module docstring, step 1)
        head = row.desc_head
        tail = row.desc_tail
        ring_start = row.ring_start_offset
        if offset == hw:
            return TailRead(TailStatus.EMPTY, None, offset)
        if offset > hw or offset < ring_start or tail >= head:
            return TailRead(TailStatus.BELOW, None, offset)
        max_records = max(1, min(max_records, hw - offset))
        try:
            near = _near_head(ring, tail, head, offset, max_bytes, max_records, hw)
            if near is not None:
                # The tailing case, without numpy: the offset is in one of the newest batches.
                seq, body, base, count, nxt = near
            else:
                seq = ring.find_seq(tail, head, offset)
                if seq < tail:
                    return TailRead(TailStatus.BELOW, None, offset)
                descs = np.array(ring.descriptors(seq, min(head, seq + READ_WINDOW)))  # a copy, not a view
                k = cut_batches(descs, offset, max_bytes, max_records, hw)
                take = descs[:k]
                body = b"".join(ring.copy_batches(take))
                base, count = int(take[0]["base_offset"]), int(take[0]["count"])
                nxt = int(take[-1]["base_offset"]) + int(take[-1]["count"])
            stamp = STAMP.unpack_from(body, STAMP_AT)  # base offset, append time, partition, topic id
        except (AssertionError, ValueError, IndexError, struct.error):
            return None  # descriptors half rewritten while copied (a lagging reader): again
        if row.desc_tail > seq or int(header["boot_id"]) != boot:
            return None  # the writer reclaimed part of what was copied: copy again
        if not base <= offset < base + count or stamp[0] != base or stamp[2] != self.partition or stamp[3] != self.topic_id:
            return None  # the search ran over descriptors being reused and landed wrong: again
        return TailRead(TailStatus.DATA, body, nxt, row.next_offset, row.durable_offset, row.log_start_offset)
