"""Retiring a deleted topic's slots: the flusher clears what is left of them, then they are free.

Deleting a topic is one catalog write by the router (broker/catalog.py ``delete_topic``): the
topic leaves ``topics`` and its slots join ``retired``. That write is the deletion; everything
after it clears state no one may read any more, and may be cut short by a crash at any point and
done again:

1. **wait for the owners to let go.** Each slot's lock file (``slot-N.lock``, the owner's flock:
   shm/fence.py) is taken by the flusher; an actor still holding it (its worker has not seen
   the new catalog yet: it looks every ``CATALOG_CHECK_S``) makes the slot wait for the next pass.
   With the locks held the catalog is read again, whatever its signature says, and a slot that
   is not retired any more is let go: cleared in an earlier pass, a new topic has taken it since.
2. **clear the row and the ring.** ``active`` goes to 0 first (the flusher's cycle and checkpoint
   skip the row from then on; a same-host ring reader that sees it answers ``GONE`` and asks the
   router again, which says ``UNKNOWN_TOPIC``), then the whole row is zeroed (with the lock held
   no owner writes it) and the ring region is unlinked. The slot's log start, byte count and
   punched-index mark leave ``log_starts.json`` and the retention state, and its truncation
   markers ``truncations.json`` (``Retention.forget``; persistence/truncation.py): a later topic
   on the slot must never have its batches taken for cut ones.
3. **checkpoint.** The next checkpoint no longer names the slots, so recovery never compares a
   later topic's index on them with the old topic's offsets.
4. **remove the index files**, last: a retired slot with neither an index file nor a ring is free,
   and the router (``free_slots`` below) gives it to the next partition it creates,
   after making the index file afresh.

The deleted topic's batches stay in the journal until retention deletes their segments (a deleted
topic pins nothing: it has no log start); recovery skips them, knowing their topic id was given
out once and is listed no more (catalog ``deleted_topic_ids``).

The retirer takes narrow handles (persistence/handles.py), never the flusher: the ``Storage``
(settings, catalog, the table's columns, the index cache), the ``RingCache`` (to unmap a slot's
ring), the ``Retention`` (to forget a slot's log start) and two of the flusher's own steps as
callbacks, ``rescan`` and ``checkpoint``. The row is cleared through the documented exception
for it, shm/rows.py ``FlusherColumns.clear_retired``, which takes the held owner lock: the row's
line 1 is the owning actor's and line 0 is nobody's while the row is active.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from tailrace.shm.fence import OwnerLock
from tailrace.broker import datadir
from tailrace.shm import region

from .handles import RingCache, Storage
from .index import index_path
from .retention import Retention, crash_point

log = logging.getLogger("tailrace.retire")

RETIRE_CHECK_NS = 100_000_000  # how often the flusher looks for retired slots to clear


def cleared(settings, slot: int) -> bool:
    """A retired slot is clear when neither its index file (removed last) nor its ring is left."""
    return (not index_path(settings.data_dir, slot).exists()
            and not region.exists(region.ring_name(settings.instance, slot)))


def free_slots(catalog, settings, want: int | None = None) -> list[int]:
    """The retired slots a new partition may take (the router's question): ``want`` of them at
    most (two stats a slot: 10,000 retired slots looked at for each of 2,000 topics made took
    minutes)."""
    out = []
    for slot in catalog.data.retired:
        if want is not None and len(out) >= want:
            break
        if cleared(settings, slot):
            out.append(slot)
    return out


class Retirer:
    """The flusher's side of topic deletion (``run``, between its cycles)."""

    def __init__(self, store: Storage, rings: RingCache, retention: Retention, rescan: Callable[[], None],
                 checkpoint: Callable[[], None]):
        self.s = store.s
        self.catalog = store.catalog
        self.cols = store.cols
        self.indexes = store.indexes
        self.rings = rings
        self.retention = retention
        self.rescan = rescan  # the flusher finds its active rows again
        self.checkpoint = checkpoint  # the flusher syncs and names its journal end as the recovery start
        self.next_ns = 0
        self.slots_retired = 0  # slots cleared by this flusher

    def due(self, now_ns: int) -> bool:
        return now_ns >= self.next_ns

    def pending(self) -> list[int]:
        """Retired slots not cleared yet (an index file or a ring left)."""
        return [slot for slot in self.catalog.data.retired if not cleared(self.s, slot)]

    def run(self, now_ns: int) -> int:
        """Clear every retired slot whose owner has let go; return how many were cleared."""
        self.next_ns = now_ns + RETIRE_CHECK_NS
        self.catalog.reload()  # one stat
        if not self.catalog.data.retired:
            return 0
        pending = self.pending()
        if not pending:
            return 0
        locks = []
        try:
            for slot in pending:
                lock = OwnerLock(os.path.join(self.s.ipc_path(), datadir.slot_lock_name(slot)))
                if lock.try_acquire():
                    locks.append((slot, lock))
                else:
                    lock.close()  # an actor still owns it: next pass
            if not locks:
                return 0
            # Read the catalog again, now that the locks are held: a slot cleared in an earlier
            # pass may have been given to a new topic since (the router takes a cleared slot, writes
            # the catalog, then makes its index file), and clearing it again would zero a live row
            # and unlink the ring its new owner appends to. A slot still retired now cannot be
            # taken meanwhile: it is not clear (``cleared``) until this pass removes its index file.
            self.catalog.reload(force=True)
            retired = set(self.catalog.data.retired)
            slots = [slot for slot, _ in locks if slot in retired]
            if not slots:
                return 0
            held = dict(locks)
            self._clear_rows({slot: held[slot] for slot in slots})
            self._crash_point("rows_cleared")
            self.checkpoint()  # names only active rows: these are not any more
            for i, slot in enumerate(slots):
                try:
                    index_path(self.s.data_dir, slot).unlink()
                except FileNotFoundError:
                    pass
                if i == 0 and len(slots) > 1:
                    self._crash_point("one_index_removed")
            datadir.fsync_dir(index_path(self.s.data_dir, 0).parent)
        finally:
            for _slot, lock in locks:
                lock.close()
        self.slots_retired += len(slots)
        log.info("cleared %d slots of deleted topics: %s", len(slots), slots[:16])
        return len(slots)

    def _clear_rows(self, locks: dict) -> None:
        """Clear the rows of ``locks`` (slot -> its owner lock, held), unmap and unlink their
        rings, forget their log starts and truncation markers."""
        slots = list(locks)
        for slot, lock in locks.items():
            self.indexes.forget(slot)
            self.rings.drop(slot)
            if slot < len(self.cols.rows):
                self.cols.clear_retired(slot, lock)  # active 0 first: readers and the cycle skip it from there
        self.rescan()
        for slot in slots:
            region.unlink(region.ring_name(self.s.instance, slot))
        self.retention.forget(slots)

    def _crash_point(self, step: str) -> None:
        """Fault injection (``debug_crash_at``): die here as a kill -9 would, once per data directory."""
        crash_point(self.s, f"retire_{step}")

