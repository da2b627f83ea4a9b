"""One partition's actor: the single writer of its ring, and its fetch path.

Concurrency contract: an actor lives in exactly one worker process and is driven by that
worker's one thread. It writes line 1 of its control-table row (through its ``OwnerRow``, which
cannot store anything else) and its ring; it only reads line 2 (the flusher's). Its
``RingWriter`` holds the owner epoch it was given: once another actor writes a higher epoch into
the row, this one is fenced and refuses to append.

Reads: an offset at or above ``ring_start_offset`` is served from the ring (the ring is the read
cache; data is readable there before it reaches disk); below it, from the journal through the
dense index, which holds every offset below ``flushed_offset``. The ring only drops batches the
flusher already copied out, so every offset is always in one of the two.
"""

from __future__ import annotations

import logging
import os
from collections import deque

import numpy as np

from tailrace.broker import record_policy
from tailrace.broker.datadir import slot_lock_name
from tailrace.client.protocol import ErrorCode
from tailrace.client.records import (
    BASE_OFFSET, COUNT, COUNT_AT, F_LOG_APPEND_TIME, FLAGS_AT, IDEMPOTENCE, IDEMPOTENCE_AT, LENGTH, PREFIX_BYTES,
    STAMP, STAMP_AT, STAMP_V2, STAMP_V2_AT, VERSION_2, VERSION_AT, BatchError, check_batch, now_us, rewrite_batch,
    time_key,
)
from tailrace.persistence.timesearch import batch_stamp
from tailrace.shm import layout
from tailrace.shm.ring import READ_WINDOW, ControlTable, Ring, RingFull, RingWriter, cut_batches, near_head
from tailrace.shm.rows import OwnerRow
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.log import DiskRead, FetchResult, PartitionLog

from .dedup import KEEP, ProducerState
from .truncate import resume as resume_cut
from tailrace.shm.fence import OwnerLock

DEDUP_LOAD_BATCHES = 4096  # batch headers read from the ring at takeover
DEDUP_DISK_BATCHES = 64  # ... and from disk when the ring holds fewer
CUTTING = "the partition's log is being cut back (actors/truncate.py): retriable"
log = logging.getLogger("tailrace.partition")


class Fenced(Exception):
    """Raised when a partition is adopted with an epoch lower than the one in its row."""


class PartitionActor:
    def __init__(self, table: ControlTable, instance: str, slot: int, topic_id: int, partition: int,
                 ring_bytes: int, epoch: int, data_dir: str, journal: JournalReader, lock_dir: str):
        self.slot, self.topic_id, self.partition = slot, topic_id, partition
        self.data_dir = data_dir
        self.journal = journal
        row = table.row(slot)
        own = OwnerRow(row)
        if own.owner_epoch > epoch:
            raise Fenced(f"slot={slot} owner_epoch={own.owner_epoch} > epoch={epoch}")
        if not own.active:
            # A partition created after boot: nothing on disk, nothing in any ring yet.
            own.init_identity(slot, topic_id, partition, ring_bytes, layout.desc_capacity_for(ring_bytes))
        elif own.topic_id != topic_id:  # a deleted topic's row, not cleared yet (persistence/retire.py)
            raise Fenced(f"slot={slot} still holds topic id {own.topic_id}, not {topic_id}")
        self.row = row  # the raw int64 words (the worker reads them); stores go through owner_row
        self.owner_row = own  # line 1 is ours to write; lines 0 and 2 are read only
        self.ring = Ring.create_or_attach(instance, slot, own.ring_bytes)
        own.owner_epoch = epoch  # the fence: a previous owner stops at its next check
        self.writer = RingWriter(self.ring, own, epoch)
        self.epoch = epoch
        self.lock = OwnerLock(os.path.join(lock_dir, slot_lock_name(slot)))
        self.producers = ProducerState()
        self.log = PartitionLog(row, data_dir, slot, journal)  # offsets, index, journal reads (persistence/log.py)
        self.policy = record_policy.DEFAULT_POLICY  # the topic's record settings (Owned keeps it current)
        self.leader_epoch = 0  # stamped into every v2 batch; 0 until replication
        self.max_time_us = 0  # the largest record time appended so far: v2's max_time_us (FORMAT.md 1.6)
        self.durable_waiters: deque = deque()  # of (end_offset, reply frames)
        self.hw_waiters: deque = deque()  # acks=all: of (end_offset, reply frames), answered as the high watermark covers them
        self.repl = None  # a replicated partition led here: its followers and watermarks (actors/replication.py)
        # a cluster: the router said another broker leads it (a REPLICA_APPEND: this copy follows, or holds no
        # replica any more) and has not forwarded a request of a leader's since: direct clients are refused (adopt.py)
        self.led_elsewhere = False
        self.parked: list = []  # of (deadline_ns, ident frames, routing, FetchRequest)
        self.check_ownership()

    # --- ownership -----------------------------------------------------------------------
    def reassign(self, epoch: int) -> None:
        """The router re-confirmed this worker as owner under a newer epoch (e.g. it restarted)."""
        own = self.owner_row
        if own.owner_epoch > epoch:
            raise Fenced(f"slot={self.slot} owner_epoch={own.owner_epoch} > epoch={epoch}")
        own.owner_epoch = epoch
        self.epoch = self.writer.epoch = epoch

    def check_ownership(self) -> bool:
        """True if this actor may append now. Lets the lock go once fenced; takes it when free."""
        if self.writer.fenced:
            self.lock.release()
            return False
        if self.lock.held:
            return True
        if not self.lock.try_acquire():
            return False
        if self.writer.fenced:  # a newer owner wrote its epoch while we waited
            self.lock.release()
            return False
        self._take_over()
        return True

    def _take_over(self) -> None:
        """First moment with the lock: state the previous owner left is final now."""
        self.writer.repair()
        resume_cut(self)  # a cut the previous owner asked for and the flusher made: its ring reset (actors/truncate.py)
        self._load_producer_state()
        self._load_max_time()
        if self.owner_row.next_offset:  # a partition with records changed hands (a fresh one is not news)
            log.info("slot %d taken over at epoch %d at offset %d", self.slot, self.epoch, self.owner_row.next_offset)

    def _load_producer_state(self) -> None:
        row, ring = self.owner_row, self.ring
        tail, head = row.desc_tail, row.desc_head
        first = max(tail, head - DEDUP_LOAD_BATCHES)
        self.producers = ProducerState()
        if first >= head and row.flushed_offset > 0:
            self._load_producer_state_from_disk(row.ring_start_offset)
        if first >= head:
            return
        descs = ring.descriptors(first, head)
        at = (descs["position"] % ring.ring_bytes)[:, None] + np.arange(IDEMPOTENCE_AT, IDEMPOTENCE_AT + IDEMPOTENCE.size)
        raw = np.ascontiguousarray(ring.data[at])
        pids = raw[:, :8].copy().view("<i8")[:, 0]  # IDEMPOTENCE: producer_id (int64), base_sequence (int32)
        seqs = raw[:, 8:12].copy().view("<i4")[:, 0]
        times = np.zeros(len(descs), dtype=np.int64)
        self.producers.load(pids, seqs, descs["count"], descs["base_offset"], times)

    def _load_max_time(self) -> None:
        """The running largest record time from the last batch (the ring's, else the journal's)."""
        row, ring = self.owner_row, self.ring
        try:
            if row.desc_head > row.desc_tail:
                d = ring.descriptors(row.desc_head - 1, row.desc_head)
                self.max_time_us = time_key(ring.mv, int(d["position"][0]) % ring.ring_bytes)
            elif row.flushed_offset > row.log_start_offset:
                self.max_time_us = batch_stamp(self.log.index(), self.journal, row.flushed_offset - 1)[1]
        except (OSError, ValueError) as exc:  # expired meanwhile: times start from the next batch's
            log.warning("slot %d: no last batch time (%s)", self.slot, exc)

    def _load_producer_state_from_disk(self, end_offset: int) -> None:
        lo = max(self.owner_row.log_start_offset, end_offset - (1 << 16))  # below the log start: gone (retention)
        if lo >= end_offset:
            return
        entries = self.log.index().read(lo, end_offset - lo)
        starts = np.flatnonzero(entries["rel"] == 0)[-DEDUP_DISK_BATCHES:]
        for i in starts.tolist():
            try:
                head = self.journal.read(int(entries[i]["position"]), PREFIX_BYTES)
            except FileNotFoundError:  # expired meanwhile: retention deleted its segment
                continue
            pid, seq = IDEMPOTENCE.unpack_from(head, IDEMPOTENCE_AT)
            count = COUNT.unpack_from(head, COUNT_AT)[0]
            self.producers.record(pid, seq, count, lo + i, 0)

    # --- produce -------------------------------------------------------------------------
    def append(self, body: bytes, max_batch_bytes: int, in_order: bool = True) -> tuple[int, str, int, int, int]:
        """Validate and append one batch frame. Returns (code, message, base_offset, count, time).

        A retried batch (same producer id, base sequence and count as a recent one) is not
        appended again: the original base offset comes back with code OK. A batch of a known
        producer that is neither that nor the next in sequence is OUT_OF_ORDER_SEQUENCE
        (actors/dedup.py), unless ``in_order`` is False: a one-way (acks=none) batch, whose
        producer never reads a refusal, so a gap left by an earlier refused one-way batch
        (BACKPRESSURE, STORAGE_FULL) must not make every later one refused too."""
        row = self.owner_row
        if not self.check_ownership():
            if self.writer.fenced:
                return ErrorCode.NOT_OWNER, "partition moved to another owner", -1, 0, 0
            return ErrorCode.NOT_READY, "previous owner still holds the partition", -1, 0, 0
        if row.io_error:
            return ErrorCode.STORAGE_UNAVAILABLE, "journal cannot be written", -1, 0, 0
        if row.truncate_request and not resume_cut(self):
            return ErrorCode.NOT_READY, CUTTING, -1, 0, 0
        try:
            chk = check_batch(body, 0, len(body), max_batch_bytes)
        except BatchError as exc:
            code = {"crc": ErrorCode.CORRUPT_BATCH, "too_large": ErrorCode.BATCH_TOO_LARGE}.get(exc.reason, ErrorCode.MALFORMED)
            return code, str(exc), -1, 0, 0
        size, count = chk.size, chk.count
        if size != len(body):
            return ErrorCode.MALFORMED, f"frame holds {len(body)} bytes, batch frame is {size}", -1, 0, 0
        policy = self.policy
        t = now_us()
        why = record_policy.timestamp_refusal(policy, chk.min_time_us, chk.max_time_us, t)
        if why is not None:
            return ErrorCode.INVALID_TIMESTAMP, why, -1, 0, 0
        if size > self.ring.ring_bytes // 2:
            return ErrorCode.BATCH_TOO_LARGE, f"batch of {size} bytes over half the ring ({self.ring.ring_bytes})", -1, 0, 0
        pid, seq = IDEMPOTENCE.unpack_from(body, IDEMPOTENCE_AT)
        if pid >= 0:
            dup = self.producers.find(pid, seq, count)
            if dup is not None:
                return ErrorCode.OK, "duplicate", dup[2], count, dup[3]
            expected = self.producers.expected(pid)
            if in_order and expected is not None and seq != expected:
                return (ErrorCode.OUT_OF_ORDER_SEQUENCE, f"producer_id={pid} base_sequence={seq}: this partition "
                        f"expects {expected} (the last batch's base sequence + its count) or a retry of one of "
                        f"its last {KEEP} batches; nothing stored", -1, 0, 0)
        if policy.codec is not None and (chk.codec != policy.codec or chk.version != VERSION_2):
            body = rewrite_batch(body, chk, policy.codec)  # the topic's compression.type (Kafka's), not for a retry
            size = len(body)
            if size > self.ring.ring_bytes // 2:
                return ErrorCode.BATCH_TOO_LARGE, f"batch of {size} bytes (recompressed) over half the ring", -1, 0, 0
        base = row.next_offset
        w = self.writer
        try:
            pos = w.claim(size)
        except RingFull:
            return ErrorCode.BACKPRESSURE, "partition ring full; flusher behind", -1, 0, 0
        # Claim, copy, stamp, publish: the stamp lands between copy and publish, so no reader
        # ever sees the frame unstamped, and the ring stays free of record fields.
        frame = w.copy(pos, memoryview(body), base)
        STAMP.pack_into(frame, STAMP_AT, base, t, self.partition, self.topic_id)
        if frame[VERSION_AT] == VERSION_2:
            top = max(self.max_time_us, t if policy.log_append_time else chk.max_time_us)
            frame[FLAGS_AT] = F_LOG_APPEND_TIME if policy.log_append_time else 0
            STAMP_V2.pack_into(frame, STAMP_V2_AT, self.leader_epoch, top)
            self.max_time_us = top
        else:
            self.max_time_us = max(self.max_time_us, t)  # a v1 batch's lookup time is its append time
        w.publish(pos, size, LENGTH.unpack_from(body)[0], base, count)
        self.producers.record(pid, seq, count, base, t)
        return ErrorCode.OK, "", base, count, t

    def append_replica(self, body, max_batch_bytes: int) -> tuple[int, str]:
        """A follower's copy (issue 34): append the batches of ``body`` (back-to-back frames, as
        the leader's FETCH sent them) exactly as the leader stored them: its offsets, append
        times, leader epoch and max time are kept, only the topic id the stamp carries is this
        broker's own (catalog ids are per broker; recovery files batches by it). A batch this
        log already holds (its base below the log end) is skipped, so a fetch answered twice
        appends once; one that would leave a gap stops the append (OFFSET_OUT_OF_RANGE). Each
        batch is checked as a produce checks it (CRC, structure) but never recompressed, nor
        refused for its timestamps or sequence: the leader decided. Returns (code, message)."""
        row = self.owner_row
        if not self.check_ownership():
            if self.writer.fenced:
                return ErrorCode.NOT_OWNER, "partition moved to another owner"
            return ErrorCode.NOT_READY, "previous owner still holds the partition"
        if row.io_error:
            return ErrorCode.STORAGE_UNAVAILABLE, "journal cannot be written"
        if row.truncate_request and not resume_cut(self):
            return ErrorCode.NOT_READY, CUTTING
        mv, at, end, w = memoryview(body), 0, len(body), self.writer
        while at < end:  # one step per batch, never per record
            try:
                chk = check_batch(body, at, end, max_batch_bytes, deep=False)
            except BatchError as exc:
                code = {"crc": ErrorCode.CORRUPT_BATCH, "too_large": ErrorCode.BATCH_TOO_LARGE}.get(exc.reason, ErrorCode.MALFORMED)
                return code, f"replicated batch at byte {at}: {exc}"
            size, count = chk.size, chk.count
            base, t, _part, _tid = STAMP.unpack_from(body, at + STAMP_AT)
            nxt = row.next_offset
            if base + count <= nxt:  # held already
                at += size
                continue
            if base != nxt:
                return ErrorCode.OFFSET_OUT_OF_RANGE, (f"replicated batch at offset {base} does not start at this log's "
                                                       f"end {nxt}")
            if size > self.ring.ring_bytes // 2:
                return ErrorCode.BATCH_TOO_LARGE, f"replicated batch of {size} bytes over half the ring"
            try:
                pos = w.claim(size)
            except RingFull:
                return ErrorCode.BACKPRESSURE, "partition ring full; flusher behind"
            frame = w.copy(pos, mv[at:at + size], base)
            STAMP.pack_into(frame, STAMP_AT, base, t, self.partition, self.topic_id)
            if frame[VERSION_AT] == VERSION_2:
                self.leader_epoch, top = STAMP_V2.unpack_from(frame, STAMP_V2_AT)
                self.max_time_us = max(self.max_time_us, top)
            else:
                self.max_time_us = max(self.max_time_us, t)
            w.publish(pos, size, LENGTH.unpack_from(body, at)[0], base, count)
            pid, seq = IDEMPOTENCE.unpack_from(body, at + IDEMPOTENCE_AT)
            self.producers.record(pid, seq, count, base, t)  # the producer state moves with the log
            at += size
        return ErrorCode.OK, ""

    # --- fetch ---------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        return self.watermark("memory")

    def watermark(self, isolation: str) -> int:
        """How far a reader may read: ``memory`` (a replicated partition's high watermark, else the
        log end), ``durable`` (synced: on every in-sync replica when replicated), ``log`` (the log
        end whatever: a follower's fetch)."""
        row, repl = self.owner_row, self.repl
        if isolation == "durable":
            return row.durable_offset if repl is None else repl.durable_hw_at(row.durable_offset)
        if repl is None or isolation == "log":
            return row.next_offset
        return repl.hw_at(row.next_offset)

    def publish_hw(self) -> None:
        """Store a replicated partition's high watermark in its row (+1; 0: not replicated), where
        LIST_OFFSETS, served by any worker, reads it (actors/offsets.py)."""
        row = self.owner_row
        value = 0 if self.repl is None else self.repl.hw_at(row.next_offset) + 1
        if row.replicated_hw != value:
            row.replicated_hw = value

    def read(self, offset: int, max_bytes: int, max_records: int, isolation: str) -> FetchResult:
        """Serve a fetch here and now, from the ring or (below it) the journal."""
        res = self.read_cached(offset, max_bytes, max_records, isolation)
        if isinstance(res, DiskRead):
            return self._read_disk(res.offset, res.max_bytes, res.max_records, res.limit)
        return res

    def _read_disk(self, offset, max_bytes, max_records, hw) -> FetchResult:
        """The journal read on this thread (``read``; tests)."""
        limit = min(hw, self.owner_row.flushed_offset)
        if offset >= limit:
            return FetchResult(ErrorCode.OK, [], offset, "disk")
        return self.log.read(DiskRead(self.slot, offset, max_bytes, max_records, limit))

    def read_cached(self, offset: int, max_bytes: int, max_records: int, isolation: str) -> FetchResult | DiskRead:
        """A fetch's answer if it is in memory (the ring, or nothing to read), else the
        ``DiskRead`` to hand to a reader thread: the worker's loop never waits on a disk."""
        row = self.owner_row
        hw = self.watermark(isolation)
        log_start = row.log_start_offset
        # past the high watermark of a replicated partition but within its log: nothing yet (Kafka's)
        if offset < log_start or offset > (hw if self.repl is None else row.next_offset):
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, [], offset, "")
        if offset >= hw:
            return FetchResult(ErrorCode.OK, [], offset, "")
        max_records = max(1, min(max_records, hw - offset))
        if offset >= row.ring_start_offset:
            res = self._read_ring(offset, max_bytes, max_records, hw)
            if res is not None:
                return res
        limit = min(hw, row.flushed_offset)
        if offset >= limit:
            return FetchResult(ErrorCode.OK, [], offset, "disk")
        return DiskRead(self.slot, offset, max_bytes, max_records, limit)

    def _read_ring(self, offset, max_bytes, max_records, hw) -> FetchResult | None:
        row = self.owner_row
        tail, head = row.desc_tail, row.desc_head
        if tail >= head:
            return None
        # Copies are safe: only this process's writes reclaim ring bytes, and they cannot
        # interleave with this call (one thread per worker).
        near = near_head(self.ring, tail, head, offset, max_bytes, max_records, hw)
        if near is not None:  # a few batches in: plain Python (a tail, or many small partitions)
            seq, body, base, _count, nxt = near
            stamped = BASE_OFFSET.unpack_from(body, STAMP_AT)[0]
        else:
            seq = self.ring.find_seq(tail, head, offset)
            if seq < tail:
                return None
            descs = self.ring.descriptors(seq, min(head, seq + READ_WINDOW))
            take = descs[: cut_batches(descs, offset, max_bytes, max_records, hw)]
            base = int(take[0]["base_offset"])
            stamped = BASE_OFFSET.unpack_from(self.ring.mv, int(take[0]["position"]) % self.ring.ring_bytes + STAMP_AT)[0]
            body = None if stamped != base else b"".join(self.ring.copy_batches(take))
            nxt = int(take[-1]["base_offset"]) + int(take[-1]["count"])
        if stamped != base:
            # Never serve bytes a descriptor no longer describes; the journal has them.
            log.error("slot %d: ring descriptor seq %d says base %d, bytes say %d (row %s); reading disk",
                      self.slot, seq, base, stamped, self.row.tolist())
            return None
        return FetchResult(ErrorCode.OK, [body], nxt, "ring")

    def close(self) -> None:
        self.log.close()
        self.lock.close()
        self.ring.close()
