"""Cutting one partition's log back to an offset: the flusher's side, and what recovery honours.

A cluster follower whose copy diverged from its new leader's (Kafka's leader-epoch truncation,
KIP-101/279) cuts its log back to an offset T and appends the leader's batches from T on
(actors/truncate.py is the actor's side). The journal cannot be cut: it is shared by every
partition, batches interleaved, and segments are never truncated. So a cut is a *marker*: in
``journal/truncations.json``, per slot, a list of (journal position P, offset T) meaning
"batches of this slot at journal positions below P with offsets at or above T are cut". P is
the journal's end when the cut was made: every batch of the slot written before the cut lies
below it, every batch written after lies at or above it. The file::

    {"truncations": {"<slot>": {"topic_id": 7, "cuts": [[P, T], ...]}}}

(cuts in the order they were made, P never decreasing; the topic id guards a slot a later topic
took). Slots with no cut are left out; a missing or unreadable file is no cut.

The flusher makes a cut (``Cutter.poll``, at each kick of its doorbell and every ``CHECK_NS``:
one numpy look at the two handshake words of the active rows, shm/layout.py) when an actor asks in its row's ``truncate_request``
(T + 1) and has let the flusher copy out every descriptor (``flushed_desc == desc_head``: the
actor stores no request before that, and refuses appends while it is pending). In this order:

1. fsync the journal, so that every byte below P is durable: recovery then never finds the
   journal ending below a marker, and no batch written after the cut can land below its P;
2. add (P, T) to ``truncations.json`` (temp file, fsync, rename, directory fsync): **the cut is
   made here**. A crash before leaves the old log (the actor's request, still in shared memory,
   is made again by the next flusher; a host crash loses the request and the follower asks again);
   a crash after leaves the cut log, whatever else was done;
3. cut the slot's index file to T entries, and forget retention's byte count of the slot;
4. reset the slot's line 2: ``flushed_offset = T`` (the next batch staged starts there) and
   ``durable_offset = min(durable_offset, T)`` (a re-appended offset is durable only after its
   own sync);
5. checkpoint (indexes synced, the checkpoint names the slot's next offset T): a normal restart
   starts after the cut;
6. acknowledge in ``truncated_to`` (T + 1): the actor then empties its ring window at T.

A crash between 2 and 6 is made good by doing them again: the request is still in the row and
every step is idempotent (a second marker with a later P cuts nothing more: appends were refused
meanwhile). T is never below the slot's log start: retention passes over a slot with a pending
cut, and should it have moved the start past T first, the cut is made at the start (the
acknowledgement says where).

Recovery (persistence/recovery.py) reads the markers: a scan drops the cut batches before it
checks that each partition's offsets run densely (``drop_cut``), and the index entries kept
below the scan's start, and the count the checkpoint expects there, are cut the same way
(``kept_below``, ``expected_below``). A marker goes when retention has deleted every segment
below its P (``Truncations.prune``: nothing it could cut is left) and with its slot when the
slot's topic is deleted (``forget``, persistence/retire.py through retention).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tailrace.broker.datadir import JOURNAL_DIR, TRUNCATIONS_FILE, write_atomic
from tailrace.shm.layout import (
    C_DESC_HEAD, C_DURABLE_OFFSET, C_FLUSHED_DESC, C_FLUSHED_OFFSET, C_LOG_START_OFFSET, C_TOPIC_ID,
    C_TRUNCATE_REQUEST, C_TRUNCATED_TO,
)

from .handles import Storage
from .retention import Retention, crash_point

log = logging.getLogger("tailrace.truncation")
CHECK_NS = 20_000_000  # the flusher looks for cuts asked at every kick, and at least this often


@dataclass(slots=True)
class Marks:
    """One slot's cuts: its topic's id, and (journal position, offset) pairs in the order made."""

    topic_id: int
    cuts: list[tuple[int, int]] = field(default_factory=list)


def truncations_path(data_dir) -> Path:
    return Path(data_dir) / JOURNAL_DIR / TRUNCATIONS_FILE


def read_truncations(data_dir) -> dict[int, Marks]:
    """{slot: its cuts} as last written ({} when there is no file)."""
    try:
        doc = json.loads(truncations_path(data_dir).read_text())
        return {int(k): Marks(int(v["topic_id"]), [(int(p), int(t)) for p, t in v["cuts"]])
                for k, v in doc["truncations"].items()}
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_truncations(data_dir, marks: dict[int, Marks]) -> None:
    doc = {"truncations": {str(slot): {"topic_id": m.topic_id, "cuts": [list(c) for c in m.cuts]}
                           for slot, m in sorted(marks.items()) if m.cuts}}
    write_atomic(truncations_path(data_dir), json.dumps(doc).encode())


class Truncations:
    """The markers, in memory and in ``journal/truncations.json`` (every change written durably
    before it is relied on). The flusher's main thread only."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.marks: dict[int, Marks] = read_truncations(data_dir)

    def add(self, slot: int, topic_id: int, position: int, offset: int) -> None:
        """Record the cut of ``slot`` to ``offset`` made at journal ``position``, durably."""
        m = self.marks.get(slot)
        if m is None or m.topic_id != topic_id:  # a deleted topic's marks never apply to a new one
            m = self.marks[slot] = Marks(topic_id)
        if (position, offset) not in m.cuts:
            m.cuts.append((position, offset))
        write_truncations(self.data_dir, self.marks)

    def forget(self, slots) -> None:
        """Drop the marks of ``slots`` (their topic was deleted: persistence/retire.py)."""
        if any(self.marks.pop(slot, None) is not None for slot in list(slots)):
            write_truncations(self.data_dir, self.marks)

    def prune(self, first_position: int) -> None:
        """Drop the cuts whose every batch has gone with its segment: those with P at or below
        the first segment left (``first_position``)."""
        changed = False
        for slot in list(self.marks):
            m = self.marks[slot]
            kept = [c for c in m.cuts if c[0] > first_position]
            if len(kept) != len(m.cuts):
                changed = True
                m.cuts = kept
                if not kept:
                    del self.marks[slot]
        if changed:
            write_truncations(self.data_dir, self.marks)


def clamp(data_dir, end: int) -> None:
    """Recovery's last word on the markers: a marker past the journal's recovered end (its bytes
    were lost though synced before it was written: a disk that lied) is moved back to that end,
    where writing goes on, so that no batch written from now on is taken for a cut one."""
    marks = read_truncations(data_dir)
    moved = False
    for m in marks.values():
        cuts = [(min(p, end), t) for p, t in m.cuts]
        moved |= cuts != m.cuts
        m.cuts = cuts
    if moved:
        log.warning("truncation markers past the journal's recovered end %d moved back to it", end)
        write_truncations(data_dir, marks)


# --- recovery -------------------------------------------------------------------------------
def applicable(marks: dict[int, Marks], catalog) -> dict[int, tuple[int, int, list[tuple[int, int]]]]:
    """{slot: (topic id, partition, cuts)} for the marks of slots whose present topic made them."""
    out = {}
    for slot, m in marks.items():
        found = catalog.by_slot.get(slot)
        if found is not None and found[0].topic_id == m.topic_id and m.cuts:
            out[slot] = (m.topic_id, found[1], m.cuts)
    return out


SCAN_FIELDS = ("topic_id", "partition", "base_offset", "count", "position", "length")


def drop_cut(res, cuts: dict[int, tuple[int, int, list[tuple[int, int]]]]) -> int:
    """Remove from a recovery scan (persistence/recovery.py ``ScanResult``) every batch a marker
    cuts: numpy over the scanned batches, one step per marker. Returns how many were removed."""
    if not cuts or not res.position:
        return 0
    keys = np.asarray(res.topic_id, dtype=np.int64) * (1 << 32) + np.asarray(res.partition, dtype=np.int64)
    pos = np.asarray(res.position, dtype=np.int64)
    base = np.asarray(res.base_offset, dtype=np.int64)
    cut = np.zeros(len(pos), dtype=bool)
    for topic_id, partition, pairs in cuts.values():
        sel = keys == topic_id * (1 << 32) + partition
        for p, t in pairs:
            cut |= sel & (pos < p) & (base >= t)
    n = int(np.count_nonzero(cut))
    if n:
        keep = ~cut
        for name in SCAN_FIELDS:
            setattr(res, name, np.asarray(getattr(res, name), dtype=np.int64)[keep].tolist())
        log.info("recovery: %d batches skipped as cut by truncation markers", n)
    return n


def kept_below(plog, below: int, pairs: list[tuple[int, int]]) -> int:
    """How many of the ``below`` index entries a partial scan keeps survive the cuts: an entry at
    offset T whose batch lies below the marker's P is an old one (the index was not cut yet when
    the flusher stopped), so nothing from T on is kept. (A cut index holds at T either nothing or
    a batch written after the cut, at or above P.)"""
    for p, t in pairs:
        if t < below:
            at = plog.position_of(t)
            if at is not None and at < p:
                below = t
    return below


def expected_below(expected: int, start: int, pairs: list[tuple[int, int]]) -> int:
    """The checkpoint's count of entries below its position ``start``, after the cuts made at or
    after it (P >= start: the checkpoint was written before them; a later checkpoint names P or
    beyond and already counts the cut)."""
    for p, t in pairs:
        if p >= start:
            expected = min(expected, t)
    return expected


# --- the flusher ----------------------------------------------------------------------------
class Cutter:
    """The flusher's side of a cut (``poll``, every loop turn). Takes narrow handles: the
    ``Storage`` (settings, the table's columns, the index cache), the ``Truncations``, the
    ``Retention`` (its per-slot byte count goes with the cut), and three of the flusher's own
    steps: ``sync`` (the journal, if it holds unsynced bytes), ``checkpoint`` and ``journal_end``
    (the position past every byte written)."""

    def __init__(self, store: Storage, truncations: Truncations, retention: Retention, sync: Callable[[], None],
                 checkpoint: Callable[[], None], journal_end: Callable[[], int]):
        self.s, self.cols, self.indexes = store.s, store.cols, store.indexes
        self.truncations, self.retention = truncations, retention
        self.sync, self.checkpoint, self.journal_end = sync, checkpoint, journal_end
        self.cuts = 0  # cuts made by this flusher
        self.next_ns = 0

    def due(self, now_ns: int) -> bool:
        """Whether to look without a kick: an actor kicks the flusher when it asks for a cut (its
        caller's ``durable_added``), but not when it clears its request, nor after a restart."""
        return now_ns >= self.next_ns

    def poll(self, slots: np.ndarray, now_ns: int = 0) -> int:
        """Clear the acknowledgements whose request is gone, make the cuts asked of ``slots`` (the
        active rows); returns how many cuts were made. Two numpy loads when nothing is asked
        (~5 us for a few slots, ~35 us for 4,096: per kick or per ``CHECK_NS``, not per turn)."""
        self.next_ns = now_ns + CHECK_NS
        rows = self.cols.rows
        req, ack = rows[slots, C_TRUNCATE_REQUEST], rows[slots, C_TRUNCATED_TO]
        if not (np.count_nonzero(req) or np.count_nonzero(ack)):
            return 0
        done = slots[(req == 0) & (ack != 0)]
        if done.size:
            self.cols.set(done, "truncated_to", 0)  # the actor has its window reset: the next cut may be asked
        made = 0
        for slot in slots[(req != 0) & (ack == 0)].tolist():
            made += self._cut(slot, int(rows[slot, C_TRUNCATE_REQUEST]) - 1)
        return made

    def _cut(self, slot: int, offset: int) -> int:
        """Cut ``slot`` back to ``offset`` (steps 1-6 of the module docstring); 0 if it must wait."""
        row = self.cols.rows[slot]
        if row[C_FLUSHED_DESC] != row[C_DESC_HEAD]:
            return 0  # the actor asks only once everything is copied out: a request from before a restart
        flushed = int(row[C_FLUSHED_OFFSET])
        to = min(max(offset, int(row[C_LOG_START_OFFSET])), flushed)
        self.sync()
        position = self.journal_end()
        self.truncations.add(slot, int(row[C_TOPIC_ID]), position, to)
        crash_point(self.s, "truncate_marker_written")
        self.indexes.get(slot).truncate(to)
        self.retention.cut(slot)
        self.cols.store(slot, "flushed_offset", to)
        self.cols.store(slot, "durable_offset", min(int(row[C_DURABLE_OFFSET]), to))
        self.checkpoint()
        crash_point(self.s, "truncate_checkpointed")
        self.cols.store(slot, "truncated_to", to + 1)
        self.cuts += 1
        log.info("slot %d cut back to offset %d (was %d) at journal position %d", slot, to, flushed, position)
        return 1
