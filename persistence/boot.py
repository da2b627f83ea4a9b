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

The steps, as the flusher (``Flusher.boot``) calls them: ``open_table``; ``recover_into`` (the
journal recovered and opened at its end, the rows set through the flusher's typed view,
shm/rows.py ``FlusherColumns``: ``init_row`` on a fresh table, line 2 stores on a live one);
the flusher's pieces built over narrow handles (persistence/handles.py) and retention's stored
log starts published; ``ready``. Boot takes the handles it needs (settings, catalog, journal,
the ring cache), never the flusher.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import posix_ipc

from tailrace.broker.catalog import Catalog
from tailrace.broker.settings import Settings
from tailrace.client.records import align8
from tailrace.shm import layout, region
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable, LayoutMismatch
from tailrace.shm.rows import FlusherColumns

from .handles import RingCache, RingGone
from .journal import BLOCK, Journal
from .recovery import data_dir_id, recover

log = logging.getLogger("tailrace.flusher")


@dataclass
class Booted:
    """What boot found and made, for the flusher to take over."""

    table: ControlTable
    end_position: int  # the journal's recovered end: writing goes on here (recovery checkpointed it)
    head: bytes  # the journal's bytes from the 4 KiB block holding end_position up to it (carried)
    fresh: bool  # the table was made now, not found live
    partitions: int  # partitions recovery found
    gone: list[int] = field(default_factory=list)  # active slots whose ring region is gone (reconcile)


def open_table(s: Settings) -> tuple[ControlTable, bool]:
    """Attach the live control table, or make a fresh one (stale rings unlinked first):
    (the table, whether it is fresh). Its rows are set by ``recover_into``."""
    instance = s.instance
    data_id = data_dir_id(s.data_dir, create=True)
    table, fresh = _attach_or_discard(instance, data_id)
    if fresh:
        stale = region.reclaim_rings(instance)
        if stale:
            log.info("reclaimed %d stale ring regions", len(stale))
        table = ControlTable.create(instance, s.max_slots)
        table.header["data_id"] = data_id
    return table, fresh


def recover_into(s: Settings, catalog: Catalog, journal: Journal, rings: RingCache, table: ControlTable,
                 cols: FlusherColumns, fresh: bool) -> Booted:
    """Recover the journal, open it at its end and set the rows (fresh: from recovery; live:
    reconciled). The table is not READY yet: ``ready`` is the flusher's last step of boot, after
    its pieces have published what they keep (retention's log starts)."""
    rec = recover(s.data_dir, s.segment_bytes, s.max_batch_bytes, catalog)
    if rec.cut_bytes:
        log.warning("recovery cut %d bytes of torn journal tail", rec.cut_bytes)
    head = _open_at(journal, rec.end_position)
    booted = Booted(table, rec.end_position, head, fresh, len(rec.next_offsets))
    if fresh:
        _init_rows(cols, table.max_slots, catalog, rec.next_offsets)
        table.header["boot_id"] = time.time_ns()
    else:
        booted.gone = _reconcile(cols, rings, rec.next_offsets)
    return booted


def ready(booted: Booted) -> None:
    """Publish READY: workers serve from here on (the last store of boot)."""
    booted.table.header["flusher_pid"] = os.getpid()
    booted.table.header["state"] = layout.STATE_READY
    log.info("flusher ready: journal end %d, %d partitions, fresh=%s", booted.end_position, booted.partitions,
             booted.fresh)


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


def _open_at(journal: Journal, position: int) -> bytes:
    """Go on writing at the journal's recovered end; its unaligned head block is returned, for
    the flusher to carry in its staging buffer."""
    seg = journal.segment_of(position)
    journal.open_segment(seg)
    base = position - position % BLOCK
    if position == base:
        return b""
    with open(journal.path(seg), "rb") as fh:
        fh.seek(base - seg)
        return fh.read(position - base)


def _init_rows(cols: FlusherColumns, max_slots: int, catalog: Catalog, next_offsets: dict[int, int]) -> None:
    for slot, (topic, partition) in catalog.by_slot.items():
        if slot >= max_slots:
            continue
        cols.init_row(slot, topic.topic_id, partition, topic.ring_bytes, layout.desc_capacity_for(topic.ring_bytes),
                      next_offsets.get(slot, 0))


def _reconcile(cols: FlusherColumns, rings: RingCache, next_offsets: dict[int, int]) -> list[int]:
    """After a flusher-only restart: the journal is the truth for what was flushed. Returns the
    active slots whose ring region is gone."""
    rows, gone = cols.rows, []
    for slot, journal_next in next_offsets.items():
        r = rows[slot]
        if not r[COL["active"]]:
            continue
        if int(r[COL["flushed_offset"]]) < journal_next:
            try:
                ring = rings.get(slot, int(r[COL["ring_bytes"]]))
            except RingGone:
                gone.append(slot)
                continue
            first, head = int(r[COL["flushed_desc"]]), int(r[COL["desc_head"]])
            descs = ring.descriptors(first, head)
            k = int(np.searchsorted(descs["base_offset"], journal_next, side="left"))
            if k:
                last = descs[k - 1]
                cols.store(slot, "flushed_position", int(last["position"]) + align8(int(last["length"])))
                cols.store(slot, "flushed_desc", first + k)
            cols.store(slot, "flushed_offset", journal_next)
            log.info("slot %d: journal already held offsets up to %d", slot, journal_next)
        cols.store(slot, "durable_offset", max(int(r[COL["durable_offset"]]), journal_next))
        cols.store(slot, "io_error", 0)
    return gone
