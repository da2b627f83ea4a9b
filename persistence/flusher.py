"""The flusher process: drain every ring into the journal, sync by policy, publish positions.

One cycle (``do_work``): find partitions whose ``desc_head`` passed ``flushed_desc`` (one numpy
comparison over the active rows of the control table), copy their new batches from the rings into one 4 KiB-aligned
staging buffer (one memcpy per contiguous run, usually one per partition; a few one-record
batches are staged in plain Python, one memcpy each: ``_stage_small``), write it to the
journal in one aligned write, write the index entries (one pwrite per partition), publish
``flushed_*``. Then fsync if a worker asked for durability (group commit: one fsync covers every
partition's pending batches), or ``flush_interval_ms`` passed, or ``flush_bytes`` accumulated; and
publish ``durable_offset`` for all partitions at once and notify the workers.

Doorbells (shm/doorbell.py, Unix datagrams in the ipc directory): ``flusher.bell``, which workers
ring with ``KICK_DATA`` ("new data"), ``KICK_DURABLE`` ("a durable waiter") or ``KICK_ADOPTED``
("I adopted a new partition": its row is active now); and each worker's ``worker-<id>.bell``,
which the flusher rings with ``SYNCED`` after every sync and ``IO_ERROR`` once after a latched
I/O error.

The flusher is also the boot owner: it creates the control table, runs recovery and marks the
table READY; workers wait for that before they serve (persistence/boot.py).

It also cuts a partition's log back when its owner asks (a cluster follower's truncation):
``cutter.poll`` at each kick and every 20 ms, persistence/truncation.py.

Its pieces (boot, retention, the disk guard, the retirer) take narrow handles
(persistence/handles.py), never the Flusher; every store to a control-table row, here and in
them, goes through the flusher's typed view of the table (shm/rows.py ``FlusherColumns``): its
own line 2, and three named, documented exceptions to line 0.
"""

from __future__ import annotations

import logging
import mmap
import os
import select
import signal
import time

import numpy as np

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.broker.heap import HeapTrim
from tailrace.broker.stats import Histogram, StatsFile
from tailrace.client.records import align8, align8_array
from tailrace.shm import layout, region
from tailrace.shm.doorbell import IO_ERROR, KICK_ADOPTED, KICK_DURABLE, SYNCED, Doorbell, Ringer
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable, Ring
from tailrace.shm.rows import FlusherColumns, FlusherHeader

from . import boot as boot_mod
from .handles import IndexCache, JournalBounds, RingCache, RingGone, Storage
from .index import ENTRY, entries_for
from .journal import BLOCK, Journal, StorageError
from .recovery import write_checkpoint
from .retention import Retention
from .retire import Retirer
from .truncation import Cutter, Truncations

log = logging.getLogger("tailrace.flusher")

EXIT_OK = 0
EXIT_STORAGE = 3
# After a latched storage error the flusher keeps the error visible this long, then exits so
# supervisord starts a fresh one: recovery then re-reads the journal's truth and the rings
# (which still hold every unflushed batch) are drained again once the disk takes writes.
STORAGE_RETRY_S = 2.0
# Between kicks for durable acks, stage only once this many bytes wait in the rings (or every
# idle tick): at a trickle of single records, staging on every worker kick rewrote the same
# 4 KiB tail block thousands of times a second and kept a core a third busy for 0.5 MB/s.
STAGE_MIN_BYTES = 64 << 10
RESCAN_NS = 1_000_000_000  # full control-table scan for active rows at least this often (KICK_ADOPTED sooner)


# A partition's new batches are staged in plain Python (``Flusher._stage_small``) when there are at
# most this many and each holds one record: for a few items a struct step beats numpy's ~5 us
# per call.
SMALL_RUN = 16


def _align_up(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


class Flusher:
    def __init__(self, settings: settings_mod.Settings):
        self.s = settings
        self.catalog = Catalog(settings.data_dir)
        self.journal = Journal(settings.data_dir, settings.segment_bytes, direct_io=settings.direct_io != "off")
        self.journal.defer_prewrite = True  # byte limits go first (_half_full)
        self.buf = mmap.mmap(-1, settings.write_buffer_bytes)  # page aligned: O_DIRECT-safe
        self.buf_base = 0  # journal position of buf[0]; always 4 KiB aligned
        self.buf_len = 0  # bytes staged in buf, counting the carried head block
        self.staged: list[tuple[int, int, np.ndarray | bytes, int, int, int]] = []  # (slot, first_offset, entries, flushed_desc, flushed_position, flushed_offset)
        self.rings = RingCache(settings.instance)  # slot -> attached ring
        self.indexes = IndexCache(settings.data_dir)  # slot -> writable index
        self.bounds = JournalBounds(self.journal)  # checkpointed_at, segment_start: retention keeps from there
        self.table: ControlTable | None = None
        self.cols: FlusherColumns | None = None  # the table's rows: reads, and every store (bound at boot)
        self.durable_wanted = False
        self.unsynced_bytes = 0
        self.last_sync_ns = time.monotonic_ns()
        self.last_look_ns = 0  # when a cycle last found nothing to stage and nothing to sync (run's idle pace)
        self.last_checkpoint_ns = time.monotonic_ns()
        self.failed = False
        # Slots whose rows are active, as of the last full scan: the per-cycle work looks at
        # these rows only, not all max_slots (4096 strided rows: ~40 us a scan, several scans a
        # cycle). A row becomes active at boot or when a worker adopts a new partition, and the
        # worker then kicks KICK_ADOPTED (rescan); a scan every RESCAN_NS besides, in case a kick is lost.
        self.slots = np.zeros(0, dtype=np.int64)
        self.rescanned_ns = 0
        self.ringer: Ringer | None = None  # rings the workers' bells (None in-process: tests)
        self.worker_bells: list[str] = []
        # for the metrics exporter (broker/stats.py); written by run(), never in-process
        self.stats = StatsFile(settings.ipc_path(), datadir.FLUSHER_ROLE)
        self.cycles = self.bytes_written = self.syncs = 0
        self.write_hist, self.fsync_hist = Histogram(), Histogram()
        self.rolled = False  # this cycle moved to a new segment (it then stops: see do_work)
        self.next_first_slot = 0  # where the next cycle starts staging (round robin over the dirty slots)
        self.retention: Retention | None = None  # log starts, segment deletion, disk guard (built at boot)
        self.retirer: Retirer | None = None  # deleted topics' slots (built at boot)
        self.cutter: Cutter | None = None  # partitions' logs cut back on their owners' request (built at boot)
        self.gone: set[int] = set()  # active slots whose ring region is gone, until a rescan (ring_gone)
        self.gone_logged: set[int] = set()

    def rescan(self) -> None:
        """Find the active rows again (a full scan of the control table), and the workers' bells."""
        self.slots = np.flatnonzero(self.cols.rows[:, COL["active"]] == 1)
        self.rescanned_ns = time.monotonic_ns()
        self.gone.clear()  # a ring made again since is staged again (ring_gone)
        if self.ringer is not None:  # worker-<i>.bell for i = 0, 1, ... (a stat each: the folder also
            # holds a lock file per slot, 10,000 names to list at 10,000 partitions)
            bells, i = [], 0
            while True:
                path = os.path.join(self.s.ipc_path(), datadir.worker_file(i, datadir.WORKER_BELL))
                if os.path.exists(path):
                    bells.append(path)
                elif i >= self.s.workers:
                    break
                i += 1
            self.worker_bells = bells

    def notify(self, message: bytes) -> None:
        """Ring every worker's bell (a worker that adopts a partition kicks KICK_ADOPTED first, and the
        rescan that follows finds its bell; gone ones drop out until a rescan finds them again)."""
        if self.ringer is not None:
            self.worker_bells = [p for p in self.worker_bells if self.ringer.ring(p, message)]

    def _active_slots(self) -> np.ndarray:
        if time.monotonic_ns() - self.rescanned_ns >= RESCAN_NS:
            self.rescan()
        return self.slots

    # --- boot (persistence/boot.py) ----------------------------------------------------
    def boot(self) -> None:
        """Attach or create the control table, recover the journal, build the pieces over their
        handles, publish the stored log starts, then READY."""
        self.table, fresh = boot_mod.open_table(self.s)
        self.cols = FlusherColumns(self.table.rows)
        booted = boot_mod.recover_into(self.s, self.catalog, self.journal, self.rings, self.table, self.cols, fresh)
        self.buf_base = booted.end_position - booted.end_position % BLOCK
        self.buf_len = len(booted.head)
        self.buf[: self.buf_len] = booted.head  # the unaligned head block, carried
        self.bounds.checkpointed_at = booted.end_position  # recovery checkpointed its end
        for slot in booted.gone:
            self.ring_gone(slot)
        store = Storage(self.s, self.catalog, self.cols, self.indexes, self.bounds)
        truncations = Truncations(self.s.data_dir)  # read after recovery, which may have moved a marker
        self.retention = Retention(store, FlusherHeader(self.table.header_words), truncations)
        self.retirer = Retirer(store, self.rings, self.retention, rescan=self.rescan, checkpoint=self.checkpoint)
        self.cutter = Cutter(store, truncations, self.retention, sync=self._sync_written, checkpoint=self.checkpoint,
                             journal_end=lambda: self.buf_base + self.buf_len)
        self.retention.publish()  # the stored log starts into the rows
        self.rescan()
        boot_mod.ready(booted)

    # --- the cycle -----------------------------------------------------------------------
    def _ring(self, slot: int) -> Ring:
        return self.rings.get(slot, int(self.cols.rows[slot, COL["ring_bytes"]]))

    def ring_gone(self, slot: int) -> None:
        """An active row whose ring region is gone: nothing of it can be staged. The slot is
        passed over (and said once in the log) until the next rescan, instead of the flusher
        exiting here at every restart with every other partition's flushing stopped with it.
        Nothing is acknowledged for it that was not: its durable waiters never see it synced."""
        self.gone.add(slot)
        if slot not in self.gone_logged:
            self.gone_logged.add(slot)
            log.error("slot %d: an active row with batches to stage, and its ring region is gone; passed over; row %s",
                      slot, self.cols.rows[slot].tolist())

    def unflushed_bytes(self) -> int:
        """Bytes appended to the rings and not yet staged for the journal, over all partitions."""
        rows, slots = self.cols.rows, self._active_slots()
        return int((rows[slots, COL["write_position"]] - rows[slots, COL["flushed_position"]]).sum())

    def do_work(self) -> int:
        """One cycle; returns the number of journal bytes staged (0 = idle)."""
        if self.failed:
            return 0
        rows, slots = self.cols.rows, self._active_slots()
        heads = rows[slots, COL["desc_head"]]
        dirty = np.flatnonzero(heads > rows[slots, COL["flushed_desc"]])
        staged = 0
        self.rolled = False
        order = slots[dirty].tolist()
        if len(order) > 1:  # round robin: a cycle that stops at a new segment starts the next one after it
            k = int(np.searchsorted(order, self.next_first_slot))
            order = order[k:] + order[:k]
        try:
            for slot in order:
                if slot in self.gone:
                    continue
                try:
                    staged += self._stage_slot(slot, int(rows[slot, COL["desc_head"]]))
                except RingGone:
                    self.ring_gone(slot)
                    continue
                if self.rolled:  # one new segment per cycle: the retention pass runs between them
                    self.next_first_slot = slot + 1
                    break
            self._write_out()
            now = time.monotonic_ns()
            if self.journal.dirty and (
                self.durable_wanted
                or now - self.last_sync_ns >= self.s.flush_interval_ms * 1_000_000
                or self.unsynced_bytes >= self.s.flush_bytes
            ):
                self.sync()
            if now - self.last_checkpoint_ns >= self.s.checkpoint_interval_ms * 1_000_000:
                self.checkpoint()
        except (StorageError, OSError) as exc:
            self._fail(exc)
        return staged

    def _stage_slot(self, slot: int, head: int) -> int:
        ring = self._ring(slot)
        row = self.cols.rows[slot]
        first = int(row[COL["flushed_desc"]])
        staged = 0
        if first < head:
            d0 = ring.desc[first % ring.desc_capacity].item()[1]
            if d0 != int(row[COL["flushed_offset"]]):
                log.error("slot %d: first unflushed batch starts at %d, flushed_offset is %d; row %s",
                          slot, d0, int(row[COL["flushed_offset"]]), row.tolist())
            if head - first <= SMALL_RUN:
                small = self._stage_small(slot, ring, first, head)
                if small is not None:
                    return small
        while first < head:
            descs = ring.descriptors(first, head)
            sizes = align8_array(descs["length"])
            cum = np.cumsum(sizes)
            seg_room = self.journal.segment_start + self.s.segment_bytes - (self.buf_base + self.buf_len)
            room = min(len(self.buf) - self.buf_len, seg_room)
            k = int(np.searchsorted(cum, room, side="right"))
            if k == 0:
                self._write_out()
                if seg_room < int(sizes[0]):
                    self._roll()
                    return staged  # the rest waits in the ring for the next cycle, after a retention pass
                continue
            take = descs[:k]
            if k > 1:
                b_, c_ = take["base_offset"], take["count"]
                bad = np.flatnonzero(b_[1:] != b_[:-1] + c_[:-1])
                if bad.size:
                    i = int(bad[0])
                    log.error("slot %d: descriptors not contiguous at seq %d: %s then %s; row %s", slot, first + i,
                              take[i], take[i + 1], row.tolist())
            jpos = self.buf_base + self.buf_len + (cum[:k] - sizes[:k])
            for view in ring.copy_batches(take):
                n = view.nbytes
                self.buf[self.buf_len : self.buf_len + n] = view
                self.buf_len += n
            entries = entries_for(jpos, take["length"], take["count"])
            last_pos, last_size = int(take[k - 1]["position"]), int(sizes[k - 1])
            last_end_offset = int(take[k - 1]["base_offset"]) + int(take[k - 1]["count"])
            self.staged.append((slot, int(take[0]["base_offset"]), entries, first + k, last_pos + last_size, last_end_offset))
            staged += int(cum[k - 1])
            first += k
        return staged

    def _stage_small(self, slot: int, ring: Ring, first: int, head: int) -> int | None:
        """``_stage_slot`` for a few one-record batches, in plain Python, one step per batch:
        under single-message load a cycle finds one or two per partition, and the numpy path's
        ~40 calls cost ~85 us a partition for them (~10 us this way). Stages all of them or,
        when one holds several records or they would not fit the buffer, nothing (returns
        None: the numpy path then runs, with no Python step per record)."""
        cap, desc = ring.desc_capacity, ring.desc
        descs = [desc[seq % cap].item() for seq in range(first, head)]  # (position, base, length, count)
        if any(d[3] != 1 for d in descs):
            return None
        total = sum(align8(d[2]) for d in descs)
        seg_room = self.journal.segment_start + self.s.segment_bytes - (self.buf_base + self.buf_len)
        if total > min(len(self.buf) - self.buf_len, seg_room):
            return None
        buf, mv, ring_bytes = self.buf, ring.mv, ring.ring_bytes
        entries, expect = [], descs[0][1]
        for pos, base, length, _count in descs:
            if base != expect:
                log.error("slot %d: descriptors not contiguous: offset %d where %d was due; row %s", slot, base,
                          expect, self.cols.rows[slot].tolist())
            size, at, jpos = align8(length), pos % ring_bytes, self.buf_base + self.buf_len
            buf[self.buf_len : self.buf_len + size] = mv[at : at + size]
            self.buf_len += size
            entries.append(ENTRY.pack(jpos, length, 0))
            expect = base + 1
        pos, base, length, _count = descs[-1]
        self.staged.append((slot, descs[0][1], b"".join(entries), head, pos + align8(length), base + 1))
        return total

    def stats_parts(self) -> tuple[dict, dict, dict]:
        r, g = self.retention, self.retention.guard
        return ({"flusher_cycles": {"": self.cycles}, "flusher_bytes_written": {"": self.bytes_written},
                 "flusher_syncs": {"": self.syncs}, "journal_segments_deleted": {"": r.segments_deleted},
                 "journal_bytes_deleted": {"": r.bytes_deleted}, "journal_segments_forced": {"": g.segments_forced},
                 "journal_records_forced": {"": g.records_forced}, "slots_retired": {"": self.retirer.slots_retired}},
                {"flusher_unsynced_bytes": {"": self.unsynced_bytes}, "journal_pinned_by": {str(r.pinned_by): 1} if r.pinned_by >= 0 else {},
                 "storage_full": {"": int(g.full)}, "journal_disk_used_ratio": {"": round(g.used, 4)}},
                {"flusher_write_duration_seconds": {"": self.write_hist.snapshot()},
                 "flusher_fsync_duration_seconds": {"": self.fsync_hist.snapshot()}})

    def _write_out(self) -> None:
        if not self.staged:
            return
        end = self.buf_base + self.buf_len
        aligned = _align_up(self.buf_len)
        self.buf[self.buf_len : aligned] = bytes(aligned - self.buf_len)
        t0 = time.perf_counter_ns()
        self.journal.write_aligned(self.buf, aligned, self.buf_base)
        self.write_hist.observe_ns(time.perf_counter_ns() - t0)
        self.bytes_written += aligned
        self.cycles += 1
        indexes, cols = self.indexes, self.cols
        for slot, first_offset, entries, fdesc, fpos, foff in self.staged:  # one index pwrite per partition anyway
            indexes.get(slot).write(first_offset, entries)
            cols.publish_flushed(slot, fpos, fdesc, foff)
        self.unsynced_bytes += end - self.buf_base
        self.staged.clear()
        head = end - end % BLOCK
        carry = end - head
        if carry and head != self.buf_base:
            self.buf.move(0, head - self.buf_base, carry)
        self.buf_base, self.buf_len = head, carry
        if self.journal.prewrite_wanted:
            self._half_full()

    def _half_full(self) -> None:
        """The segment being written is half full: apply byte limits (to what is durable), then
        pre-write the next segment. Deleting before pre-writing keeps the journal within the
        limits plus 2 segments when partitions are written in step (docs/DESIGN.md, "How big the
        journal gets")."""
        self.journal.prewrite_wanted = False
        try:
            self.retention.run(time.monotonic_ns(), bytes_only=True)
        except Exception:  # noqa: BLE001 - retention waits for its next pass; the data path goes on
            log.exception("retention pass failed")
        self.journal.prewrite_next_async()

    def _roll(self) -> None:
        """Leave the rest of this segment zero and go on at the next one (byte limits applied
        first, so the journal never holds their excess and a new segment at once)."""
        self.sync()
        try:
            self.retention.run(time.monotonic_ns(), bytes_only=True)
        except Exception:  # noqa: BLE001 - retention waits for its next pass; the data path goes on
            log.exception("retention pass failed")
        nxt = self.journal.segment_start + self.s.segment_bytes
        self.journal.open_segment(nxt)
        self.buf_base, self.buf_len = nxt, 0
        self.checkpoint()
        self.rolled = True

    def sync(self) -> None:
        t0 = time.perf_counter_ns()
        self.journal.sync()
        self.fsync_hist.observe_ns(time.perf_counter_ns() - t0)
        self.syncs += 1
        slots = self.slots  # only rows staged since the last scan moved
        self.cols.set(slots, "durable_offset", self.cols.rows[slots, COL["flushed_offset"]])
        self.durable_wanted = False
        self.unsynced_bytes = 0
        self.last_sync_ns = time.monotonic_ns()
        self.table.wake_readers(layout.WAKE_FLUSHER)  # durable_offset moved: isolation "durable" readers
        self.notify(SYNCED)

    def _sync_written(self) -> None:
        """fsync what was written, if anything was (the cutter's first step)."""
        if self.journal.dirty:
            self.sync()

    def checkpoint(self) -> None:
        """Sync indexes and journal, then name the journal end as the recovery start."""
        for idx in self.indexes.values():
            idx.sync()
        if self.journal.dirty:
            self.sync()
        rows = self.cols.rows
        active = np.flatnonzero(rows[:, COL["active"]] == 1)
        next_offsets = dict(zip(active.tolist(), rows[active, COL["flushed_offset"]].tolist()))
        write_checkpoint(self.s.data_dir, self.buf_base + self.buf_len, next_offsets)
        self.bounds.checkpointed_at = self.buf_base + self.buf_len
        self.last_checkpoint_ns = time.monotonic_ns()

    def _fail(self, exc: BaseException) -> None:
        log.error("storage unavailable: %s", exc)
        self.failed = True
        self.cols.set(self.cols.rows[:, COL["active"]] == 1, "io_error", 1)
        self.notify(IO_ERROR)

    # --- shutdown ------------------------------------------------------------------------
    def drain_and_close(self) -> None:
        if not self.failed:
            self.rescan()
            try:
                for _ in range(1000):
                    if not self.do_work():
                        break
                self.checkpoint()
            except (StorageError, OSError) as exc:
                self._fail(exc)
        self.journal.close()
        self.retention.close()
        for idx in self.indexes.values():
            idx.close()
        if not self.failed and not _workers_alive(self.s) and self._all_flushed():
            self.table.header["state"] = layout.STATE_STOPPING
            for ring in self.rings.values():
                ring.close()
            self.rings.clear()
            for name in region.list_instance_regions(self.s.instance):
                region.unlink(name)
            log.info("all data flushed; shared memory unlinked")
        else:
            log.warning("shared memory kept: workers alive or data not flushed (next boot reuses it)")

    def _all_flushed(self) -> bool:
        """Every active row staged to its head, a row whose ring region is gone apart (nothing
        of it is in shared memory to keep for the next boot: ``ring_gone``)."""
        rows = self.cols.rows
        active = np.flatnonzero(rows[:, COL["active"]] == 1)
        behind = active[rows[active, COL["desc_head"]] != rows[active, COL["flushed_desc"]]]
        return all(not region.exists(region.ring_name(self.s.instance, int(slot))) for slot in behind)


def _workers_alive(s: settings_mod.Settings) -> bool:
    d = s.ipc_path()
    try:
        names = [n for n in os.listdir(d) if datadir.worker_id_of(n, datadir.WORKER_PID) is not None]
    except FileNotFoundError:
        return False
    for n in names:
        try:
            pid = int(open(os.path.join(d, n)).read().strip())
            os.kill(pid, 0)
            return True
        except (ValueError, OSError):
            continue
    return False


def run(flusher: Flusher, bell: Doorbell, stop: list) -> None:
    """The loop: wait for a kick or a tick, stage when it pays, heartbeat; until ``stop`` or a
    latched storage error has been visible for STORAGE_RETRY_S."""
    s = flusher.s
    kicks = select.poll()
    kicks.register(bell.fileno(), select.POLLIN)
    idle_ms = max(1, min(10, s.flush_interval_ms))
    interval_ns = s.flush_interval_ms * 1_000_000
    failed_at = None
    busy = False
    last_work = 0.0
    heap, worked = HeapTrim(), False  # freed heap given back once the flusher goes quiet (broker/heap.py)
    while not stop:
        if flusher.failed:
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > STORAGE_RETRY_S:
                log.error("exiting after a storage error; supervisord restarts the flusher")
                break
        kicked = bool(kicks.poll(0 if busy else idle_ms))
        if kicked:
            rung = bell.drain()
            if KICK_DURABLE in rung:
                flusher.durable_wanted = True
            if KICK_ADOPTED in rung:  # a worker adopted a new partition: its row is active now
                flusher.rescan()
        now = time.monotonic()
        # A trickle (under STAGE_MIN_BYTES, nobody waiting to be durable) is staged once per
        # flush interval, when the sync is due, not every tick: each cycle rewrites the
        # journal's partial tail block. Idle, a cycle (a look at every active row, and the
        # checkpoint when due) runs once per flush interval too, not every tick: at 10,000
        # partitions a look is two gathers over scattered rows. More than STAGE_MIN_BYTES
        # waiting is always kicked (a worker kicks at KICK_MIN_BYTES, the same figure).
        now_ns = time.monotonic_ns()
        look_due = now_ns - max(flusher.last_sync_ns, flusher.last_look_ns) >= interval_ns
        if busy or flusher.durable_wanted or (look_due and now - last_work >= idle_ms / 1000) \
                or (kicked and flusher.unflushed_bytes() >= STAGE_MIN_BYTES):
            staged = flusher.do_work()
            worked = worked or staged > 0
            busy = staged >= STAGE_MIN_BYTES
            if not staged and not flusher.journal.dirty:
                flusher.last_look_ns = now_ns
            last_work = now
        flusher.table.header["flusher_heartbeat_ns"] = time.monotonic_ns()
        now_ns = time.monotonic_ns()
        if not flusher.failed and (kicked or flusher.cutter.due(now_ns)):
            try:
                flusher.cutter.poll(flusher._active_slots(), now_ns)  # cuts asked by partition owners
            except (StorageError, OSError) as exc:
                flusher._fail(exc)
        if not flusher.failed and flusher.retention.due(now_ns):
            try:
                flusher.retention.run(now_ns)
            except Exception:  # noqa: BLE001 - retention waits for the next pass; the data path goes on
                log.exception("retention pass failed")
        if not flusher.failed and flusher.retention.guard.due(now_ns):
            try:
                flusher.retention.guard.check(now_ns)
            except Exception:  # noqa: BLE001 - the next check is DISK_CHECK_NS away; the data path goes on
                log.exception("disk check failed")
        if not flusher.failed and flusher.retirer.due(now_ns):
            try:
                flusher.retirer.run(now_ns)
            except Exception:  # noqa: BLE001 - clearing waits for the next pass; the data path goes on
                log.exception("clearing deleted topics' slots failed")
        flusher.stats.maybe_write(flusher.stats_parts)
        heap.maybe(now, worked)
        worked = False


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flusher %(levelname)s %(message)s")
    s = settings_mod.from_env()
    claim = datadir.enter_program(s, datadir.FLUSHER_ROLE, log)
    if claim is None:
        return datadir.EXIT_REFUSED
    datadir.make_data_dir(s.data_dir, s.data_mode_bits)
    stop = []
    datadir.stop_on_signals(stop)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit must be an EFBIG, not a kill
    flusher = Flusher(s)
    bell = Doorbell(s.flusher_bell_path())
    flusher.ringer = Ringer()
    try:
        flusher.boot()
    except (OSError, StorageError) as exc:
        log.error("boot failed, storage unavailable: %s", exc)
        if flusher.table is not None:
            flusher._fail(exc)
        time.sleep(STORAGE_RETRY_S)
        bell.close()
        flusher.ringer.close()
        datadir.leave_program(claim)
        return EXIT_STORAGE
    run(flusher, bell, stop)
    flusher.drain_and_close()
    bell.close()
    flusher.ringer.close()
    datadir.leave_program(claim)
    return EXIT_STORAGE if flusher.failed else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
