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
   punched-index mark leave ``log_starts.json`` and the retention state.
3. **checkpoint.** The next checkpoint no longer names the slots, so recovery never compares a
   later topic's index on them with the old topic's offsets.
4. **remove the index files**, last: a retired slot with neither an index file nor a ring is free,
   and the router (``free_slots`` below) gives it to the next partition it creates,
   after making the index file afresh.

The deleted topic's batches stay in the journal until retention deletes their segments (a deleted
topic pins nothing: it has no log start); recovery skips them, knowing their topic id was given
out once and is listed no more (catalog ``deleted_topic_ids``).
"""

from __future__ import annotations

import logging
import os

from tailrace.shm.fence import OwnerLock
from tailrace.broker import datadir
from tailrace.shm import region
from tailrace.shm.layout import COL

from .index import index_path
from .retention import write_log_starts

log = logging.getLogger("tailrace.retire")

RETIRE_CHECK_NS = 100_000_000  # how often the flusher looks for retired slots to clear


def cleared(settings, slot: int) -> bool:
    """A retired slot is clear when neither its index file (removed last) nor its ring is left."""
    return (not index_path(settings.data_dir, slot).exists()
            and not region.exists(region.ring_name(settings.instance, slot)))


def free_slots(catalog, settings) -> list[int]:
    """The retired slots a new partition may take (the router's question)."""
    return [slot for slot in catalog.data.retired if cleared(settings, slot)]


class Retirer:
    """The flusher's side of topic deletion (``run``, between its cycles)."""

    def __init__(self, flusher):
        self.f = flusher
        self.s = flusher.s
        self.next_ns = 0
        self.slots_retired = 0  # slots cleared by this flusher

    def due(self, now_ns: int) -> bool:
        return now_ns >= self.next_ns

    def pending(self) -> list[int]:
        """Retired slots not cleared yet (an index file or a ring left)."""
        return [slot for slot in self.f.catalog.data.retired if not cleared(self.s, slot)]

    def run(self, now_ns: int) -> int:
        """Clear every retired slot whose owner has let go; return how many were cleared."""
        self.next_ns = now_ns + RETIRE_CHECK_NS
        self.f.catalog.reload()  # one stat
        if not self.f.catalog.data.retired:
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
            self.f.catalog.reload(force=True)
            retired = set(self.f.catalog.data.retired)
            slots = [slot for slot, _ in locks if slot in retired]
            if not slots:
                return 0
            self._clear_rows(slots)
            self._crash_point("rows_cleared")
            self.f.checkpoint()  # names only active rows: these are not any more
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

    def _clear_rows(self, slots: list[int]) -> None:
        f, rows = self.f, self.f.table.rows
        for slot in slots:
            idx = f.indexes.pop(slot, None)
            if idx is not None:
                idx.close()
            ring = f.rings.pop(slot, None)
            if ring is not None:
                ring.close()
            if slot < len(rows):
                rows[slot, COL["active"]] = 0  # first: readers and the flusher's cycle skip it from here
                rows[slot, :] = 0
        f.rescan()
        for slot in slots:
            region.unlink(region.ring_name(self.s.instance, slot))
        if f.retention.forget(slots):
            write_log_starts(self.s.data_dir, f.retention.starts, f.retention.start_topics)

    def _crash_point(self, step: str) -> None:
        """Fault injection (``debug_crash_at``): die here as a kill -9 would, once per data directory."""
        self.f.retention._crash_point(f"retire_{step}")

