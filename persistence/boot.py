"""The flusher's boot: own the control table, recover the journal, reconcile, publish READY.

The flusher is the boot owner. At its start it finds the control table in one of two states:

1. **none usable** (a first start, a host restart, a table of another layout version, or one made
   for another data directory that once lived at this path): stale rings are unlinked, a fresh
   table is made, and every row is initialised from what recovery found in the journal
   (``_init_rows``). Workers then recreate their rings empty, starting at those offsets.
2. **a live one** (only the flusher restarted; the rings still hold every unflushed batch): the
   journal is the truth for what was flushed. ``_reconcile`` moves each row's ``flushed_*``
   words up to what recovery found (the previous flusher may have written batches it had not
   yet published), so nothing is written twice and nothing is skipped.

Either way the table is marked READY last; workers serve only after that (actors/worker.py).
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import posix_ipc

from tailrace.client.records import align8
from tailrace.shm import layout, region
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable, LayoutMismatch

from .journal import BLOCK
from .recovery import data_dir_id, recover


class RingGone(Exception):
    """An active row's ring region does not exist (``Flusher.ring_gone``)."""

    def __init__(self, slot: int):
        super().__init__(f"slot {slot}: ring region gone")
        self.slot = slot


log = logging.getLogger("tailrace.flusher")


def boot(f) -> None:
    """Boot the flusher ``f`` (persistence/flusher.py ``Flusher``): table, recovery, READY."""
    instance = f.s.instance
    data_id = data_dir_id(f.s.data_dir, create=True)
    f.table, fresh = _attach_or_discard(instance, data_id)
    if fresh:
        stale = region.reclaim_rings(instance)
        if stale:
            log.info("reclaimed %d stale ring regions", len(stale))
        f.table = ControlTable.create(instance, f.s.max_slots)
        f.table.header["data_id"] = data_id
    rec = recover(f.s.data_dir, f.s.segment_bytes, f.s.max_batch_bytes, f.catalog)
    if rec.cut_bytes:
        log.warning("recovery cut %d bytes of torn journal tail", rec.cut_bytes)
    _open_at(f, rec.end_position)
    f.checkpointed_at = rec.end_position  # recovery checkpointed its end
    if fresh:
        _init_rows(f, rec.next_offsets)
        f.table.header["boot_id"] = time.time_ns()
    else:
        _reconcile(f, rec.next_offsets)
    f.retention.publish()  # the stored log starts (persistence/retention.py) into the rows
    f.rescan()
    f.table.header["flusher_pid"] = os.getpid()
    f.table.header["state"] = layout.STATE_READY
    log.info("flusher ready: journal end %d, %d partitions, fresh=%s", rec.end_position, len(rec.next_offsets), fresh)


def _attach_or_discard(instance: str, data_id: int) -> tuple[ControlTable | None, bool]:
    """(the live table, False), or (None, True) when there is none this directory may use."""
    try:
        table = ControlTable.attach(instance)
    except posix_ipc.ExistentialError:
        return None, True
    except LayoutMismatch as exc:
        log.warning("%s; discarding it", exc)
        region.unlink(region.control_name(instance))
        return None, True
    if int(table.header["data_id"]) != data_id:
        log.warning("shared memory belongs to another data directory at this path (data id %d, ours %d): "
                    "discarding it", int(table.header["data_id"]), data_id)
        table.close()
        region.unlink(region.control_name(instance))
        return None, True
    return table, False


def _open_at(f, position: int) -> None:
    """Go on writing at the journal's recovered end: its unaligned head block is carried."""
    seg = f.journal.segment_of(position)
    f.journal.open_segment(seg)
    f.buf_base = position - position % BLOCK
    f.buf_len = position - f.buf_base
    if f.buf_len:
        with open(f.journal.path(seg), "rb") as fh:
            fh.seek(f.buf_base - seg)
            f.buf[: f.buf_len] = fh.read(f.buf_len)


def _init_rows(f, next_offsets: dict[int, int]) -> None:
    rows = f.table.rows
    for slot, (topic, partition) in f.catalog.by_slot.items():
        if slot >= f.table.max_slots:
            continue
        nxt = next_offsets.get(slot, 0)
        r = rows[slot]
        r[:] = 0
        r[COL["slot"]] = slot
        r[COL["topic_id"]] = topic.topic_id
        r[COL["partition"]] = partition
        r[COL["ring_bytes"]] = topic.ring_bytes
        r[COL["desc_capacity"]] = layout.desc_capacity_for(topic.ring_bytes)
        for name in ("next_offset", "ring_start_offset", "flushed_offset", "durable_offset"):
            r[COL[name]] = nxt
        r[COL["active"]] = 1


def _reconcile(f, next_offsets: dict[int, int]) -> None:
    """After a flusher-only restart: the journal is the truth for what was flushed."""
    rows = f.table.rows
    for slot, journal_next in next_offsets.items():
        r = rows[slot]
        if not r[COL["active"]]:
            continue
        if int(r[COL["flushed_offset"]]) < journal_next:
            try:
                ring = f._ring(slot)
            except RingGone:
                f.ring_gone(slot)
                continue
            first, head = int(r[COL["flushed_desc"]]), int(r[COL["desc_head"]])
            descs = ring.descriptors(first, head)
            k = int(np.searchsorted(descs["base_offset"], journal_next, side="left"))
            if k:
                last = descs[k - 1]
                r[COL["flushed_position"]] = int(last["position"]) + align8(int(last["length"]))
                r[COL["flushed_desc"]] = first + k
            r[COL["flushed_offset"]] = journal_next
            log.info("slot %d: journal already held offsets up to %d", slot, journal_next)
        r[COL["durable_offset"]] = max(int(r[COL["durable_offset"]]), journal_next)
        r[COL["io_error"]] = 0
