"""FETCH_MULTI: read many partitions of one topic in one request, one long poll over all of them,
and fetch sessions so a reader of many partitions sends only the positions that moved
(docs/PROTOCOL.md 4.2a; Kafka's FetchRequest with KIP-227's incremental sessions).

Each partition is read as FETCH reads it (``actor.read_cached``: the ring, or a journal read on
the disk-reader thread); the reply goes once every read of it is done. With nothing to return
and ``max_wait_ms`` > 0 the request parks (``MultiFetch`` in ``Parked.waits``) until any of its
partitions gets data (memory isolation: an append; durable: a sync) or the wait ends;
``service_parked`` below runs after FETCH's own, and a turn with neither costs it one compare
(``Parked.soonest``): a reader of 10,000 quiet partitions parks ~160 requests, and looking at
each (and their slots) every turn took a worker's core.

A session is the worker's record of a reader's positions: ``session_id`` 0 opens one, and a
request in it lists only partitions whose position moved (or that are new) and those to forget;
the others are read from the positions the session holds. The worker never moves a position on
its own (a lost reply loses nothing: the reader asks again from where it is). The reply of a
session request lists the partitions with data, an error, or named in the request. Sessions
idle for SESSION_IDLE_S, or the oldest past MAX_SESSIONS, are dropped: a request in one gets
FETCH_SESSION_NOT_FOUND and opens a new one with every position.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict

import numpy as np

from tailrace.broker import quota
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.client.records import V1_READER_REFUSAL, newest_version
from tailrace.persistence.log import DiskRead, FetchResult
from tailrace.shm.layout import C_DURABLE_OFFSET, C_NEXT_OFFSET

from .fetch import MAX_WAIT_MS, FetchContext, missing_segment

MAX_SESSIONS = 1000  # fetch sessions one worker holds; the least recently used goes first
SESSION_IDLE_S = 120.0
_dec = ops.DECODERS[P.Op.FETCH_MULTI]


class Session:
    __slots__ = ("topic", "owner", "positions", "used", "actors")

    def __init__(self, topic: bytes, owner: bytes):
        self.topic, self.owner = topic, owner  # the client connection that opened it (its identity frame)
        self.positions: dict[int, int] = {}  # partition -> where the reader reads it from
        # partition -> its actor as last found (still this worker's while ``Owned.actors`` holds it:
        # a fenced one is let go within 50 ms, the worker's fence check): no catalog look-up a request
        self.actors: dict[int, object] = {}
        self.used = time.monotonic()


class Sessions:
    """The fetch sessions of one worker, least recently used first."""

    def __init__(self, limit: int = MAX_SESSIONS, idle_s: float = SESSION_IDLE_S):
        self.limit, self.idle_s = limit, idle_s
        self.by_id: OrderedDict[int, Session] = OrderedDict()

    def open(self, topic: bytes, owner: bytes) -> tuple[int, Session]:
        """A new session of ``owner`` (a client connection's identity frame). Its id is random
        (62 bits): ids of another worker, or of this one before a restart, never name it."""
        now = time.monotonic()
        while self.by_id:
            sid, oldest = next(iter(self.by_id.items()))
            if len(self.by_id) < self.limit and now - oldest.used < self.idle_s:
                break
            del self.by_id[sid]
        sid = secrets.randbits(62) or 1
        s = self.by_id[sid] = Session(topic, owner)
        return sid, s

    def get(self, sid: int, topic: bytes, owner: bytes) -> Session | None:
        """The session ``sid`` if ``owner`` opened it for ``topic`` and it is not stale."""
        s = self.by_id.get(sid)
        if s is None or s.topic != topic or s.owner != owner:
            return None
        if time.monotonic() - s.used >= self.idle_s:
            del self.by_id[sid]
            return None
        s.used = time.monotonic()
        self.by_id.move_to_end(sid)
        return s


class Parked:
    """The FETCH_MULTI requests waiting for data (``MultiFetch``), and the worker's sessions."""

    def __init__(self):
        self.waits: list[MultiFetch] = []
        self.soonest = 0  # monotonic ns of the earliest deadline among ``waits`` (0: look at them)
        self.sessions = Sessions()


class MultiFetch:
    """One FETCH_MULTI: its partitions' actors and offsets, the results so far, and the disk
    reads it waits for."""

    __slots__ = ("ident", "head", "req", "sid", "targets", "listed", "who", "deadline", "slots", "results", "pending",
                 "version", "always", "quiet")

    def __init__(self, ident, head: tuple, req: P.FetchMultiRequest, sid: int, targets: list, listed: set, who):
        self.ident, self.head, self.req, self.sid, self.who = ident, head, req, sid, who
        self.targets = targets  # (partition, actor or None, offset, outcome for a partition refused up front)
        self.listed = listed  # partitions the request named (always in the reply)
        self.deadline = time.monotonic_ns() + min(req.max_wait_ms, MAX_WAIT_MS) * 1_000_000
        self.slots = {a.slot for _p, a, _o, _r in targets if a is not None}
        self.results: list = []
        self.pending = 0
        # the targets ``run`` reads every time, and (in a session) the quiet ones it reads only once
        # their row's watermark is past the position: one numpy gather for all of them (a reader
        # of 10,000 quiet partitions cost its workers a look at each of them every wait)
        self.always, self.quiet = list(range(len(targets))), None
        if req.session_id >= 0:
            q = [i for i, (p, a, _o, r) in enumerate(targets) if a is not None and p not in listed]
            if q:
                qs = set(q)
                self.always = [i for i in self.always if i not in qs]
                self.quiet = (q, np.fromiter((targets[i][1].slot for i in q), dtype=np.int64, count=len(q)),
                              np.fromiter((targets[i][2] for i in q), dtype=np.int64, count=len(q)))
        self.version = P.PROTOCOL_VERSION  # the client's protocol version (1 reads v1 batches only)


def fetch_multi(ctx: FetchContext, ident, assign, topic, partition, rest, who, reply) -> None:
    req = _dec.decode(rest[1])
    parts, offsets = req.partitions, req.offsets
    if (len(parts) != len(offsets) or any(o < 0 for o in offsets) or req.max_bytes < 1 or req.max_records < 1
            or req.max_total_bytes < 1 or req.max_wait_ms < 0 or req.isolation not in ("memory", "durable")
            or len(parts) > P.MAX_REQUEST_PARTITIONS or req.session_id < -1):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"bad fetch fields: {req}"[:P.ERROR_TEXT_MAX]))
    if len(set(parts)) != len(parts):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("a partition is listed twice"))
    if assign is not None and len(assign) != P.ASSIGN.size * len(parts):
        return reply(P.ErrorCode.MALFORMED, P.ErrorReply("bad assignment frame"))
    sessions = ctx.parked.sessions
    positions = dict(zip(parts, offsets))
    sid = req.session_id
    owner = bytes(ident[-1])  # the client's connection: a session is its own
    if sid > 0:
        session = sessions.get(sid, topic, owner)
        if session is None:
            return reply(P.ErrorCode.FETCH_SESSION_NOT_FOUND, P.ErrorReply(
                f"no fetch session {sid} of this connection for this topic on this worker "
                "(expired, or the worker restarted): open a new one"))
        for p in req.forget:
            session.positions.pop(p, None)
            session.actors.pop(p, None)
        session.positions.update(positions)
        if len(session.positions) > P.MAX_REQUEST_PARTITIONS:
            del sessions.by_id[sid]
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"a fetch session holds at most {P.MAX_REQUEST_PARTITIONS} partitions (the session is closed)"))
        positions = session.positions
    elif sid == 0:
        sid, session = sessions.open(topic, owner)
        session.positions.update(positions)
    else:
        session = None
    index = {p: i for i, p in enumerate(parts)}
    owned, targets, live = ctx.owned, [], ctx.owned.actors
    known = session.actors if session is not None else {}
    for p, offset in positions.items():
        said = []
        one = None
        i = index.get(p)
        if assign is not None and i is not None:
            one = assign[i * P.ASSIGN.size:(i + 1) * P.ASSIGN.size]
            slot, epoch = P.ASSIGN.unpack(one)
            if slot == P.NO_SLOT:
                targets.append((p, None, offset, P.PartitionFetch(p, epoch, message=_not_routed(epoch))))
                continue
        actor = known.get(p) if one is None else None
        if actor is not None and live.get(actor.slot) is actor:
            targets.append((p, actor, offset, None))
            continue
        actor = owned.actor_for(one, topic, p, lambda code, body=None: said.append((code, body)))
        if actor is not None and session is not None:
            known[p] = actor
        if actor is None:
            code, body = said[0]
            targets.append((p, None, offset, P.PartitionFetch(p, code, message=body.message if body is not None else "")))
        else:
            targets.append((p, actor, offset, None))
    m = MultiFetch(ident, P.unpack_routing(rest[0])[1:6], req, sid, targets, set(parts), who)
    m.version = P.unpack_routing(rest[0])[0]
    if not run(ctx, m, final=req.max_wait_ms == 0 or not m.slots):  # nothing to wait on: answer now
        parked = ctx.parked
        parked.waits.append(m)
        parked.soonest = min(parked.soonest, m.deadline) if parked.soonest else m.deadline


_WATERMARK = {"memory": C_NEXT_OFFSET, "durable": C_DURABLE_OFFSET}  # a row's column per isolation


def _not_routed(code: int) -> str:
    if code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return "this broker does not lead this partition: describe the topic for its leader"
    return "another worker owns this partition: fetch it from that worker" if code == P.ErrorCode.NOT_OWNER else "unknown partition"


def run(ctx: FetchContext, m: MultiFetch, final: bool) -> bool:
    """Read every partition of ``m``; reply now, or once its disk reads are done. False (nothing
    sent, nothing read) when no partition had data or an error and ``final`` is not set."""
    req = m.req
    budget = req.max_total_bytes
    if ctx.throttle is not None and m.who is not None:  # over a fetch quota: read what keeps the hold short
        allowed = ctx.throttle.allowance(m.who, quota.FETCH, time.monotonic())
        if allowed is not None:
            budget = max(1, min(budget, allowed))
    results, reads, news = [], [], False
    live = ctx.owned.actors
    look = m.always
    if m.quiet is not None:
        q, slots, offsets = m.quiet
        moved = np.flatnonzero(ctx.owned.table.rows[slots, _WATERMARK[req.isolation]] != offsets)
        if moved.size:
            look = sorted(look + [q[i] for i in moved.tolist()])
    targets = m.targets
    for i in look:
        p, actor, offset, refused = targets[i]
        if refused is not None:
            results.append([refused, None])
            news = True
            continue
        if live.get(actor.slot) is not actor:  # let go since (its topic deleted, or fenced)
            results.append([P.PartitionFetch(p, P.ErrorCode.NOT_OWNER, message="this worker let the partition go "
                                             "(moved, or its topic deleted): describe the topic again"), None])
            news = True
            continue
        if budget <= 0:
            continue  # the reply is full: this one in the next request
        res = actor.read_cached(offset, min(req.max_bytes, budget), req.max_records, req.isolation)
        entry = [None, (p, actor, offset)]
        if isinstance(res, DiskRead):
            budget -= res.max_bytes
            reads.append((res, entry))
            news = True
        else:
            size = sum(map(len, res.parts))
            budget -= size
            entry[0] = res
            news = news or res.code != P.ErrorCode.OK or size > 0
        results.append(entry)
    if not news and not final:
        return False
    m.results = results
    if reads and ctx.reader is not None:
        m.pending = len(reads)
        for job, entry in reads:
            ctx.reader.submit(job, lambda r, entry=entry: _disk_done(ctx, m, entry, r))
        return True
    for job, entry in reads:  # no reader thread (a probe): read inline
        actor = entry[1][1]
        entry[0] = actor._read_disk(job.offset, job.max_bytes, job.max_records, job.limit)
    _send(ctx, m)
    return True


def _disk_done(ctx: FetchContext, m: MultiFetch, entry: list, res: FetchResult) -> None:
    entry[0] = res
    m.pending -= 1
    if not m.pending:
        _send(ctx, m)


def _send(ctx: FetchContext, m: MultiFetch) -> None:
    out, req = [], m.req
    bodies, nbytes, fetched, totals = [], 0, ctx.traffic.fetched, ctx.traffic.totals
    session = m.req.session_id >= 0
    held = ctx.parked.sessions.by_id.get(m.sid) if session else None
    for res, where in m.results:
        if where is None:  # refused up front
            out.append(res)
            continue
        p, actor, offset = where
        log_start, hw, durable = actor.log.offsets()
        if actor.repl is not None:  # a replicated partition: what every in-sync replica holds
            hw, durable = actor.watermark("memory"), actor.watermark("durable")
        if res.code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
            watermark = actor.log.watermark(req.isolation)
            if res.source == "disk" and log_start <= offset < watermark:
                out.append(P.PartitionFetch(p, P.ErrorCode.INTERNAL, hw, durable, log_start, offset,
                                            message=missing_segment(actor, offset, log_start)))
            else:
                out.append(P.PartitionFetch(p, res.code, hw, durable, log_start, offset,
                                            message=f"offset {offset} out of range [{log_start}, {watermark}]"))
            continue
        if res.code != P.ErrorCode.OK:
            out.append(P.PartitionFetch(p, res.code, hw, durable, log_start, offset, message=f"fetch failed ({res.source})"))
            continue
        size = sum(map(len, res.parts))
        if m.version == 1 and size and newest_version(res.parts) > 1:
            out.append(P.PartitionFetch(p, P.ErrorCode.UNSUPPORTED_VERSION, hw, durable, log_start, offset,
                                        message=V1_READER_REFUSAL))
            continue
        if session and not size and p not in m.listed:
            continue  # a session's quiet partition: nothing to say
        if session and size and held is not None and p in held.positions:
            held.positions[p] = held.positions.pop(p)  # served: to the back, so a full reply rotates (KIP-227)
        out.append(P.PartitionFetch(p, P.ErrorCode.OK, hw, durable, log_start, res.next_offset, size))
        if size:  # its own frame: a ring read of one part goes out without a copy, as FETCH's body
            bodies.append(res.parts[0] if len(res.parts) == 1 else b"".join(res.parts))
            nbytes += size
            records = res.next_offset - offset
            totals[2] += records
            totals[3] += size
            got = fetched.get(actor.slot)
            if got is None:
                got = fetched[actor.slot] = [0, 0]
            got[0] += records
            got[1] += size
    hold_ms = ctx.throttle.charge(m.who, quota.FETCH, nbytes, time.monotonic()) if ctx.throttle is not None else 0
    op, _code, partition, request_id, topic = m.head
    head = P.pack_routing(op, partition, request_id, topic)
    ctx.out.count(op, P.ErrorCode.OK)
    ctx.out.send_after([*m.ident, head, P.encode(P.FetchMultiReply(out, m.sid if m.req.session_id >= 0 else -1, hold_ms)),
                        *bodies], hold_ms)


def service_parked(ctx: FetchContext, now_ns: int, synced: bool) -> int:
    """Answer the parked FETCH_MULTI requests that got data or whose wait ran out. Returns ms to
    the next deadline, -1 if none."""
    parked = ctx.parked
    waits = parked.waits
    if not waits:
        return -1
    appended = ctx.turn.appended
    if not appended and not synced and now_ns < parked.soonest:
        return -(-(parked.soonest - now_ns) // 1_000_000)  # (rounded up: no spin in its last ms)
    keep, soonest = [], 0
    for m in waits:
        expired = now_ns >= m.deadline
        has_new = synced if m.req.isolation == "durable" else not appended.isdisjoint(m.slots)
        if (has_new or expired) and run(ctx, m, final=expired):
            continue
        keep.append(m)
        soonest = m.deadline if not soonest else min(soonest, m.deadline)
    parked.waits, parked.soonest = keep, soonest
    return -1 if not keep else max(0, -(-(soonest - now_ns) // 1_000_000))
