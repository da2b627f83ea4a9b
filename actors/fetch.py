"""FETCH: answer from the ring, hand a journal read to the disk-reader thread, or park the
request until data comes (long poll, ``max_wait_ms``, at most 60 s).

A parked fetch sits on its actor (``parked``, slot in ``Turn.parked_slots``) and is looked at
after a turn that appended to its partition (memory isolation) or after a flusher sync (durable
isolation), and when its wait runs out (``service_parked``). A read below the ring goes to the
``DiskReader`` (actors/diskreader.py) with a callback the loop runs when it is done: the loop
never waits on a disk. Offsets and the log start in replies come from the partition's
``PartitionLog`` (persistence/log.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tailrace.broker import quota
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.client.records import V1_READER_REFUSAL, newest_version
from tailrace.persistence.log import DiskRead, FetchResult

from .adopt import Owned
from .context import Outbox, Traffic, Turn
from .diskreader import DiskReader
from . import replication
from .partition import PartitionActor

log = logging.getLogger("tailrace.worker")
MAX_WAIT_MS = 60_000  # a parked fetch's wait is cut to this
_fetch_dec = ops.DECODERS[P.Op.FETCH]


@dataclass(slots=True)
class FetchContext:
    owned: Owned  # the actor of the request (adopting it on the router's word)
    out: Outbox
    traffic: Traffic  # totals and per-slot fetched counts
    turn: Turn  # parked_slots (touched), appended (read)
    throttle: quota.Throttle | None  # with --auth curve: the fetch quotas
    reader: DiskReader | None  # journal reads off the loop (None: read inline, a probe's setup)
    parked: object = None  # FETCH_MULTI's waits and fetch sessions (actors/fetch_multi.py Parked)


def fetch(ctx: FetchContext, ident, assign, topic, partition, rest, who, reply) -> None:
    req = _fetch_dec.decode(rest[1])
    if req.offset < 0 or req.max_bytes < 1 or req.max_records < 1 or req.max_wait_ms < 0 or req.isolation not in ("memory", "durable"):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"bad fetch fields: {req}"))
    actor = ctx.owned.actor_for(assign, topic, partition, reply)
    if actor is None:
        return
    if req.replica >= 0:  # a follower broker: its position counts toward the high watermark; it reads the whole log
        now = replication.follower_fetch(ctx.turn, actor, req, who)
        if now is not None:  # refused, or a copy that diverged: told where to cut it
            return reply(*now)
        req.isolation = "log"
    if not answer(ctx, actor, ident, rest[0], req, who, final=req.max_wait_ms == 0):
        deadline = time.monotonic_ns() + min(req.max_wait_ms, MAX_WAIT_MS) * 1_000_000
        actor.parked.append((deadline, ident, rest[0], req, who))
        ctx.turn.parked_slots.add(actor.slot)


def answer(ctx: FetchContext, actor: PartitionActor, ident, routing: bytes, req: P.FetchRequest, who: str | None,
           final: bool) -> bool:
    """Reply if there is data (or ``final``); return whether a reply was sent (or, for a read
    that needs the journal, will be sent by the reader thread's callback)."""
    max_bytes = req.max_bytes
    if ctx.throttle is not None and who is not None:  # over a fetch quota: read what keeps the hold short
        allowed = ctx.throttle.allowance(who, quota.FETCH, time.monotonic())
        if allowed is not None:
            max_bytes = max(1, min(max_bytes, allowed))  # one batch still comes, whatever its size
    res = actor.read_cached(req.offset, max_bytes, req.max_records, req.isolation)
    if isinstance(res, DiskRead):
        if ctx.reader is None:
            res = actor._read_disk(res.offset, res.max_bytes, res.max_records, res.limit)
        else:
            ctx.reader.submit(res, lambda r: send(ctx, actor, ident, routing, req, r, who))
            return True
    if res.code == P.ErrorCode.OK and not res.parts and not final:
        return False
    send(ctx, actor, ident, routing, req, res, who)
    return True


def send(ctx: FetchContext, actor: PartitionActor, ident, routing: bytes, req: P.FetchRequest, res: FetchResult,
         who: str | None) -> None:
    version, op, _c, partition, request_id, topic = P.unpack_routing(routing)
    if version == 1 and res.code == P.ErrorCode.OK and newest_version(res.parts) > 1:
        res = FetchResult(P.ErrorCode.UNSUPPORTED_VERSION, [], req.offset, "")
        head = P.pack_routing(op, partition, request_id, topic, res.code)
        ctx.out.count(op, res.code)
        ctx.out.port.send([*ident, head, P.encode(P.ErrorReply(V1_READER_REFUSAL))])
        return
    head = P.pack_routing(op, partition, request_id, topic, res.code)
    out = ctx.out
    out.count(op, res.code)
    if res.code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
        log_start, hw = actor.log.log_start_offset, actor.log.watermark(req.isolation)
        if res.source == "disk" and log_start <= req.offset < hw:
            # The journal lost a record its log start still promises (retention deletes a segment
            # only after moving every log start past it): say so, never "out of range" at a log
            # start below the offset asked for (a consumer resetting to it would loop, or skip).
            head = P.pack_routing(op, partition, request_id, topic, P.ErrorCode.INTERNAL)
            out.port.send([*ident, head, P.encode(P.ErrorReply(missing_segment(actor, req.offset, log_start)))])
            return
        body = P.ErrorReply(f"offset {req.offset} out of range [{log_start}, {hw}]", log_start_offset=log_start, high_watermark=hw)
        out.port.send([*ident, head, P.encode(body)])
        return
    if res.code != P.ErrorCode.OK:
        out.port.send([*ident, head, P.encode(P.ErrorReply(f"fetch failed ({res.source})"))])
        return
    body = res.parts[0] if len(res.parts) == 1 else b"".join(res.parts)
    hold_ms = ctx.throttle.charge(who, quota.FETCH, len(body), time.monotonic()) if ctx.throttle is not None else 0
    log_start, hw, durable = actor.log.offsets()
    if actor.repl is not None:  # a replicated partition: what every in-sync replica holds
        hw, durable = actor.watermark("memory"), actor.watermark("durable")
    info = P.FetchReply(high_watermark=hw, durable_watermark=durable, log_start_offset=log_start,
                        next_offset=res.next_offset, source=res.source, throttle_ms=hold_ms)
    records = max(0, res.next_offset - req.offset)
    totals, fetched = ctx.traffic.totals, ctx.traffic.fetched
    totals[2] += records
    totals[3] += len(body)
    got = fetched.get(actor.slot)
    if got is None:
        got = fetched[actor.slot] = [0, 0]
    got[0] += records
    got[1] += len(body)
    out.send_after([*ident, head, P.encode(info), body], hold_ms)


def missing_segment(actor: PartitionActor, offset: int, log_start: int) -> str:
    """Log, and say, that the journal lost a record the log start still promises."""
    log.error("slot %d: the journal segment of offset %d is gone, log start %d", actor.slot, offset, log_start)
    return f"offset {offset}: its journal segment is gone though the log start is {log_start}"


def service_parked(ctx: FetchContext, now_ns: int, synced: bool = False) -> int:
    """Answer parked fetches whose partition got data (or, for durable isolation, a sync
    happened), or whose wait expired.

    Returns ms until the next deadline (for the poll timeout), or -1 if none is parked."""
    actors, turn = ctx.owned.actors, ctx.turn
    next_ms = -1
    done = []
    for slot in turn.parked_slots:
        actor = actors.get(slot)
        if actor is None:
            done.append(slot)
            continue
        keep = []
        appended = slot in turn.appended
        for item in actor.parked:
            deadline, ident, routing, req, who = item
            expired = now_ns >= deadline
            has_new = synced if req.isolation == "durable" else appended  # (a follower's "log" reads as memory)
            if (has_new or expired) and answer(ctx, actor, ident, routing, req, who, final=expired):
                continue
            keep.append(item)
            ms = max(0, (deadline - now_ns) // 1_000_000)
            next_ms = ms if next_ms < 0 else min(next_ms, ms)
        actor.parked = keep
        if not keep:
            done.append(slot)
    turn.parked_slots.difference_update(done)
    return next_ms
