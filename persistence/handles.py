"""The narrow handles the flusher gives its pieces: what each may read and touch, never the Flusher.

The flusher (persistence/flusher.py) owns the journal, the control table, the rings it maps and
the index files it writes. Boot, retention, the disk guard and the retirer each need a little of
that; they take these, explicitly, so what a piece can reach is what its constructor names::

    IndexCache      slot -> writable IndexFile: ``get`` (opened on first use), ``forget`` (closed)
    RingCache       slot -> attached Ring: ``get`` (raises RingGone), ``drop`` (closed)
    JournalBounds   the two journal positions below which segments may go: where recovery starts
                    (``checkpointed_at``) and the segment being written (``segment_start``)
    Storage         settings, catalog, the table's columns (shm/rows.py ``FlusherColumns``), the
                    index cache and the journal bounds: what retention and the disk guard see

Who takes what:

    boot.boot       settings, catalog, journal, RingCache          (returns a ``Booted``)
    Retention       Storage
    DiskGuard       Storage, FlusherHeader, the Retention it asks to delete
    Retirer         Storage, RingCache, Retention, and the flusher's rescan and checkpoint

Thread-safety: the flusher's main thread only, as everything they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailrace.broker.catalog import Catalog
from tailrace.broker.settings import Settings
from tailrace.shm.ring import Ring
from tailrace.shm.rows import FlusherColumns

from .index import IndexFile
from .journal import Journal


class RingGone(Exception):
    """Raised when an active row's ring region does not exist (``Flusher.ring_gone``)."""

    def __init__(self, slot: int):
        super().__init__(f"slot {slot}: ring region gone")
        self.slot = slot


class IndexCache:
    """The flusher's writable index files, one per slot, opened on first use."""

    __slots__ = ("data_dir", "files")

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.files: dict[int, IndexFile] = {}  # slot -> writable index

    def get(self, slot: int) -> IndexFile:
        idx = self.files.get(slot)
        if idx is None:
            idx = self.files[slot] = IndexFile(self.data_dir, slot, writable=True)
        return idx

    def forget(self, slot: int) -> None:
        """Close a slot's index file (a deleted topic's: persistence/retire.py)."""
        idx = self.files.pop(slot, None)
        if idx is not None:
            idx.close()

    def values(self):
        return self.files.values()


class RingCache:
    """The rings the flusher has mapped, one per slot, attached on first use."""

    __slots__ = ("instance", "rings")

    def __init__(self, instance: str):
        self.instance = instance
        self.rings: dict[int, Ring] = {}  # slot -> attached ring

    def get(self, slot: int, ring_bytes: int) -> Ring:
        ring = self.rings.get(slot)
        if ring is None:
            try:
                ring = Ring.attach(self.instance, slot, ring_bytes)
            except Exception as exc:  # posix_ipc.ExistentialError: the region is gone
                if type(exc).__name__ != "ExistentialError":
                    raise
                raise RingGone(slot) from exc
            self.rings[slot] = ring
        return ring

    def drop(self, slot: int) -> None:
        """Unmap a slot's ring (it stays in /dev/shm until someone unlinks it)."""
        ring = self.rings.pop(slot, None)
        if ring is not None:
            ring.close()

    def values(self):
        return self.rings.values()

    def clear(self) -> None:
        self.rings.clear()


class JournalBounds:
    """The journal positions no segment deletion may pass: recovery starts at the last
    checkpoint (``checkpointed_at``, the flusher stores it at each checkpoint), and the segment
    being written (``segment_start``, the journal's own)."""

    __slots__ = ("journal", "checkpointed_at")

    def __init__(self, journal: Journal):
        self.journal = journal
        self.checkpointed_at = 0  # the journal position of the last checkpoint

    @property
    def segment_start(self) -> int:
        return self.journal.segment_start

    def keep_from(self, segment_bytes: int) -> int:
        """The start of the oldest segment that must stay for recovery and the writer."""
        keep = min(self.checkpointed_at, self.journal.segment_start)
        return keep - keep % segment_bytes


@dataclass(frozen=True, slots=True)
class Storage:
    """What retention and the disk guard may read and touch of the flusher's state."""

    s: Settings
    catalog: Catalog  # reloaded by its readers (one stat)
    cols: FlusherColumns  # the control table: reads, and the flusher's stores
    indexes: IndexCache
    bounds: JournalBounds
