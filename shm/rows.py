"""Typed views of one control-table row: the single-writer principle as a type.

Each cache line of a row (shm/layout.py) has exactly one writer. Instead of a comment at every
store, each writer holds the view of its own line::

    RowView         reads every field, writes none        same-host readers, anyone else
    OwnerRow        + writes line 1                       the partition actor (RingWriter)
    FlusherRow      + writes line 2                       the flusher, one row
    FlusherColumns  every row: reads all, writes line 2   the flusher and its pieces (boot,
                    (vectorised), plus three named           retention, retire), the whole table
                    exceptions to line 0

Line 0 (identity) is written by no one while its row is active, with three exceptions, each a
named ``FlusherColumns`` method whose docstring says why it is safe: ``init_row`` (boot, on a
table no worker serves yet), ``advance_log_starts`` (``log_start_offset``: the flusher is its one
writer once the row is active) and ``clear_retired`` (a deleted topic's row, with the slot's owner
lock held).

The table header has one such word today, ``storage_full``: ``HeaderView`` loads it (a worker,
once per produce request), ``FlusherHeader`` stores it (the flusher's disk guard).

A store to a field of another line raises ``AttributeError`` naming that line's writer. Every
property is one int64 load or store of the shared row through ``cells``, a memoryview of it (a
Python int straight out, no numpy scalar: about 50 ns against 170 for ``int(words[col])``; these
run per batch on the append and read paths). Like numpy's, a memoryview load or store of an
aligned int64 is one 8-byte move, never torn. ``words`` is the same row as ``int64[ROW_WORDS]``,
for vectorised code and for initialising a row nobody else uses yet.

Concurrency contract: a view is as safe as the row under it: loads of other writers' words may
be stale by the time they return; only the owner of a line may store to it (fenced by
``owner_epoch`` for line 1, by the boot owner's lock for line 2).
"""

from __future__ import annotations

import numpy as np

from .layout import C_ACTIVE, C_LOG_START_OFFSET, COL, FLUSHER_COLUMNS, IDENTITY_COLUMNS, OWNER_COLUMNS, ROW_WORDS, STORAGE_FULL_AT, TABLE_HEADER_BYTES

_WRITER = {
    **{c: "line 0 (identity): written at boot or by OwnerRow.init_identity" for c in IDENTITY_COLUMNS},
    COL["log_start_offset"]: "line 0: log_start_offset, stored only by the flusher's retention (FlusherColumns.advance_log_starts)",
    **{c: "line 1: written only by the owning actor (OwnerRow)" for c in OWNER_COLUMNS},
    **{c: "line 2: written only by the flusher (FlusherRow)" for c in FLUSHER_COLUMNS},
}


def _load(col: int):
    def load(self) -> int:
        return self.cells[col]
    return load


def _store(col: int):
    def store(self, value: int) -> None:
        self.cells[col] = value
    return store


def _refuse(name: str, col: int):
    def refuse(self, value: int) -> None:
        raise AttributeError(f"{type(self).__name__} may not store {name}: it is {_WRITER[col]}")
    return refuse


def _field(name: str, writer_owns: bool) -> property:
    """One row word as an int: stored through this view only if its writer owns the word."""
    col = COL[name]
    return property(_load(col), _store(col) if writer_owns else _refuse(name, col))


class RowView:
    """Every field readable, none writable (a reader, or a writer reading the other lines)."""

    __slots__ = ("words", "cells")

    def __init__(self, words: np.ndarray):
        assert words.shape == (ROW_WORDS,) and words.dtype == np.int64, (words.shape, words.dtype)
        self.words = words  # int64[ROW_WORDS], a view of the shared row
        self.cells = memoryview(words).cast("B").cast("q")  # the same words; loads give Python ints

    # line 0: identity
    slot = _field("slot", False)
    topic_id = _field("topic_id", False)
    partition = _field("partition", False)
    active = _field("active", False)
    ring_bytes = _field("ring_bytes", False)
    desc_capacity = _field("desc_capacity", False)
    log_start_offset = _field("log_start_offset", False)
    # line 1: the owning actor
    owner_epoch = _field("owner_epoch", False)
    write_position = _field("write_position", False)
    next_offset = _field("next_offset", False)
    desc_head = _field("desc_head", False)
    desc_tail = _field("desc_tail", False)
    ring_start_offset = _field("ring_start_offset", False)
    truncate_request = _field("truncate_request", False)
    replicated_hw = _field("replicated_hw", False)
    # line 2: the flusher
    flushed_desc = _field("flushed_desc", False)
    flushed_position = _field("flushed_position", False)
    flushed_offset = _field("flushed_offset", False)
    durable_offset = _field("durable_offset", False)
    io_error = _field("io_error", False)
    truncated_to = _field("truncated_to", False)


class OwnerRow(RowView):
    """The owning actor's view: stores to line 1 only (``RingWriter`` holds one)."""

    __slots__ = ()

    owner_epoch = _field("owner_epoch", True)  # the fence: a new owner stores its epoch first
    write_position = _field("write_position", True)
    next_offset = _field("next_offset", True)
    desc_head = _field("desc_head", True)
    desc_tail = _field("desc_tail", True)
    ring_start_offset = _field("ring_start_offset", True)
    truncate_request = _field("truncate_request", True)  # a cut asked of the flusher (actors/truncate.py)
    replicated_hw = _field("replicated_hw", True)

    def init_identity(self, slot: int, topic_id: int, partition: int, ring_bytes: int, desc_capacity: int) -> None:
        """Describe a partition created after boot in a row no one uses yet (``active`` is 0:
        the flusher skips it and no reader trusts it): zero the whole row, write line 0,
        ``active`` last."""
        w = self.words
        assert not w[COL["active"]], "init_identity on an active row: the row has other writers now"
        w[:] = 0
        w[COL["slot"]], w[COL["topic_id"]], w[COL["partition"]] = slot, topic_id, partition
        w[COL["ring_bytes"]], w[COL["desc_capacity"]] = ring_bytes, desc_capacity
        w[COL["active"]] = 1


class FlusherRow(RowView):
    """The flusher's view: stores to line 2 only."""

    __slots__ = ()

    flushed_desc = _field("flushed_desc", True)
    flushed_position = _field("flushed_position", True)
    flushed_offset = _field("flushed_offset", True)
    durable_offset = _field("durable_offset", True)
    io_error = _field("io_error", True)
    truncated_to = _field("truncated_to", True)  # the cut made, durable (persistence/truncation.py)


_FLUSHER_STORES = {n: COL[n] for n in COL if COL[n] in FLUSHER_COLUMNS and not n.startswith("_")}


class FlusherColumns:
    """The flusher's view of the whole control table: every row readable, line 2 storable.

    ``rows`` is the table as ``int64[max_slots, ROW_WORDS]`` **read only** (numpy refuses a
    store through it): a store goes through a method here, which names the column and checks
    it is the flusher's. ``set`` stores one column of many rows at once (numpy, no Python step
    per row: ``durable_offset`` after a sync, ``io_error`` on a latched error); ``store`` one
    word (``_reconcile`` at boot); ``publish_flushed`` the three words of one row the cycle moves.

    Line 0 is written by no one while a row is active, except by the three methods below
    ``publish_flushed``; each says why it is safe. Everything else in line 0 or line 1 raises
    ``AttributeError`` naming the line's writer.

    Concurrency contract: one instance, in the flusher process, used from its main thread only;
    the boot owner's lock (``flusher.lock``) makes it the only flusher of the table."""

    __slots__ = ("rows", "_rows", "_cells")

    def __init__(self, rows: np.ndarray):
        assert rows.ndim == 2 and rows.shape[1] == ROW_WORDS and rows.dtype == np.int64, (rows.shape, rows.dtype)
        self._rows = rows  # int64[max_slots, ROW_WORDS], the shared table (writable)
        ro = rows.view()
        ro.flags.writeable = False
        self.rows = ro  # the same words, read only
        self._cells = memoryview(rows).cast("B").cast("q")  # the same words, flat: slot * ROW_WORDS + column

    def _col(self, name: str) -> int:
        col = _FLUSHER_STORES.get(name)
        if col is None:
            raise AttributeError(f"{type(self).__name__} may not store {name}: it is {_WRITER[COL[name]]}"
                                 if name in COL else f"no control-table column {name!r}")
        return col

    def set(self, slots, name: str, values) -> None:
        """Store column ``name`` (the flusher's line 2 only) of rows ``slots``: one numpy store."""
        self._rows[slots, self._col(name)] = values

    def store(self, slot: int, name: str, value: int) -> None:
        """Store one word of the flusher's line 2."""
        self._cells[slot * ROW_WORDS + self._col(name)] = value

    def publish_flushed(self, slot: int, position: int, desc: int, offset: int) -> None:
        """After a journal write and the slot's index entries: ``flushed_position``, then
        ``flushed_desc``, then ``flushed_offset`` (the order the cycle always used)."""
        c, at = self._cells, slot * ROW_WORDS
        c[at + _C_FLUSHED_POSITION] = position
        c[at + _C_FLUSHED_DESC] = desc
        c[at + _C_FLUSHED_OFFSET] = offset

    # --- the documented exceptions: line 0 -------------------------------------------------
    def init_row(self, slot: int, topic_id: int, partition: int, ring_bytes: int, desc_capacity: int,
                 next_offset: int) -> None:
        """Describe a recovered partition in a table the flusher has just made (boot, fresh).

        Safe because the table is in ``STATE_INITIALIZING``: no worker serves, so no actor owns
        line 1 of any row yet (workers wait for READY, which boot stores last). The whole row is
        zeroed, then identity, the offsets every line starts at, and ``active`` last."""
        w = self._rows[slot]
        w[:] = 0
        w[COL["slot"]], w[COL["topic_id"]], w[COL["partition"]] = slot, topic_id, partition
        w[COL["ring_bytes"]], w[COL["desc_capacity"]] = ring_bytes, desc_capacity
        for name in ("next_offset", "ring_start_offset", "flushed_offset", "durable_offset"):
            w[COL[name]] = next_offset
        w[C_ACTIVE] = 1

    def advance_log_starts(self, slots, starts) -> None:
        """Move ``log_start_offset`` of active rows ``slots`` up to ``starts`` (never down: each
        word becomes the larger of the two). One numpy store.

        Safe although the word is in line 0: once a row is active the flusher is its one writer
        (an actor zeroes it only in ``OwnerRow.init_identity``, on a row not active yet, and never
        stores it after); retention (persistence/retention.py) writes it only for rows it saw
        active, from the flusher's main thread, after the new starts are durable. A reader's load
        may be one pass stale: the bytes below a start go a pass later."""
        slots = np.asarray(slots, dtype=np.int64)
        rows = self._rows
        rows[slots, C_LOG_START_OFFSET] = np.maximum(rows[slots, C_LOG_START_OFFSET], starts)

    def clear_retired(self, slot: int, lock) -> None:
        """Clear a deleted topic's row: ``active`` to 0 first (the cycle and same-host readers
        skip the row from then on), then every word of the row, all three lines.

        Safe because ``lock`` is the slot's owner lock (shm/fence.py ``OwnerLock``), held: no
        actor owns the row, so none stores to line 1, and none may make the row anew
        (``OwnerRow.init_identity``) until its index file is gone, which persistence/retire.py
        removes only after this."""
        assert getattr(lock, "held", False), f"clear_retired(slot={slot}) without the slot's owner lock held"
        w = self._rows[slot]
        w[C_ACTIVE] = 0
        w[:] = 0


_C_FLUSHED_POSITION, _C_FLUSHED_DESC, _C_FLUSHED_OFFSET = (COL[n] for n in ("flushed_position", "flushed_desc", "flushed_offset"))


class HeaderView:
    """The control table header's ``storage_full`` word, readable (a worker's view).

    Concurrency contract: only the flusher stores the word (``FlusherHeader``), and only when its
    disk check changes its mind; a load may be one check stale, which is all the admission of a
    produce request needs (a request that slips in fills the disk by one batch, never loses one)."""

    __slots__ = ("cells",)

    def __init__(self, words: np.ndarray):
        assert words.shape == (TABLE_HEADER_BYTES // 8,) and words.dtype == np.int64, (words.shape, words.dtype)
        self.cells = memoryview(words).cast("B").cast("q")  # the header as int64 words; loads give Python ints

    @property
    def storage_full(self) -> int:
        return self.cells[STORAGE_FULL_AT // 8]

    @storage_full.setter
    def storage_full(self, value: int) -> None:
        raise AttributeError(f"{type(self).__name__} may not store storage_full: it is written only by the flusher (FlusherHeader)")


class FlusherHeader(HeaderView):
    """The flusher's view of the header word it owns."""

    __slots__ = ()

    @HeaderView.storage_full.setter
    def storage_full(self, value: int) -> None:
        self.cells[STORAGE_FULL_AT // 8] = int(value)


def _writable(cls: type) -> set[int]:
    return {COL[n] for n in dir(cls) if n in COL and getattr(cls, n).fset.__name__ == "store"}


# Every named word has a property, and each view stores exactly its own line's named words.
assert {n for n in COL if not n.startswith("_")} <= set(dir(RowView))
assert not _writable(RowView)
assert _writable(OwnerRow) == {COL[n] for n in COL if COL[n] in OWNER_COLUMNS and not n.startswith("_")}
assert _writable(FlusherRow) == {COL[n] for n in COL if COL[n] in FLUSHER_COLUMNS and not n.startswith("_")}
assert set(_FLUSHER_STORES.values()) == _writable(FlusherRow)  # FlusherColumns.set stores what FlusherRow does
