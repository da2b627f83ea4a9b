"""PRODUCE: append one batch to its partition's ring, ack it by its ``acks``, and release
durable acks once the flusher's sync covers them.

Acks: ``none`` is stored and answered to nobody; ``memory`` is answered at once (or when a quota's
hold ends); ``durable`` waits on the actor (``durable_waiters``) until the row's
``durable_offset`` covers the batch: the loop kicks the flusher for it (``Turn.durable_added``)
and ``release_durable`` answers after the flusher rings this worker's bell.

Readers are woken at the turn's first append, before its ack (``Worker.wake_late`` wakes them
again for the rest of the turn): see there for why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tailrace.broker import quota
from tailrace.broker.catalog import OFFSETS_TOPIC
from tailrace.client import protocol as P
from tailrace.persistence.flusher import STAGE_MIN_BYTES
from tailrace.shm.ring import ControlTable
from tailrace.shm.rows import HeaderView

from .adopt import Owned, with_code
from .context import Outbox, Traffic, Turn
from .watch import Watchers

KICK_MIN_BYTES = STAGE_MIN_BYTES  # plain data waiting before a worker kicks the flusher: what it stages at once
STORAGE_FULL_MESSAGE = ("the journal's filesystem is fuller than disk_max_used_ratio: produce is refused until there is room "
                        "(retriable; nothing was stored)")
OFFSETS_TOPIC_BYTES = OFFSETS_TOPIC.encode()  # group commits are still taken when storage is full: a few bytes each
_produce_dec = P.decoder(P.ProduceRequest)


@dataclass(slots=True)
class ProduceContext:
    owned: Owned  # the actor of the request (adopting it on the router's word)
    header: HeaderView  # the control table's header: storage_full, loaded once per request
    max_batch_bytes: int
    out: Outbox
    traffic: Traffic
    turn: Turn
    table: ControlTable  # wake_readers: the ring readers' futex of this worker's group
    wake_group: int
    watchers: Watchers
    throttle: quota.Throttle | None  # with --auth curve: the quotas (broker/quota.py)


def produce(ctx: ProduceContext, ident, assign, topic, partition, rest, who, reply) -> None:
    req = _produce_dec.decode(rest[1])
    if req.acks not in (P.Acks.NONE, P.Acks.MEMORY, P.Acks.DURABLE):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"acks={req.acks} must be 0 (none), 1 (memory) or 2 (durable)"))
    actor = ctx.owned.actor_for(assign, topic, partition, reply)
    if actor is None:
        return
    if ctx.header.storage_full and topic != OFFSETS_TOPIC_BYTES:  # the flusher's disk guard (persistence/diskguard.py)
        return reply(P.ErrorCode.STORAGE_FULL, P.ErrorReply(STORAGE_FULL_MESSAGE))
    code, message, base, count, t = actor.append(rest[2], ctx.max_batch_bytes, in_order=req.acks != P.Acks.NONE)
    if code != P.ErrorCode.OK:
        if code == P.ErrorCode.BACKPRESSURE:
            ctx.turn.unkicked_bytes = KICK_MIN_BYTES  # a full ring: have the flusher drain it now
        return reply(code, P.ErrorReply(message))
    turn, traffic, slot, size = ctx.turn, ctx.traffic, actor.slot, len(rest[2])
    if turn.appended:
        turn.late.add(slot)  # readers are woken for it at the end of the turn
    else:  # the turn's first append wakes the readers now, before its ack goes (see Worker.wake_late)
        ctx.table.wake_readers(ctx.wake_group)
        if ctx.watchers.bells:
            ctx.watchers.ring((slot,))
    turn.appended.add(slot)
    traffic.appended_bytes[slot] = traffic.appended_bytes.get(slot, 0) + size
    traffic.totals[0] += count
    traffic.totals[1] += size
    turn.unkicked_bytes += size
    hold_ms = 0
    if ctx.throttle is not None and message != "duplicate":  # a retry is not charged twice
        hold_ms = ctx.throttle.charge(who, quota.PRODUCE, size, time.monotonic())
    if req.acks == P.Acks.NONE:
        ctx.out.count(P.Op.PRODUCE, P.ErrorCode.OK)  # stored; nobody is answered (nor held)
    elif req.acks == P.Acks.MEMORY:
        head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
        ctx.out.count(P.Op.PRODUCE, P.ErrorCode.OK)
        ctx.out.send_after([*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], hold_ms)
    elif req.acks == P.Acks.DURABLE:
        head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
        due = time.monotonic_ns() + hold_ms * 1_000_000 if hold_ms else 0
        actor.durable_waiters.append((base + count, [*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], due))
        turn.waiting_slots.add(slot)
        turn.durable_added = True


def release_durable(ctx: ProduceContext) -> None:
    """Answer the durable waiters the row's ``durable_offset`` now covers (or, once the journal
    failed, every waiter: STORAGE_UNAVAILABLE for those not synced)."""
    actors, out, waiting = ctx.owned.actors, ctx.out, ctx.turn.waiting_slots
    done = []
    for slot in waiting:
        actor = actors.get(slot)
        if actor is None:
            done.append(slot)
            continue
        plog = actor.log
        durable = plog.durable_watermark
        failed = actor.owner_row.io_error
        q = actor.durable_waiters
        while q and (q[0][0] <= durable or failed):
            end, frames, due = q.popleft()
            if end > durable:  # storage failed before this batch was synced
                frames = frames[:-2] + [with_code(frames[-2], P.ErrorCode.STORAGE_UNAVAILABLE),
                                        P.encode(P.ErrorReply("journal cannot be written; batch not durable"))]
                out.count(P.Op.PRODUCE, P.ErrorCode.STORAGE_UNAVAILABLE)
                out.port.send(frames)
                continue
            out.count(P.Op.PRODUCE, P.ErrorCode.OK)
            if due:  # held by a quota: until ``due``, if the sync came sooner
                out.hold_until(due, frames)
            else:
                out.port.send(frames)
        if not q:
            done.append(slot)
    waiting.difference_update(done)


def _request_id(routing: bytes) -> int:
    return P.ROUTING.unpack_from(routing)[4]
