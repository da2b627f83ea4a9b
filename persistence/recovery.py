"""Recovery: make the journal and the indexes agree again, after any stop.

Some facts we rely on: a process crash loses nothing the kernel already accepted (written pages
stay in the page cache); a host crash loses whatever was not fsynced, and a write in flight may
leave a torn tail: part of a batch, or later blocks without earlier ones.

What recovery does, every time the flusher starts:

1. Read the checkpoint (``journal/checkpoint``): a journal position below which every index
   entry is known to be synced.
2. Scan the journal from there: each batch is self-describing (length, CRC, topic id, partition,
   base offset, count), so the scan needs nothing else. The scan stops at the first zero length
   at the end of the data or the first batch that fails its checks (the torn tail).
   Base offset, partition and topic id are stamped outside the CRC, so a batch must also name a
   partition of the catalog and continue its offsets exactly; the first that does not is cut
   like a torn tail. A batch of a deleted topic (an id given out once, listed no more) is
   skipped: it stays until retention deletes its segment.
3. Truncate the torn tail: zero its bytes in place (segments are pre-written, their size never
   changes) and drop later segments, logging how many non-zero bytes were cut.
   Batches a truncation marker cuts (a partition's log cut back on its owner's request:
   ``journal/truncations.json``, persistence/truncation.py) are skipped before that check.
4. Rewrite the index entries of every scanned batch and truncate each index to its journal's
   truth (the entries a marker cuts are not kept); an index that disagrees with the journal below the checkpoint triggers a full rescan
   from the first segment (indexes are derived data). Each partition's index is read, checked,
   written and cut through its ``PartitionLog`` (persistence/log.py ``at_recovery``); recovery
   decides, the log reads and writes its own file.
5. fsync the rewritten indexes and the scanned segments, then move the checkpoint to the end.

The result is each partition's next offset, which the flusher publishes before the broker serves.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tailrace.broker.catalog import Catalog
from tailrace.broker.datadir import CHECKPOINT_FILE, INSTANCE_FILE, JOURNAL_DIR, segment_name, write_atomic
from tailrace.client.records import PREFIX_BYTES, BatchError, align8_array, read_header, validate_frame

from .index import entries_for
from .journal import check_segments, list_segments
from .log import PartitionLog
from .retention import read_log_starts
from . import truncation

log = logging.getLogger("tailrace.recovery")


def data_dir_id(data_dir, create: bool = False) -> int | None:
    """The data directory's random identity (None if it has none and ``create`` is False).

    Shared memory outlives the processes, and even a deleted data directory: the control table
    carries this id so that a directory wiped and recreated at the same path never inherits the
    rings of the one it replaced."""
    path = Path(data_dir) / INSTANCE_FILE
    try:
        return int(json.loads(path.read_text())["id"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        if not create:
            return None
    ident = int.from_bytes(os.urandom(8), "little") >> 2
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"id": ident}).encode())
    return ident


def read_checkpoint(data_dir) -> tuple[int, dict[int, int]]:
    """(journal position, {slot: next offset below that position}); (0, {}) if none."""
    try:
        doc = json.loads((Path(data_dir) / JOURNAL_DIR / CHECKPOINT_FILE).read_text())
        return int(doc["position"]), {int(k): int(v) for k, v in doc.get("next_offsets", {}).items()}
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return 0, {}


def write_checkpoint(data_dir, position: int, next_offsets: dict[int, int] | None = None) -> None:
    doc = {"position": position, "next_offsets": {str(k): int(v) for k, v in (next_offsets or {}).items()}}
    write_atomic(Path(data_dir) / JOURNAL_DIR / CHECKPOINT_FILE, json.dumps(doc).encode())


@dataclass
class ScanResult:
    start: int
    end: int  # journal position right after the last good batch
    torn_at: int | None = None
    cut_bytes: int = 0
    # per scanned batch, in journal order
    topic_id: list = field(default_factory=list)
    partition: list = field(default_factory=list)
    base_offset: list = field(default_factory=list)
    count: list = field(default_factory=list)
    position: list = field(default_factory=list)
    length: list = field(default_factory=list)


def scan(journal_dir: Path, segment_bytes: int, start: int, max_batch_bytes: int) -> ScanResult:
    """Walk batches from ``start`` to the end of good data (one Python step per batch)."""
    segments = [s for s in list_segments(journal_dir) if s + segment_bytes > start]
    res = ScanResult(start=start, end=start)
    for i, seg in enumerate(segments):
        path = journal_dir / segment_name(seg)
        size = path.stat().st_size
        if size == 0:
            break
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
            p = max(start, seg) - seg
            good_end = None
            while p + PREFIX_BYTES <= size:
                length = int.from_bytes(mm[p : p + 4], "little", signed=True)
                if length == 0:
                    break
                try:
                    frame, _ = validate_frame(mm, p, size, max_batch_bytes, deep=False)  # CRC and structure; a compressed section was checked at produce
                except BatchError as exc:
                    good_end = seg + p
                    res.torn_at = good_end
                    log.warning("journal: bad batch at position %d (%s)", good_end, str(exc))
                    break
                h = read_header(mm, p)
                res.topic_id.append(int(h["topic_id"]))
                res.partition.append(int(h["partition"]))
                res.base_offset.append(int(h["base_offset"]))
                res.count.append(int(h["record_count"]))
                res.position.append(seg + p)
                res.length.append(int(h["length"]))
                p += frame
            res.end = seg + p if good_end is None else good_end
            tail = np.frombuffer(mm, dtype=np.uint8)[res.end - seg :]
            nz = np.flatnonzero(tail)
            del tail
        if res.torn_at is None and nz.size:
            res.torn_at = res.end  # a zero length followed by junk: a torn multi-block write
        if res.torn_at is not None:
            res.cut_bytes += int(nz[-1]) + 1 if nz.size else 0
            for later in segments[i + 1 :]:
                with open(journal_dir / segment_name(later), "rb") as lf:
                    res.cut_bytes += _nonzero_bytes(lf)
            break
        # Data ended inside this segment: continue only if the next segment starts with data.
        if i + 1 < len(segments):
            nxt = journal_dir / segment_name(segments[i + 1])
            with open(nxt, "rb") as nf:
                first = nf.read(4)
            if len(first) == 4 and int.from_bytes(first, "little", signed=True) != 0:
                continue
            break
    return res


def _cut_at_first_inconsistent(res: ScanResult, catalog: Catalog, full: bool, starts: dict[int, int]) -> None:
    """Treat the first batch whose broker-stamped fields do not add up as the torn tail.

    Base offset, partition and topic id are stamped outside the CRC (stamping needs no CRC
    recompute), so the CRC cannot vouch for them: a batch must name a partition in the catalog
    and continue that partition's offsets exactly (on a full rescan its first batch must hold
    or precede its log start, the segments before having gone with retention; otherwise from
    its previous batch, the index tail being checked against the checkpoint separately)."""
    slot_of = {(t.topic_id, p): slot for t in catalog.data.topics.values() for p, slot in enumerate(t.slots)}
    deleted = catalog.deleted_topic_ids(res.topic_id).tolist() if res.topic_id else []
    expect: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(res.topic_id, res.partition)):
        if deleted[i] and res.count[i] >= 1:  # a deleted topic's batch: kept until its segment goes, never read
            continue
        base = res.base_offset[i]
        first_ok = not full or base <= starts.get(slot_of.get(key, -1), 0)
        want = expect.get(key, base if first_ok else -1)
        if key not in slot_of or base != want or res.count[i] < 1:
            bad = res.position[i]
            log.warning("journal: batch at position %d names topic %d partition %d offset %d, expected %s: cut there",
                        bad, key[0], key[1], base, want if key in slot_of else "a known partition")
            res.cut_bytes += int(align8_array(np.asarray(res.length[i:], dtype=np.int64)).sum())
            for name in ("topic_id", "partition", "base_offset", "count", "position", "length"):
                del getattr(res, name)[i:]
            res.end = bad
            res.torn_at = bad
            return
        expect[key] = base + res.count[i]


def _nonzero_bytes(f) -> int:
    data = np.frombuffer(f.read(), dtype=np.uint8)
    nz = np.flatnonzero(data)
    return int(nz[-1]) + 1 if nz.size else 0


def _truncate_tail(journal_dir: Path, segment_bytes: int, res: ScanResult) -> None:
    seg = res.end - res.end % segment_bytes
    path = journal_dir / segment_name(seg)
    if path.exists():
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            off = res.end - seg
            zeros = bytes(min(size - off, 1 << 20))
            while off < size:
                n = os.pwrite(fd, zeros[: min(size - off, len(zeros))], off)
                off += n
            os.fsync(fd)
        finally:
            os.close(fd)
    for later in list_segments(journal_dir):
        if later > seg:
            (journal_dir / segment_name(later)).unlink()
    log.warning("journal: truncated torn tail at position %d, cut %d bytes", res.end, res.cut_bytes)


@dataclass
class Recovered:
    end_position: int
    next_offsets: dict[int, int]  # slot -> next offset
    cut_bytes: int
    scanned_batches: int
    full_rescan: bool


def recover(data_dir, segment_bytes: int, max_batch_bytes: int, catalog: Catalog | None = None) -> Recovered:
    data_dir = Path(data_dir)
    journal_dir = data_dir / JOURNAL_DIR
    journal_dir.mkdir(parents=True, exist_ok=True)
    catalog = catalog or Catalog(data_dir)
    check_segments(journal_dir, segment_bytes)
    checkpoint, expected = read_checkpoint(data_dir)
    starts = read_log_starts(data_dir)  # persistence/retention.py: records below these are gone
    cuts = truncation.applicable(truncation.read_truncations(data_dir), catalog)  # logs cut back: skip what was cut
    segments = list_segments(journal_dir)
    full = not segments or checkpoint < segments[0] or checkpoint > segments[-1] + segment_bytes
    # A stored batch is judged by what the journal can hold, not by today's produce limit:
    # lowering max_batch_bytes must never turn older, valid batches into a "torn tail".
    limit = max(max_batch_bytes, segment_bytes)
    for attempt in (0, 1):
        start = segments[0] if (full and segments) else (0 if full else checkpoint)
        res = scan(journal_dir, segment_bytes, start, limit)
        truncation.drop_cut(res, cuts)
        _cut_at_first_inconsistent(res, catalog, full, starts)
        if res.torn_at is not None:
            _truncate_tail(journal_dir, segment_bytes, res)
        consistent, next_offsets = _rebuild_indexes(data_dir, catalog, res, full, {} if full else expected, segment_bytes,
                                                    starts, cuts)
        if consistent or full:
            break
        log.warning("index disagrees with the journal below the checkpoint: full rescan")
        full = True
    for seg in list_segments(journal_dir):
        if seg + segment_bytes > start:
            fd = os.open(journal_dir / segment_name(seg), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    truncation.clamp(data_dir, res.end)  # before the checkpoint that lets writing go on at res.end
    write_checkpoint(data_dir, res.end, next_offsets)
    if res.position:
        log.info("recovery scanned %d batches from position %d to %d", len(res.position), start, res.end)
    return Recovered(res.end, next_offsets, res.cut_bytes, len(res.position), full)


def _rebuild_indexes(data_dir: Path, catalog: Catalog, res: ScanResult, full: bool, expected: dict[int, int],
                     segment_bytes: int, starts: dict[int, int], cuts: dict) -> tuple[bool, dict[int, int]]:
    by_key = {(t.topic_id, p): slot for t in catalog.data.topics.values() for p, slot in enumerate(t.slots)}
    arrays = {k: np.asarray(getattr(res, k), dtype=np.int64) for k in ("topic_id", "partition", "base_offset", "count", "position", "length")}
    keys = arrays["topic_id"] * (1 << 32) + arrays["partition"]
    next_offsets: dict[int, int] = {}
    consistent = True
    for (topic_id, partition), slot in by_key.items():
        plog = PartitionLog.at_recovery(data_dir, slot)
        try:
            n = plog.entry_count()
            below = 0
            pairs = cuts[slot][2] if slot in cuts else ()
            if n and not full:
                below = truncation.kept_below(plog, plog.entries_below(res.start), pairs)
                # entries below the log start point into segments retention may have deleted
                if below > starts.get(slot, 0) and not plog.last_entry_matches(below, topic_id, partition, segment_bytes):
                    consistent = False
                    log.warning("slot %d: last index entry below the checkpoint does not match the journal", slot)
            want = truncation.expected_below(expected[slot], res.start, pairs) if slot in expected else below
            if not full and below != want:
                consistent = False
                log.warning("slot %d: index holds %d entries below the checkpoint, the checkpoint says %d", slot, below, want)
            sel = np.flatnonzero(keys == topic_id * (1 << 32) + partition)
            if sel.size:
                bases = arrays["base_offset"][sel]
                counts = arrays["count"][sel]
                dense = bool(np.all(bases[1:] == bases[:-1] + counts[:-1])) if sel.size > 1 else True
                if int(bases[0]) != below or not dense:
                    consistent = False
                    log.warning("slot %d: journal batch at offset %d but index holds %d entries", slot, int(bases[0]), below)
                    if not full:
                        continue
                ent = entries_for(arrays["position"][sel], arrays["length"][sel], counts)
                plog.write_entries(int(bases[0]), ent)
                end = int(bases[-1] + counts[-1])
            else:
                end = below
            end = max(end, starts.get(slot, 0))  # offsets never go below a log start, even with the records gone
            plog.truncate_index(end)  # to the journal's truth (a no-op where it is already)
            plog.sync_index()
            next_offsets[slot] = end
        finally:
            plog.close()
    unknown = np.flatnonzero(~np.isin(keys, np.asarray([t * (1 << 32) + p for t, p in by_key] or [-1], dtype=np.int64)))
    if unknown.size:
        log.info("journal holds %d batches of deleted topics; skipped", unknown.size)
    return consistent, next_offsets
