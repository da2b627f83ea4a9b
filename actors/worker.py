"""The worker process: hosts partition actors, serves produce, fetch and list-offsets.

Socket: a ROUTER bound at ``ipc://<ipc_dir>/worker-<id>.ipc``. Two kinds of peer send to it:

- the router, identity ``b"router"``: ``[b"router", client_id, assign, routing, header, body?]``
  where ``assign`` is 12 bytes (slot u32, owner epoch u64) telling which partition this worker
  owns for this request; the reply goes back as ``[b"router", client_id, routing, header, body?]``;
- a client addressing the worker directly: ``[client_id, routing, header, body?]``; served only
  for partitions this worker already owns, otherwise NOT_OWNER.

With ``--auth curve`` the router appends the principal it authenticated to ``assign`` (12 bytes,
then the name), so quotas (broker/quota.py) count a client's bytes here whichever way they came;
a reply over its principal's quota is held back (``held``) and says so in ``throttle_ms``.

Durable acks wait for the flusher: the worker kicks it (rings its doorbell with ``KICK_DURABLE``,
shm/doorbell.py) and releases the waiters when the flusher rings this worker's bell after a sync
and the row's ``durable_offset`` covers them.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import select
import signal
import struct
import threading
import time

import msgspec
import posix_ipc
import zmq

from tailrace.broker import acl, auth, datadir, quota
from tailrace.broker.envelope import Envelope, refusal
from tailrace.broker.reply_port import ReplyPort
from tailrace.broker.stats import Histogram, StatsFile, label_key
from tailrace.client import protocol as P
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import OFFSETS_TOPIC, Catalog
from tailrace.client import unixwire
from tailrace.shm import layout
from tailrace.persistence.flusher import STAGE_MIN_BYTES
from tailrace.shm.doorbell import KICK_ADOPTED, KICK_DATA, KICK_DURABLE, Doorbell, Ringer
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable, LayoutMismatch
from tailrace.shm.rows import HeaderView
from tailrace.persistence.index import IndexFile
from tailrace.persistence.timesearch import first_at_or_after
from tailrace.client.records import iter_batches
from tailrace.client.ring_reader import SharedRings, TailStatus
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.recovery import data_dir_id

from . import partition as partition_mod
from .partition import DiskRead, Fenced, FetchResult, PartitionActor, read_disk
from .unix_server import PortMux, UnixIdent, UnixServer

log = logging.getLogger("tailrace.worker")

EXIT_OK = 0
EXIT_NO_BROKER = 4
DRAIN_MAX = 512
KICK_INTERVAL_S = 0.002
KICK_MIN_BYTES = STAGE_MIN_BYTES  # plain data waiting before a worker kicks the flusher: what it stages at once
STORAGE_FULL_MESSAGE = ("the journal's filesystem is fuller than disk_max_used_ratio: produce is refused until there is room "
                        "(retriable; nothing was stored)")
OFFSETS_TOPIC_BYTES = OFFSETS_TOPIC.encode()  # group commits are still taken when storage is full: a few bytes each
READS_ENDPOINT = "inproc://tailrace-disk-reads"
UNLINKED_SWEEP_S = 1.0  # how often cached journal files are checked for deletion by retention
CATALOG_CHECK_S = 0.25  # how often the catalog is checked for deleted topics (one stat)


class DiskReader(threading.Thread):
    """The worker's reader thread: every fetch that must read the journal runs here, so a
    consumer far behind (cold reads, page-cache misses) never stalls produce or hot fetches on
    the worker's loop. The loop hands over a ``DiskRead`` and a callback; the thread does the
    index lookup and the preads (which release the GIL) with its own file handles, puts
    ``(callback, result)`` on a queue and pokes the loop over an inproc socket; the loop sends
    the reply (ZeroMQ sockets stay on the loop's thread). One thread: cold reads of a worker
    queue behind each other, not behind produce.
    """

    def __init__(self, ctx: zmq.Context, data_dir: str, segment_bytes: int):
        super().__init__(name="disk-reader", daemon=True)
        self.ctx = ctx
        self.data_dir = data_dir
        self.journal = JournalReader(data_dir, segment_bytes)
        self.indexes: dict[int, IndexFile] = {}
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0  # reads handed over and not yet answered (loop thread only)

    def _index(self, slot: int) -> IndexFile:
        """The slot's index file, opened again if the cached one was unlinked: a deleted topic's
        index file goes when the flusher clears its slot (persistence/retire.py), and a new topic
        that takes the slot gets a fresh file. A descriptor cached by slot alone would go on
        reading the old topic's entries for the new topic (positions in segments retention has
        since deleted: every fetch answered OFFSET_OUT_OF_RANGE at log start 0). One fstat a
        disk read."""
        index = self.indexes.get(slot)
        if index is not None and os.fstat(index.fd).st_nlink == 0:
            index.close()
            index = None
        if index is None:
            index = self.indexes[slot] = IndexFile(self.data_dir, slot)
        return index

    def submit(self, job: DiskRead, callback) -> None:
        self.pending += 1
        self.jobs.put((job, callback))

    def run(self) -> None:
        poke = self.ctx.socket(zmq.PUSH)
        poke.setsockopt(zmq.SNDHWM, 1)
        poke.connect(READS_ENDPOINT)
        swept = time.monotonic()
        try:
            while True:
                if time.monotonic() - swept > UNLINKED_SWEEP_S:  # segments retention deleted: let their blocks go
                    self.journal.drop_unlinked()
                    for slot in [k for k, i in self.indexes.items() if os.fstat(i.fd).st_nlink == 0]:
                        self.indexes.pop(slot).close()  # a deleted topic's: let its blocks go
                    swept = time.monotonic()
                try:
                    item = self.jobs.get(timeout=UNLINKED_SWEEP_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                job, callback = item
                try:
                    index = self._index(job.slot)
                    res = read_disk(index, self.journal, job)
                except FileNotFoundError:  # its segment went with retention since the fetch came in
                    res = FetchResult(P.ErrorCode.OFFSET_OUT_OF_RANGE, [], job.offset, "disk")
                except Exception as exc:  # a failed read is an error reply, not a dead thread
                    log.exception("disk read slot=%d offset=%d failed", job.slot, job.offset)
                    res = FetchResult(P.ErrorCode.INTERNAL, [], job.offset, f"disk: {type(exc).__name__}")
                self.done.put((callback, res))
                try:
                    poke.send(b"", zmq.NOBLOCK)  # one poke pending is enough: the loop drains all
                except zmq.Again:
                    pass
        finally:
            poke.close(0)
            self.journal.close()
            for index in self.indexes.values():
                index.close()

    def finish(self) -> None:
        """Loop thread: send the replies of every read that completed."""
        while True:
            try:
                callback, res = self.done.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            callback(res)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.jobs.put(None)
        self.join(timeout_s)

_produce_dec = P.decoder(P.ProduceRequest)
_fetch_dec = P.decoder(P.FetchRequest)
_list_offsets_dec = P.decoder(P.ListOffsetsRequest)
# the routing-header checks of every request (broker/envelope.py, over client/ops.py's SPEC): the
# router's ops are UNKNOWN_OP here, and so are PING and ADOPT unless the router sent them
ENVELOPE = Envelope("worker")
_watch_dec = msgspec.msgpack.Decoder(P.WatchRequest)


def _op_name(op: int) -> str:
    try:
        return P.Op(op).name
    except ValueError:
        return "UNKNOWN"


def _code_name(code: int) -> str:
    try:
        return P.ErrorCode(code).name
    except ValueError:
        return str(code)


class Worker:
    def __init__(self, s: settings_mod.Settings, worker_id: int, table: ControlTable):
        self.s = s
        self.worker_id = worker_id
        self.table = table
        self.header = HeaderView(table.header_words)  # storage_full: loaded once per produce request
        self.catalog = Catalog(s.data_dir)
        self.journal = JournalReader(s.data_dir, s.segment_bytes)
        self.actors: dict[int, PartitionActor] = {}  # slot -> actor
        self.sock: zmq.Socket | None = None
        self.port: PortMux | None = None
        self.appended: set[int] = set()  # slots appended to in this loop turn
        self.durable_added = False
        self.unkicked_bytes = 0  # appended since the last kick of the flusher
        self.parked_slots: set[int] = set()  # slots with parked fetches
        self.waiting_slots: set[int] = set()  # slots with durable waiters
        self.boot_ns = time.time_ns()
        self.reader: DiskReader | None = None  # cold reads off the loop (None: read inline)
        self.appended_bytes: dict[int, int] = {}  # slot -> bytes appended since the last PING
        self.totals = [0, 0, 0, 0]  # P.TOTALS since this worker started: one add per request, not per record
        # for the metrics exporter (broker/stats.py): a dict add per request, never per record
        self.stats = StatsFile(s.ipc_path(), f"worker-{worker_id}")
        self.replies: dict[tuple[int, int], int] = {}  # (op, code) -> replies
        self.durations: dict[int, Histogram] = {}  # op -> service time of its requests
        self.fetched: dict[int, list[int]] = {}  # slot -> [records, bytes] returned by fetches
        self.current_op = -1  # the op of the request being handled, for its duration
        self.adopted_new = False  # an actor was made here: tell the flusher (kick KICK_ADOPTED) to rescan its rows
        self.principal: str | None = None  # with --auth curve: who sent the request being handled
        self.throttle: quota.Throttle | None = None  # with --auth curve: the quotas (broker/quota.py)
        self.held: list = []  # heap of (due ns, seq, reply frames): replies held back by a quota
        self._held_seq = 0
        self.shared_rings: SharedRings | None = None  # read-only ring views for seek by time (offset_for_time)
        # same-host ring readers' doorbells (WATCH): Unix connection identity -> (abstract address,
        # slots, a durable reader: rung after syncs instead); rung at appends (produce, wake_late)
        self.watchers: dict[bytes, tuple[bytes, frozenset[int], bool]] = {}
        self.late: set[int] = set()  # slots appended to in this loop turn after its first append
        self.ringer: Ringer | None = None  # rings the watchers' bells (and the flusher's: WorkerProcess)

    # --- dispatch ------------------------------------------------------------------------
    def count(self, op: int, code: int) -> None:
        """One reply to a client (the router's heartbeat PINGs are not counted)."""
        if op != P.Op.PING:
            key = (op, code)
            self.replies[key] = self.replies.get(key, 0) + 1

    def stats_parts(self) -> tuple[dict, dict, dict]:
        """Counters, gauges and histograms for this worker's snapshot (broker/stats.py)."""
        w = self.worker_id
        requests = {label_key(w, _op_name(op), _code_name(code)): n for (op, code), n in self.replies.items()}
        durations = {label_key(w, _op_name(op)): h.snapshot() for op, h in self.durations.items()}
        return ({"worker_requests": requests,
                 "partition_records_fetched": {str(slot): v[0] for slot, v in self.fetched.items()},
                 "partition_bytes_fetched": {str(slot): v[1] for slot, v in self.fetched.items()}},
                {}, {"worker_request_duration_seconds": durations})

    def handle(self, frames: list[bytes]) -> None:
        t0 = time.perf_counter_ns()
        self.current_op = -1
        try:
            self._handle(frames)
        finally:
            self.principal = None
            op = self.current_op
            if op != P.Op.PING:
                h = self.durations.get(op)
                if h is None:
                    h = self.durations[op] = Histogram()
                h.observe_ns(time.perf_counter_ns() - t0)

    def _handle(self, frames: list[bytes]) -> None:
        if frames[0] == P.ROUTER_IDENTITY and len(frames) >= 4:
            ident, assign, rest = frames[:2], frames[2], frames[3:]
            if len(assign) > P.ASSIGN.size:  # the router's word for who the client is (see the top)
                self.principal = bytes(assign[P.ASSIGN.size:]).decode("utf-8", "replace")
                assign = assign[:P.ASSIGN.size]
        else:
            ident, assign, rest = frames[:1], None, frames[1:]
        try:
            version, op, _code, partition, request_id, topic = P.unpack_routing(rest[0] if rest else b"")
        except struct.error:
            self.count(-1, P.ErrorCode.MALFORMED)
            self.port.send([*ident, P.pack_routing(0, -1, 0, b"", P.ErrorCode.MALFORMED), P.encode(
                P.ErrorReply(f"first frame must be a {P.ROUTING_BYTES}-byte routing header"))])
            return
        self.current_op = op

        def reply(code, body=None, extra=()):
            self.count(op, code)
            head = P.encode(body) if body is not None else P.EMPTY_MAP
            self.port.send([*ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), code), head, *extra])
        try:
            why = ENVELOPE.check(version, op, topic, len(rest), assign is not None)
            if why is not None:
                return reply(why[0], P.ErrorReply(why[1]))
            if op == P.Op.PRODUCE:
                self.produce(ident, assign, topic, partition, rest, reply)
            elif op == P.Op.FETCH:
                self.fetch(ident, assign, topic, partition, rest, reply)
            elif op == P.Op.LIST_OFFSETS:
                self.list_offsets(topic, rest[1], reply)
            elif op == P.Op.WATCH:
                self.watch(ident, rest[1], reply)
            elif op == P.Op.PING:
                held = {slot: len(a.parked) + len(a.durable_waiters) for slot, a in self.actors.items()
                        if a.parked or a.durable_waiters}
                rows = self.table.rows
                slots = list(self.actors)
                unflushed = int((rows[slots, COL["next_offset"]] - rows[slots, COL["durable_offset"]]).sum()) if slots else 0
                reply(P.ErrorCode.OK, P.PingReply(self.worker_id, os.getpid(), self.boot_ns, len(self.actors),
                                                  self.appended_bytes, list(held), held, self.totals, unflushed))
                self.appended_bytes = {}
            elif self.actor_for(assign, topic, partition, reply) is not None:  # ADOPT, from the router (the envelope)
                reply(P.ErrorCode.OK)
        except P.DECODE_ERRORS as exc:
            reply(P.ErrorCode.MALFORMED, P.ErrorReply(f"undecodable header: {type(exc).__name__}: {exc}"))
        except Exception as exc:  # a bug must not take the worker down with it
            log.exception("request op=%s failed", op)
            reply(P.ErrorCode.INTERNAL, P.ErrorReply(f"internal error: {type(exc).__name__}: {exc}"))

    def watch(self, ident: list, header: bytes, reply) -> None:
        """WATCH (docs/PROTOCOL.md 8d): ring this connection's doorbell after turns that append to
        the slots it names. Only on the Unix socket: the bell is a local address, and the
        connection's end is the watch's end (``unwatch``)."""
        if len(ident) != 1 or type(ident[0]) is not UnixIdent:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                "WATCH is served on a worker's Unix socket only (same host: docs/PROTOCOL.md 8d)"))
        req = _watch_dec.decode(header)
        bell = req.bell
        if not bell.startswith(P.WATCH_BELL_PREFIX) or len(bell) > P.WATCH_BELL_MAX or "\x00" in bell:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"bell {bell[:P.WATCH_BELL_MAX]!r}: an abstract socket name starting with {P.WATCH_BELL_PREFIX!r}, "
                f"at most {P.WATCH_BELL_MAX} characters"))
        rows = len(self.table.rows)
        if len(req.slots) > P.WATCH_SLOTS_MAX or any(not 0 <= s < rows for s in req.slots):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"slots: at most {P.WATCH_SLOTS_MAX}, each 0..{rows - 1}"))
        if req.isolation not in ("memory", "durable"):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"isolation {req.isolation!r}: memory or durable"))
        if req.slots:
            self.watchers[ident[0]] = (b"\x00" + bell.encode(), frozenset(req.slots), req.isolation == "durable")
        else:
            self.watchers.pop(ident[0], None)
        reply(P.ErrorCode.OK)

    def unwatch(self, ident: bytes) -> None:
        """A Unix connection closed: its watch ends with it."""
        self.watchers.pop(ident, None)

    def ring_watchers(self, appended=(), synced: bool = False) -> None:
        """One byte to each memory reader watching a slot in ``appended`` (with ``synced``: to
        each durable reader); a bell nobody holds any more ends its watch."""
        for ident, (bell, slots, durable) in list(self.watchers.items()):
            if (synced and durable) or (not durable and not slots.isdisjoint(appended)):
                if not self.ringer.ring(bell, b"w"):
                    del self.watchers[ident]

    def wake_late(self, synced: bool) -> None:
        """End of a loop turn: wake the ring readers for what was appended after the turn's
        first append. That one woke them at once, ahead of its ack and of anything else the
        turn does (the ack can wake the producer onto this CPU first, and the reader would
        wait behind both); a reader woken then may have looked before the rest was published,
        so it is woken again for the rest."""
        if self.late:
            self.table.wake_readers(self.worker_id % layout.WAKE_FLUSHER)
        if self.watchers and (self.late or synced):
            self.ring_watchers(self.late, synced)
        self.late.clear()

    def actor_for(self, assign: bytes | None, topic: bytes, partition: int, reply):
        """The actor for this request, adopting the partition if the router says we own it."""
        if assign is not None:
            if len(assign) != P.ASSIGN.size:
                reply(P.ErrorCode.MALFORMED, P.ErrorReply("bad assignment frame"))
                return None
            slot, epoch = P.ASSIGN.unpack(assign)
            if epoch >= 1 << 63:  # the control row holds epochs as int64
                reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"owner epoch {epoch} out of range"))
                return None
            actor = self.actors.get(slot)
            if actor is not None and actor.epoch == epoch:
                return actor
            if actor is not None and actor.epoch > epoch:
                reply(P.ErrorCode.NOT_OWNER, P.ErrorReply(f"stale assignment: epoch {epoch} < {actor.epoch}"))
                return None
            return self.adopt(slot, epoch, reply)
        name = topic.decode("utf-8", "replace")
        slot = self.catalog.slot_of(name, partition)
        if slot is None:
            code = P.ErrorCode.UNKNOWN_TOPIC if self.catalog.get(name) is None else P.ErrorCode.UNKNOWN_PARTITION
            reply(code, P.ErrorReply(f"unknown topic or partition: topic={name!r} partition={partition}"))
            return None
        actor = self.actors.get(slot)
        if actor is None or actor.writer.fenced:
            reply(P.ErrorCode.NOT_OWNER, P.ErrorReply(f"worker {self.worker_id} does not own topic={name!r} partition={partition}"))
            return None
        return actor

    def adopt(self, slot: int, epoch: int, reply):
        self.check_catalog()  # one stat: the slot may belong to another topic since (a deleted one's, reused)
        actor = self.actors.get(slot)
        try:
            if actor is not None:
                actor.reassign(epoch)  # same process: keep the lock, the ring, the waiters
                return actor
            found = self.catalog.by_slot.get(slot)
            if found is None:
                reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"slot {slot} is no partition's (its topic was deleted)"))
                return None
            topic, partition = found
            actor = PartitionActor(self.table, self.s.instance, slot, topic.topic_id, partition,
                                   topic.ring_bytes, epoch, self.s.data_dir, self.journal, self.s.ipc_path())
        except Fenced as exc:
            reply(P.ErrorCode.NOT_OWNER, P.ErrorReply(str(exc)))
            return None
        self.actors[slot] = actor
        self.adopted_new = True
        return actor

    # --- ops -----------------------------------------------------------------------------
    def produce(self, ident, assign, topic, partition, rest, reply) -> None:
        req = _produce_dec.decode(rest[1])
        if req.acks not in (P.Acks.NONE, P.Acks.MEMORY, P.Acks.DURABLE):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"acks={req.acks} must be 0 (none), 1 (memory) or 2 (durable)"))
        actor = self.actor_for(assign, topic, partition, reply)
        if actor is None:
            return
        if self.header.storage_full and topic != OFFSETS_TOPIC_BYTES:  # the flusher's disk guard (persistence/diskguard.py)
            return reply(P.ErrorCode.STORAGE_FULL, P.ErrorReply(STORAGE_FULL_MESSAGE))
        code, message, base, count, t = actor.append(rest[2], self.s.max_batch_bytes, in_order=req.acks != P.Acks.NONE)
        if code != P.ErrorCode.OK:
            if code == P.ErrorCode.BACKPRESSURE:
                self.unkicked_bytes = KICK_MIN_BYTES  # a full ring: have the flusher drain it now
            return reply(code, P.ErrorReply(message))
        if self.appended:
            self.late.add(actor.slot)  # readers are woken for it at the end of the turn
        else:  # the turn's first append wakes the readers now, before its ack goes (see wake_late)
            self.table.wake_readers(self.worker_id % layout.WAKE_FLUSHER)
            if self.watchers:
                self.ring_watchers((actor.slot,))
        self.appended.add(actor.slot)
        self.appended_bytes[actor.slot] = self.appended_bytes.get(actor.slot, 0) + len(rest[2])
        self.totals[0] += count
        self.totals[1] += len(rest[2])
        self.unkicked_bytes += len(rest[2])
        hold_ms = 0
        if self.throttle is not None and message != "duplicate":  # a retry is not charged twice
            hold_ms = self.throttle.charge(self.principal, quota.PRODUCE, len(rest[2]), time.monotonic())
        if req.acks == P.Acks.NONE:
            self.count(P.Op.PRODUCE, P.ErrorCode.OK)  # stored; nobody is answered (nor held)
        elif req.acks == P.Acks.MEMORY:
            head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
            self.count(P.Op.PRODUCE, P.ErrorCode.OK)
            self.send_after([*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], hold_ms)
        elif req.acks == P.Acks.DURABLE:
            head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
            due = time.monotonic_ns() + hold_ms * 1_000_000 if hold_ms else 0
            actor.durable_waiters.append((base + count, [*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], due))
            self.waiting_slots.add(actor.slot)
            self.durable_added = True

    def fetch(self, ident, assign, topic, partition, rest, reply) -> None:
        req = _fetch_dec.decode(rest[1])
        if req.offset < 0 or req.max_bytes < 1 or req.max_records < 1 or req.max_wait_ms < 0 or req.isolation not in ("memory", "durable"):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"bad fetch fields: {req}"))
        actor = self.actor_for(assign, topic, partition, reply)
        if actor is None:
            return
        if not self.answer_fetch(actor, ident, rest[0], req, self.principal, final=req.max_wait_ms == 0):
            deadline = time.monotonic_ns() + min(req.max_wait_ms, 60_000) * 1_000_000
            actor.parked.append((deadline, ident, rest[0], req, self.principal))
            self.parked_slots.add(actor.slot)

    def answer_fetch(self, actor: PartitionActor, ident, routing: bytes, req: P.FetchRequest, who: str | None,
                     final: bool) -> bool:
        """Reply if there is data (or ``final``); return whether a reply was sent (or, for a
        read that needs the journal, will be sent by the reader thread's callback)."""
        max_bytes = req.max_bytes
        if self.throttle is not None and who is not None:  # over a fetch quota: read what keeps the hold short
            allowed = self.throttle.allowance(who, quota.FETCH, time.monotonic())
            if allowed is not None:
                max_bytes = max(1, min(max_bytes, allowed))  # one batch still comes, whatever its size
        res = actor.read_cached(req.offset, max_bytes, req.max_records, req.isolation)
        if isinstance(res, DiskRead):
            if self.reader is None:
                res = actor._read_disk(res.offset, res.max_bytes, res.max_records, res.limit)
            else:
                self.reader.submit(res, lambda r: self.send_fetch(actor, ident, routing, req, r, who))
                return True
        if res.code == P.ErrorCode.OK and not res.parts and not final:
            return False
        self.send_fetch(actor, ident, routing, req, res, who)
        return True

    def send_fetch(self, actor: PartitionActor, ident, routing: bytes, req: P.FetchRequest, res: FetchResult,
                   who: str | None) -> None:
        _v, op, _c, partition, request_id, topic = P.unpack_routing(routing)
        head = P.pack_routing(op, partition, request_id, topic, res.code)
        self.count(op, res.code)
        row = actor.row
        if res.code == P.ErrorCode.OFFSET_OUT_OF_RANGE and res.source == "disk" \
                and int(row[COL["log_start_offset"]]) <= req.offset < actor.watermark(req.isolation):
            # The journal lost a record its log start still promises (retention deletes a segment
            # only after moving every log start past it): say so, never "out of range" at a log
            # start below the offset asked for (a consumer resetting to it would loop, or skip).
            log.error("slot %d: the journal segment of offset %d is gone, log start %d", actor.slot, req.offset,
                      int(row[COL["log_start_offset"]]))
            head = P.pack_routing(op, partition, request_id, topic, P.ErrorCode.INTERNAL)
            self.port.send([*ident, head, P.encode(P.ErrorReply(
                f"offset {req.offset}: its journal segment is gone though the log start is "
                f"{int(row[COL['log_start_offset']])}"))])
            return
        if res.code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
            body = P.ErrorReply(f"offset {req.offset} out of range [{int(row[COL['log_start_offset']])}, {actor.watermark(req.isolation)}]",
                                log_start_offset=int(row[COL["log_start_offset"]]), high_watermark=actor.watermark(req.isolation))
            self.port.send([*ident, head, P.encode(body)])
            return
        if res.code != P.ErrorCode.OK:
            self.port.send([*ident, head, P.encode(P.ErrorReply(f"fetch failed ({res.source})"))])
            return
        body = res.parts[0] if len(res.parts) == 1 else b"".join(res.parts)
        hold_ms = self.throttle.charge(who, quota.FETCH, len(body), time.monotonic()) if self.throttle is not None else 0
        info = P.FetchReply(
            high_watermark=int(row[COL["next_offset"]]),
            durable_watermark=int(row[COL["durable_offset"]]),
            log_start_offset=int(row[COL["log_start_offset"]]),
            next_offset=res.next_offset,
            source=res.source,
            throttle_ms=hold_ms,
        )
        records = max(0, res.next_offset - req.offset)
        self.totals[2] += records
        self.totals[3] += len(body)
        got = self.fetched.get(actor.slot)
        if got is None:
            got = self.fetched[actor.slot] = [0, 0]
        got[0] += records
        got[1] += len(body)
        self.send_after([*ident, head, P.encode(info), body], hold_ms)

    def send_after(self, frames: list, hold_ms: int) -> None:
        """Send a reply now, or ``hold_ms`` from now (a quota's throttle: ``release_held``)."""
        if hold_ms <= 0:
            self.port.send(frames)
            return
        self._held_seq += 1
        heapq.heappush(self.held, (time.monotonic_ns() + hold_ms * 1_000_000, self._held_seq, frames))

    def release_held(self, now_ns: int) -> int:
        """Send the held replies that are due; ms until the next one (-1: none held)."""
        held = self.held
        while held and held[0][0] <= now_ns:
            self.port.send(heapq.heappop(held)[2])
        return max(1, (held[0][0] - now_ns) // 1_000_000) if held else -1

    def list_offsets(self, topic: bytes, header: bytes, reply) -> None:
        ts_ms = _list_offsets_dec.decode(header).timestamp_ms
        name = topic.decode("utf-8", "replace")
        self.catalog.reload()  # one stat: a topic grown since (topic alter) lists its new partitions
        entry = self.catalog.get(name)
        if entry is None:
            return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        rows = self.table.rows
        parts = []
        for p, slot in enumerate(entry.slots):
            r = rows[slot]
            po = P.PartitionOffsets(p, int(r[COL["log_start_offset"]]), int(r[COL["next_offset"]]), int(r[COL["durable_offset"]]),
                                    int(r[COL["write_position"]] - r[COL["flushed_position"]]), int(r[COL["write_position"]]))
            if ts_ms >= 0:
                found = self.offset_for_time(entry.topic_id, p, slot, ts_ms * 1000)
                if found is not None:
                    po.time_offset, po.time_timestamp_ms = found[0], found[1] // 1000
            parts.append(po)
        reply(P.ErrorCode.OK, P.ListOffsetsReply(name, parts))

    def offset_for_time(self, topic_id: int, partition: int, slot: int, t_us: int) -> tuple[int, int] | None:
        """The first batch of the partition appended at or after ``t_us``: (its first offset,
        its append time us), or None if all are older. The indexed part by binary search over
        the dense index and the journal (persistence/timesearch.py), the rest from the ring."""
        row = self.table.rows[slot]
        for attempt in range(3):  # a log start that moved during the search took its segment with it: again
            lo, flushed, hi = int(row[COL["log_start_offset"]]), int(row[COL["flushed_offset"]]), int(row[COL["next_offset"]])
            flushed = max(lo, min(flushed, hi))
            if flushed <= lo:
                break
            index = IndexFile(self.s.data_dir, slot)
            try:
                found = first_at_or_after(index, self.journal, lo, flushed, t_us)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue
            finally:
                index.close()
            if found is not None:
                return found
            break
        if hi <= flushed:
            return None
        # not indexed yet: the ring's batches from ``flushed`` (a few, the flusher keeps up)
        if self.shared_rings is None:
            self.shared_rings = SharedRings(self.s.instance, 0)
        tail = self.shared_rings.partition(slot, topic_id, partition)
        start = flushed
        while start < hi:
            got = tail.read(start, 4 << 20, 1 << 20)
            if got.status != TailStatus.DATA:
                raise OSError(f"partition slot {slot}: offsets {start}-{hi} not readable from its ring ({got.status.name})")
            views = iter_batches(got.body)
            for v in views:  # one step per batch, on an admin request
                if v.append_time_us >= t_us:
                    return max(v.base_offset, flushed), v.append_time_us
            start = got.next_offset
        return None

    # --- after each turn -----------------------------------------------------------------
    def release_durable(self) -> None:
        done = []
        for slot in self.waiting_slots:
            actor = self.actors.get(slot)
            if actor is None:
                done.append(slot)
                continue
            row = actor.row
            durable = int(row[COL["durable_offset"]])
            failed = bool(row[COL["io_error"]])
            q = actor.durable_waiters
            while q and (q[0][0] <= durable or failed):
                end, frames, due = q.popleft()
                if end > durable:  # storage failed before this batch was synced
                    frames = frames[:-2] + [_with_code(frames[-2], P.ErrorCode.STORAGE_UNAVAILABLE),
                                            P.encode(P.ErrorReply("journal cannot be written; batch not durable"))]
                    self.count(P.Op.PRODUCE, P.ErrorCode.STORAGE_UNAVAILABLE)
                    self.port.send(frames)
                    continue
                self.count(P.Op.PRODUCE, P.ErrorCode.OK)
                if due:  # held by a quota: until ``due``, if the sync came sooner
                    self._held_seq += 1
                    heapq.heappush(self.held, (due, self._held_seq, frames))
                else:
                    self.port.send(frames)
            if not q:
                done.append(slot)
        self.waiting_slots.difference_update(done)

    def service_parked(self, now_ns: int, synced: bool = False) -> int:
        """Answer parked fetches whose partition got data (or, for durable isolation, a sync
        happened), or whose wait expired.

        Returns ms until the next deadline (for the poll timeout), or -1 if none is parked."""
        next_ms = -1
        done = []
        for slot in self.parked_slots:
            actor = self.actors.get(slot)
            if actor is None:
                done.append(slot)
                continue
            keep = []
            appended = slot in self.appended
            for item in actor.parked:
                deadline, ident, routing, req, who = item
                expired = now_ns >= deadline
                has_new = appended if req.isolation == "memory" else synced
                if (has_new or expired) and self.answer_fetch(actor, ident, routing, req, who, final=expired):
                    continue
                keep.append(item)
                ms = max(0, (deadline - now_ns) // 1_000_000)
                next_ms = ms if next_ms < 0 else min(next_ms, ms)
            actor.parked = keep
            if not keep:
                done.append(slot)
        self.parked_slots.difference_update(done)
        return next_ms

    def check_catalog(self) -> None:
        """Re-read the catalog if it changed, and let go of the actors of deleted topics: their
        waiting requests are answered UNKNOWN_TOPIC (a durable produce not yet synced was not
        stored for good), and later ones get it from the catalog."""
        if not self.catalog.reload():
            return
        for slot, actor in list(self.actors.items()):
            found = self.catalog.by_slot.get(slot)
            if found is None or found[0].topic_id != actor.topic_id:
                self.drop_actor(slot, "its topic was deleted")

    def drop_actor(self, slot: int, why: str) -> None:
        actor = self.actors.pop(slot)
        code = P.ErrorCode.UNKNOWN_TOPIC
        for _end, frames, _due in actor.durable_waiters:
            self.count(P.Op.PRODUCE, code)
            self.port.send([*frames[:-2], _with_code(frames[-2], code), P.encode(P.ErrorReply(f"batch not durable: {why}"))])
        for _deadline, ident, routing, _req, _who in actor.parked:
            self.count(P.Op.FETCH, code)
            self.port.send([*ident, _with_code(routing, code), P.encode(P.ErrorReply(why))])
        actor.durable_waiters.clear()
        actor.parked = []
        self.parked_slots.discard(slot)
        self.waiting_slots.discard(slot)
        self.fetched.pop(slot, None)
        actor.close()
        log.info("slot %d let go: %s", slot, why)

    def check_fences(self) -> None:
        """Let go of partitions another owner has fenced us out of (also when idle)."""
        for slot, actor in list(self.actors.items()):
            if not actor.check_ownership() and actor.writer.fenced and not actor.durable_waiters and not actor.parked:
                actor.close()
                del self.actors[slot]

    def close(self) -> None:
        for actor in self.actors.values():
            actor.close()
        self.journal.close()
        if self.shared_rings is not None:
            self.shared_rings.close()


def _ignore(_frames) -> None:
    pass


def _request_id(routing: bytes) -> int:
    return P.ROUTING.unpack_from(routing)[4]


def _with_code(routing: bytes, code: int) -> bytes:
    v, op, _c, partition, rid = P.ROUTING.unpack_from(routing)
    return P.ROUTING.pack(v, op, code, partition, rid) + routing[P.ROUTING_BYTES:]


class KickPolicy:
    """When a worker rings the flusher's doorbell, after each loop turn.

    - ``KICK_ADOPTED`` first, when an actor was made here: the flusher looks at active rows only.
    - ``KICK_DURABLE`` at once for a durable waiter: its latency is the ack's latency.
    - ``KICK_DATA`` for plain data only once KICK_MIN_BYTES wait (or a ring was full), and at most
      every KICK_INTERVAL_S: the flusher stages a trickle on its own timer, and a kick per loop
      turn woke it once per message at low rates.
    A bell that cannot be rung (the flusher is restarting) is tried again next turn."""

    def __init__(self, ringer: Ringer, flusher_bell: str):
        self.ringer, self.flusher_bell = ringer, flusher_bell
        self.last_kick = 0.0  # monotonic seconds of the last data or durable kick

    def after_turn(self, worker: "Worker", now: float) -> None:
        if worker.adopted_new and self.ringer.ring(self.flusher_bell, KICK_ADOPTED):
            worker.adopted_new = False
        if worker.durable_added or (worker.unkicked_bytes >= KICK_MIN_BYTES and now - self.last_kick > KICK_INTERVAL_S):
            if self.ringer.ring(self.flusher_bell, KICK_DURABLE if worker.durable_added else KICK_DATA):
                self.last_kick = now
                worker.unkicked_bytes = 0


def wait_for_table(s: settings_mod.Settings, timeout_s: float, stop: list) -> ControlTable | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop:
        try:
            table = ControlTable.attach(s.instance)
            # READY, and made for this data directory (not left over from one wiped at this path)
            if table.state == layout.STATE_READY and int(table.header["data_id"]) == data_dir_id(s.data_dir):
                return table
            table.close()
        except (posix_ipc.ExistentialError, LayoutMismatch):
            pass
        time.sleep(0.05)
    return None


class WorkerProcess:
    """The worker's sockets and its loop: ``do_work`` is one turn (returns the events served),
    ``stop`` answers what is parked, gives durable waiters a last chance and closes in reverse.

    Waiting on ZeroMQ sockets. Some facts about ZMQ_FD (libzmq's socket_base, zmq_getsockopt(3)):
    the fd is the socket's command mailbox, readable while commands wait, such as "a pipe that was
    empty has messages again"; any recv, send or ZMQ_EVENTS call on the socket processes those
    commands and so clears the fd. A pipe that still holds unread messages sends no new command.
    So the fd signals edges: after it fires, receive until EAGAIN, and after any send on the socket,
    ask ZMQ_EVENTS, or an arrival whose command the send took in is never seen. ``zmq_poll`` does
    those checks for every socket on every call: two passes of poll plus a getpid and a poll per
    socket, about ten system calls per wait, in a loop that waits once per message at low rates.

    What this means for us: one epoll over the ZMQ_FDs, the doorbell and the Unix server's
    listener and connections, one system call per wait. A ZeroMQ socket is drained to EAGAIN
    when its fd fires (``*_due`` keeps one that stopped at DRAIN_MAX ready for the next turn),
    and the reply socket is asked ZMQ_EVENTS at the start of a turn only if something was sent
    on it since the last look (``ReplyPort.touched``): a same-host turn makes no ZeroMQ call."""

    def __init__(self, s: settings_mod.Settings, worker_id: int, table: ControlTable):
        self.s, self.worker_id, self.table = s, worker_id, table
        self.worker = worker = Worker(s, worker_id, table)
        self.ctx = ctx = zmq.Context()
        self.guard = None
        self.acls = None
        if s.auth == "curve":  # broker/auth.py: CURVE clients only, router commands from the router's key only
            self.guard = auth.Guard(ctx, s.data_dir, s.allow_dir, with_router=True)
            self.acls = acl.Acls(s.data_dir)  # broker/acl.py: direct clients' requests
            worker.throttle = quota.Throttle(s.data_dir, s.instance, worker_id)  # broker/quota.py
        self.sock = sock = ctx.socket(zmq.ROUTER)
        if self.guard is not None:
            auth.make_server(sock, s.data_dir)
        ReplyPort.configure(sock)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, s.max_frame_bytes)  # a larger part drops the peer, unread
        sock.bind(s.worker_endpoint(worker_id))
        self.bell = Doorbell(s.worker_bell_path(worker_id))  # the flusher rings it after every sync
        self.ringer, self.flusher_bell = Ringer(), s.flusher_bell_path()  # ... and we ring its bell to kick it
        worker.ringer = self.ringer
        worker.sock = sock
        self.reads = ctx.socket(zmq.PULL)
        self.reads.bind(READS_ENDPOINT)
        partition_mod.READ_DELAY_S = s.debug_read_delay_ms / 1000
        worker.reader = DiskReader(ctx, s.data_dir, s.segment_bytes)
        worker.reader.start()
        # One epoll over everything the loop waits on (see "Waiting on ZeroMQ sockets" in the
        # class docstring): the ZeroMQ sockets by their ZMQ_FD, the doorbell, and the Unix
        # server's listener and connections, which it registers here itself.
        self.ep = select.epoll()
        try:  # the same-host socket is an extra: a worker serves ZeroMQ without it
            self.unix = UnixServer(unixwire.path_of(s.worker_unix_endpoint(worker_id)), log, f"worker {worker_id}",
                                   max_message=s.max_frame_bytes, allowed_uids=s.allowed_uids(), ep=self.ep)
            self.unix.on_close = worker.unwatch
        except OSError as exc:
            log.warning("no Unix socket for same-host clients (%s); ZeroMQ only", exc)
            self.unix = None
        worker.port = PortMux(ReplyPort(sock, log, f"worker {worker_id}"), self.unix)
        self.sock_fd = sock.getsockopt(zmq.FD)
        self.reads_fd = self.reads.getsockopt(zmq.FD)
        self.bell_fd = self.bell.fileno()
        self.zap_fd = self.guard.zap.zap_socket.getsockopt(zmq.FD) if self.guard is not None else -1
        self.own_fds = frozenset(fd for fd in (self.sock_fd, self.reads_fd, self.bell_fd, self.zap_fd) if fd >= 0)
        for fd in self.own_fds:
            self.ep.register(fd, select.EPOLLIN)
        # ZeroMQ sockets to look at next turn without a signal from their FD (a drain that
        # stopped at DRAIN_MAX, or messages found waiting after a send): the wait does not block
        self.sock_due = self.reads_due = True
        self.zap_due = self.guard is not None
        self.last_allow_check = 0.0
        self.kicks = KickPolicy(self.ringer, self.flusher_bell)
        self.timeout_ms = 100
        self.last_fence_check = 0.0
        self.last_catalog_check = time.monotonic()
        self.last_sweep = time.monotonic()

    def do_work(self) -> int:
        """One turn: serve requests, wake ring readers, kick the flusher, release and answer."""
        worker = self.worker
        zport = worker.port.zmq
        if zport.touched:  # a send since the last look may have taken in an arrival's signal: ask the socket
            zport.touched = False
            self.sock_due = self.sock_due or bool(P.socket_events(self.sock) & zmq.POLLIN)
        due = self.sock_due or self.reads_due or self.zap_due
        ready = self.ep.poll(0 if due else self.timeout_ms / 1000)
        fds = [fd for fd, _ev in ready]
        guard = self.guard
        if guard is not None and (self.zap_due or self.zap_fd in fds):
            guard.zap.service()  # it replies on the same socket: look again after
            self.zap_due = bool(P.socket_events(guard.zap.zap_socket) & zmq.POLLIN)
        if self.sock_due or self.sock_fd in fds:
            if guard is None:
                n = P.drain(self.sock, worker.handle, DRAIN_MAX)
            else:
                n = guard.drain(self.sock, self.handle_as, self.refuse, DRAIN_MAX)
            self.sock_due = n == DRAIN_MAX  # else it stopped at EAGAIN: the next arrival signals
        if self.unix is not None and ready:  # the Unix server's fds, after ZeroMQ's requests
            own, handle = self.own_fds, worker.handle if guard is None else self.handle_local
            for fd, ev in ready:
                if fd not in own:
                    self.unix.on_event(fd, ev, handle)
        if self.reads_due or self.reads_fd in fds:
            self.reads_due = P.drain(self.reads, _ignore, DRAIN_MAX) == DRAIN_MAX
            worker.reader.finish()
        synced = self.bell_fd in fds
        if synced:
            self.bell.drain()
        worker.wake_late(synced)
        now = time.monotonic()
        self.kicks.after_turn(worker, now)
        if worker.waiting_slots:
            worker.release_durable()
        next_ms = worker.service_parked(time.monotonic_ns(), synced) if worker.parked_slots else -1
        if worker.held:
            due_ms = worker.release_held(time.monotonic_ns())
            next_ms = due_ms if next_ms < 0 else min(next_ms, due_ms) if due_ms >= 0 else next_ms
        worker.appended.clear()
        worker.durable_added = False
        if now - self.last_fence_check > 0.05:
            worker.check_fences()
            self.last_fence_check = now
        if now - self.last_catalog_check > CATALOG_CHECK_S:
            worker.check_catalog()
            self.last_catalog_check = now
        if now - self.last_sweep > UNLINKED_SWEEP_S:
            worker.journal.drop_unlinked()  # segments retention deleted: close them so their blocks go
            self.last_sweep = now
        if guard is not None and now - self.last_allow_check > 0.5:
            guard.allow.refresh()
            self.acls.refresh()
            worker.throttle.refresh()
            self.last_allow_check = now
        if worker.port.backlog:
            worker.port.flush()
        worker.stats.maybe_write(worker.stats_parts)
        timeout = 20 if worker.waiting_slots else 100  # a lost sync notice must not strand a waiter
        if worker.port.backlog:
            timeout = 2  # replies wait for room in a peer's queue
        if next_ms >= 0:
            timeout = min(timeout, max(next_ms, 1))
        self.timeout_ms = timeout
        return len(fds)

    def handle_as(self, frames: list[bytes], principal: str) -> None:
        """A message from an authenticated connection: only the router's key may speak as the
        router (assignments, ADOPT, PING), whatever identity a peer declares."""
        if frames[0] == P.ROUTER_IDENTITY:
            if principal != auth.ROUTER_PRINCIPAL:
                self.refuse(frames)
                return
        elif not self.permitted(frames, principal):  # a direct client: its rules, as the router checks them
            return
        self.worker.principal = principal
        self.worker.handle(frames)

    def handle_local(self, frames: list[bytes]) -> None:
        """A request on the same-host Unix socket (--auth curve): its principal is its user's
        (``unix:NAME``, from SO_PEERCRED at accept), under the same ACLs and quotas."""
        uid = self.unix.uid_of(frames[0])
        principal = quota.local_principal(uid) if uid is not None else "unix:?"
        if self.permitted(frames, principal):
            self.worker.principal = principal
            self.worker.handle(frames)

    def permitted(self, frames: list[bytes], principal: str) -> bool:
        """Whether ``principal``'s ACL rules allow this client request (else NOT_AUTHORIZED sent)."""
        refused = refusal(self.acls, principal, frames[:1], frames)  # broker/envelope.py, as the router checks it
        if refused is None:
            return True
        self.worker.port.send(refused)
        return False

    def refuse(self, frames: list[bytes]) -> None:
        if frames[0] == P.ROUTER_IDENTITY and len(frames) >= 4:  # [router, client, assign, routing, ...]
            self.worker.port.send(auth.refusal(frames[:2], frames[3], "router commands are taken from the router's key only"))
        else:
            self.worker.port.send(auth.refusal(frames[:1], frames[1] if len(frames) > 1 else b"",
                                               "this client's key is not in the broker's allow-list"))

    def stop(self) -> None:
        """Answer what is parked, give durable waiters a last chance, finish disk reads, close."""
        worker = self.worker
        worker.service_parked(1 << 62)
        worker.release_held(1 << 62)  # throttled replies go now: the stop must not lose them
        deadline = time.monotonic() + 2.0
        while worker.waiting_slots and time.monotonic() < deadline:
            self.ringer.ring(self.flusher_bell, KICK_DURABLE)
            if self.bell.wait(0.05):
                self.bell.drain()
            worker.release_durable()
        worker.release_held(1 << 62)
        deadline = time.monotonic() + 2.0
        while worker.reader.pending and time.monotonic() < deadline:
            if self.reads.poll(50):
                P.drain(self.reads, _ignore, DRAIN_MAX)
            worker.reader.finish()
        worker.reader.stop()
        worker.release_held(1 << 62)
        worker.close()
        if worker.throttle is not None:
            worker.throttle.close()
        if self.unix is not None:
            self.unix.close()
        for sock in (self.sock, self.reads):
            sock.close(0)
        self.ep.close()
        self.bell.close()
        self.ringer.close()
        if self.guard is not None:
            self.guard.close()
        self.ctx.term()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="tailrace.actors.worker")
    ap.add_argument("--id", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{args.id} %(levelname)s %(message)s")
    s = settings_mod.from_env()
    claim = datadir.enter_program(s, f"worker-{args.id}", log)
    if claim is None:
        return datadir.EXIT_REFUSED
    stop: list = []
    datadir.stop_on_signals(stop)
    pid_file = s.worker_pid_path(args.id)
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    table = wait_for_table(s, 120.0, stop)
    if table is None:
        log.error("control table not ready (is the flusher running?)")
        datadir.leave_program(claim, (pid_file,))
        return EXIT_NO_BROKER
    proc = WorkerProcess(s, args.id, table)
    log.info("worker %d serving on %s", args.id, s.worker_endpoint(args.id))
    while not stop:
        proc.do_work()
    proc.stop()
    time.sleep(s.debug_stop_delay_ms / 1000)
    datadir.leave_program(claim, (pid_file, s.worker_endpoint(args.id).removeprefix("ipc://")))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
