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
from tailrace.broker.catalog import OFFSETS_TOPIC, SHARE_STATE_TOPIC
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.persistence.flusher import STAGE_MIN_BYTES
from tailrace.shm.ring import ControlTable
from tailrace.shm.rows import HeaderView

from . import epochs
from .adopt import Owned, with_code
from .context import Outbox, Traffic, Turn
from .truncate import cut_target, truncate
from .watch import Watchers

KICK_MIN_BYTES = STAGE_MIN_BYTES  # plain data waiting before a worker kicks the flusher: what it stages at once
STORAGE_FULL_MESSAGE = ("the journal's filesystem is fuller than disk_max_used_ratio: produce is refused until there is room "
                        "(retriable; nothing was stored)")
# group commits and share-group acknowledgements are still taken when storage is full: a few bytes each
STATE_TOPICS = (OFFSETS_TOPIC.encode(), SHARE_STATE_TOPIC.encode())
_produce_dec = ops.DECODERS[P.Op.PRODUCE]
_multi_dec = ops.DECODERS[P.Op.PRODUCE_MULTI]
_replica_dec = ops.DECODERS[P.Op.REPLICA_APPEND]


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
    fetches: object = None  # the parked FETCH_MULTIs (actors/fetch_multi.py Parked): refused in part by stop_leading


def produce(ctx: ProduceContext, ident, assign, topic, partition, rest, who, reply) -> None:
    req = _produce_dec.decode(rest[1])
    if req.acks not in ACKS:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(ACKS_MESSAGE.format(req.acks)))
    actor = ctx.owned.actor_for(assign, topic, partition, reply, write=True)
    if actor is None:
        return
    acks = _acks_here(actor, req.acks)
    if acks < 0:
        return reply(P.ErrorCode.NOT_ENOUGH_REPLICAS, P.ErrorReply(_short_message(actor)))
    code, message, base, count, t = _store(ctx, actor, topic, rest[2], acks)
    if code != P.ErrorCode.OK:
        return reply(code, P.ErrorReply(message))
    hold_ms = 0
    if ctx.throttle is not None and message != "duplicate":  # a retry is not charged twice
        hold_ms = ctx.throttle.charge(who, quota.PRODUCE, len(rest[2]), time.monotonic())
    if acks == P.Acks.NONE:
        ctx.out.count(P.Op.PRODUCE, P.ErrorCode.OK)  # stored; nobody is answered (nor held)
    elif acks == P.Acks.MEMORY:
        head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
        ctx.out.count(P.Op.PRODUCE, P.ErrorCode.OK)
        ctx.out.send_after([*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], hold_ms)
    else:  # durable: once synced (here and on every in-sync follower when replicated); all: once the high watermark covers it
        head = P.pack_routing(P.Op.PRODUCE, partition, _request_id(rest[0]), topic)
        due = time.monotonic_ns() + hold_ms * 1_000_000 if hold_ms else 0
        waiting = (base + count, [*ident, head, P.encode(P.ProduceReply(base, count, t, hold_ms))], due)
        (actor.durable_waiters if acks == P.Acks.DURABLE else actor.hw_waiters).append(waiting)
        ctx.turn.waiting_slots.add(actor.slot)
        ctx.turn.durable_added |= acks == P.Acks.DURABLE


ACKS = (P.Acks.NONE, P.Acks.MEMORY, P.Acks.DURABLE, P.Acks.ALL)
ACKS_MESSAGE = "acks={} must be 0 (none), 1 (memory), 2 (durable) or 3 (all)"


def _acks_here(actor, acks: int) -> int:
    """The acks a batch gets at ``actor``: ``all`` is ``memory`` where the partition is not
    replicated (its leader is its whole ISR, Kafka's meaning); -1 when a replicated partition has
    fewer in-sync replicas than min.insync.replicas for an acks=all or durable batch."""
    repl = actor.repl
    if repl is None:
        return P.Acks.MEMORY if acks == P.Acks.ALL else acks
    if acks in (P.Acks.ALL, P.Acks.DURABLE) and repl.short():
        return -1
    return acks


def _short_message(actor) -> str:
    repl = actor.repl
    return (f"{len(repl.isr)} in-sync replicas ({repl.isr}) of {len(repl.replicas)}, fewer than min.insync.replicas="
            f"{repl.min_isr}: nothing stored (retriable once a follower is back in sync)")


def _store(ctx: ProduceContext, actor, topic: bytes, batch, acks: int):
    """Append one batch to ``actor``'s ring and account for it: (code, message, base, count,
    append time); the message is "duplicate" for a retried batch answered from before."""
    if ctx.header.storage_full and topic not in STATE_TOPICS:  # the flusher's disk guard (persistence/diskguard.py)
        return P.ErrorCode.STORAGE_FULL, STORAGE_FULL_MESSAGE, -1, 0, 0
    code, message, base, count, t = actor.append(batch, ctx.max_batch_bytes, in_order=acks != P.Acks.NONE)
    if code != P.ErrorCode.OK:
        if code == P.ErrorCode.BACKPRESSURE:
            ctx.turn.unkicked_bytes = KICK_MIN_BYTES  # a full ring: have the flusher drain it now
        return code, message, base, count, t
    _appended(ctx, actor, len(batch), count)
    return code, message, base, count, t


def _appended(ctx: ProduceContext, actor, size: int, count: int) -> None:
    """Account for ``size`` bytes of ``count`` records just appended to ``actor``'s ring: wake
    its readers, count its traffic, and note the bytes the flusher has not been told of."""
    turn, traffic, slot = ctx.turn, ctx.traffic, actor.slot
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
    if actor.repl is not None:  # an ISR of the leader alone: its high watermark follows its appends
        actor.publish_hw()


def replica_append(ctx: ProduceContext, ident, assign, topic, partition, rest, who, reply) -> None:
    """REPLICA_APPEND (router -> worker, a cluster's follower; router/replicas.py): the batches
    the partition's leader sent, appended as the leader stored them (``append_replica``); the
    reply says where this copy's log ends now and what of it is synced (an empty body only asks;
    with ``wait_sync`` it is answered once all of it is synced). With ``truncate_to`` the copy is
    first cut back there, or lower where its own batches of ``truncate_epoch`` end (actors/
    truncate.py): NOT_READY while the cut is in progress (ask again), OFFSET_OUT_OF_RANGE when it
    would go below the log start."""
    req = _replica_dec.decode(rest[1])
    actor = ctx.owned.actor_for(assign, topic, partition, reply)
    if actor is None:
        return
    actor.led_elsewhere = True  # until the router forwards a leader's request again: direct clients refused
    if actor.repl is not None:  # it led here, and follows now (or holds no replica: a reassignment moved it)
        stop_leading(ctx, actor)
    row = actor.owner_row
    if req.truncate_to >= 0:
        try:
            cut = truncate(actor, cut_target(actor, req.truncate_to, req.truncate_epoch))
        except OSError as exc:
            return reply(P.ErrorCode.NOT_READY, P.ErrorReply(f"the copy's epochs cannot be read: {exc}"))
        except ValueError as exc:
            return reply(P.ErrorCode.OFFSET_OUT_OF_RANGE, P.ErrorReply(str(exc), log_start_offset=row.log_start_offset,
                                                                       high_watermark=row.next_offset))
        if cut < 0:
            if actor.writer.fenced:
                return reply(P.ErrorCode.NOT_OWNER, P.ErrorReply("partition moved to another owner"))
            ctx.turn.durable_added = True  # the cut waits for the flusher to copy out and sync: kick it now
            return reply(P.ErrorCode.NOT_READY, P.ErrorReply(f"truncating to {req.truncate_to}"))
    before = row.next_offset
    body = rest[2]
    code, message = actor.append_replica(body, ctx.max_batch_bytes) if len(body) else (P.ErrorCode.OK, "")
    added = row.next_offset - before
    if added:
        _appended(ctx, actor, len(body), added)
        ctx.turn.durable_added = True  # a copy is synced at once: the leader's durable watermark waits on it
    if code != P.ErrorCode.OK:
        if code == P.ErrorCode.BACKPRESSURE:
            ctx.turn.unkicked_bytes = KICK_MIN_BYTES
        return reply(code, P.ErrorReply(message, log_start_offset=row.log_start_offset, high_watermark=row.next_offset))
    log_start, end, durable = actor.log.offsets()
    try:  # after an append, the last batch's epoch is the one it carried; else read from the log
        last = actor.leader_epoch if added else epochs.last_epoch(actor)
    except OSError as exc:
        return reply(P.ErrorCode.NOT_READY, P.ErrorReply(f"the copy's last batch cannot be read: {exc}"))
    if not req.wait_sync or durable >= end:
        return reply(P.ErrorCode.OK, P.ReplicaAppendReply(end, durable, log_start, req.leader_epoch, last))
    # asked to wait: answered as a durable ack is, once the flusher's sync covers the copy's end
    head = P.pack_routing(P.Op.REPLICA_APPEND, partition, _request_id(rest[0]), topic)
    actor.durable_waiters.append((end, [*ident, head, P.encode(P.ReplicaAppendReply(end, end, log_start, req.leader_epoch, last))], 0))
    ctx.turn.waiting_slots.add(actor.slot)
    ctx.turn.durable_added = True


def produce_multi(ctx: ProduceContext, ident, assign, topic, partition, rest, who, reply) -> None:
    """PRODUCE_MULTI: each batch frame to its partition, one reply with every partition's outcome
    (docs/PROTOCOL.md 4.1a). A partition's refusal (unknown, not hosted here, a full ring, storage
    full, a sequence error) is its own; a durable request is answered once the sync covers every
    batch of it that was stored."""
    req = _multi_dec.decode(rest[1])
    batches = rest[2:]
    parts = req.partitions
    if req.acks not in ACKS:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(ACKS_MESSAGE.format(req.acks)))
    if len(parts) != len(batches):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"header lists {len(parts)} partitions for {len(batches)} batch frames: one batch frame per partition"))
    if len(set(parts)) != len(parts):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("a partition is listed twice: one batch per partition"))
    if assign is not None and len(assign) != P.ASSIGN.size * len(parts):
        return reply(P.ErrorCode.MALFORMED, P.ErrorReply("bad assignment frame"))
    results = []
    stored = 0  # bytes stored, not retries: what a quota charges
    durable = []  # (actor, end offset, index in results)
    owned = ctx.owned
    for i, p in enumerate(parts):
        said = []
        one_assign = None
        if assign is not None:
            one_assign = assign[i * P.ASSIGN.size:(i + 1) * P.ASSIGN.size]
            slot, epoch = P.ASSIGN.unpack(one_assign)
            if slot == P.NO_SLOT:  # the router's word: not this worker's (or not a partition at all)
                results.append(P.PartitionOutcome(p, epoch, message=_NOT_ROUTED.get(epoch, "not routed to this worker")))
                continue
        actor = owned.actor_for(one_assign, topic, p, lambda code, body=None: said.append((code, body)), write=True)
        if actor is None:
            code, body = said[0]
            results.append(P.PartitionOutcome(p, code, message=body.message if body is not None else ""))
            continue
        acks = _acks_here(actor, req.acks)
        if acks < 0:
            results.append(P.PartitionOutcome(p, P.ErrorCode.NOT_ENOUGH_REPLICAS, message=_short_message(actor)))
            continue
        code, message, base, count, t = _store(ctx, actor, topic, batches[i], acks)
        if code != P.ErrorCode.OK:
            results.append(P.PartitionOutcome(p, code, message=message))
            continue
        if message != "duplicate":
            stored += len(batches[i])
        results.append(P.PartitionOutcome(p, P.ErrorCode.OK, base, count, t))
        if acks in (P.Acks.DURABLE, P.Acks.ALL):
            durable.append((actor, base + count, i, acks))
    hold_ms = 0
    if ctx.throttle is not None and stored:
        hold_ms = ctx.throttle.charge(who, quota.PRODUCE, stored, time.monotonic())
    out = ctx.out
    if req.acks == P.Acks.NONE:
        out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)  # stored what it could; nobody is answered
        return
    head = P.pack_routing(P.Op.PRODUCE_MULTI, partition, _request_id(rest[0]), topic)
    if not durable:
        out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)
        out.send_after([*ident, head, P.encode(P.ProduceMultiReply(results, hold_ms))], hold_ms)
        return
    due = time.monotonic_ns() + hold_ms * 1_000_000 if hold_ms else 0
    pending = MultiAck([*ident, head], results, len(durable), hold_ms)
    turn, live = ctx.turn, owned.actors
    for actor, end, i, acks in durable:
        part = MultiPart(pending, i)
        if live.get(actor.slot) is not actor:  # let go by a later partition's adoption (its topic deleted)
            frames = part.settle(P.ErrorCode.UNKNOWN_TOPIC, "batch not durable: its topic was deleted")
            if frames is not None:
                out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)
                out.port.send(frames)
            continue
        (actor.durable_waiters if acks == P.Acks.DURABLE else actor.hw_waiters).append((end, part, due))
        turn.waiting_slots.add(actor.slot)
        turn.durable_added |= acks == P.Acks.DURABLE


_NOT_ROUTED = {P.ErrorCode.UNKNOWN_PARTITION: "unknown partition",
               P.ErrorCode.NOT_OWNER: "another worker owns this partition: send its batch in a request to that worker",
               P.ErrorCode.NOT_LEADER_OR_FOLLOWER: "this broker does not lead this partition: describe the topic for its leader"}


class MultiAck:
    """A durable PRODUCE_MULTI's reply while its batches wait for the sync: sent when the last
    of them is settled (synced, or failed: its outcome's code says so)."""

    __slots__ = ("prefix", "results", "waiting", "hold_ms")

    def __init__(self, prefix: list, results: list, waiting: int, hold_ms: int):
        self.prefix, self.results, self.waiting, self.hold_ms = prefix, results, waiting, hold_ms


class MultiPart:
    """One partition's place in a ``MultiAck``: what a durable waiter holds in place of reply
    frames (``release_durable``, ``Owned.drop_actor``)."""

    __slots__ = ("ack", "index")

    def __init__(self, ack: MultiAck, index: int):
        self.ack, self.index = ack, index

    def settle(self, code: int = P.ErrorCode.OK, message: str = "") -> list | None:
        """This partition is synced (or failed with ``code``): the reply's frames once it was
        the last one waiting, else None."""
        ack = self.ack
        if code != P.ErrorCode.OK:
            r = ack.results[self.index]
            r.code, r.base_offset, r.record_count, r.message = code, -1, 0, message
        ack.waiting -= 1
        if ack.waiting:
            return None
        return [*ack.prefix, P.encode(P.ProduceMultiReply(ack.results, ack.hold_ms))]


def release_durable(ctx: ProduceContext) -> None:
    """Answer the durable waiters the row's ``durable_offset`` now covers (on a replicated
    partition: synced here and on every in-sync follower), and the acks=all waiters
    its high watermark covers; once the journal failed, every durable waiter (STORAGE_UNAVAILABLE
    for those not synced)."""
    actors, waiting = ctx.owned.actors, ctx.turn.waiting_slots
    done = []
    for slot in waiting:
        actor = actors.get(slot)
        if actor is None:
            done.append(slot)
            continue
        durable = actor.log.durable_watermark
        repl = actor.repl
        if repl is not None and repl.shrunk is not None:
            hw, durable_hw = repl.shrunk
            repl.shrunk = None
            _release(ctx, actor.hw_waiters, hw, False)  # what the old ISR held: acknowledged
            _release(ctx, actor.durable_waiters, durable_hw, False)
            if repl.short():  # the rest: stored here, not replicated enough (retriable; a retry is deduplicated)
                fail_waiters(ctx, actor, P.ErrorCode.NOT_ENOUGH_REPLICAS, "the ISR fell below min.insync.replicas "
                             "before this batch was replicated: stored on the leader, not acknowledged (retry)")
        if repl is not None:
            durable = repl.durable_hw_at(durable)
            if actor.hw_waiters:
                _release(ctx, actor.hw_waiters, actor.watermark("memory"), False)
        if actor.durable_waiters:
            _release(ctx, actor.durable_waiters, durable, actor.owner_row.io_error)
        if not actor.durable_waiters and not actor.hw_waiters:
            done.append(slot)
    waiting.difference_update(done)


def _release(ctx: ProduceContext, q, mark: int, failed: bool) -> None:
    """Answer the waiters of ``q`` whose end ``mark`` covers (all of them once ``failed``)."""
    out = ctx.out
    while q and (q[0][0] <= mark or failed):
        end, frames, due = q.popleft()
        if type(frames) is MultiPart:  # one partition of a PRODUCE_MULTI: its reply waits for the last
            frames = (frames.settle() if end <= mark else
                      frames.settle(P.ErrorCode.STORAGE_UNAVAILABLE, "journal cannot be written; batch not durable"))
            if frames is None:
                continue
            out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)
            if due:
                out.hold_until(due, frames)
            else:
                out.port.send(frames)
            continue
        if end > mark:  # storage failed before this batch was synced
            frames = frames[:-2] + [with_code(frames[-2], P.ErrorCode.STORAGE_UNAVAILABLE),
                                    P.encode(P.ErrorReply("journal cannot be written; batch not durable"))]
            out.count(frames[-2][1], P.ErrorCode.STORAGE_UNAVAILABLE)  # the routing header's op: PRODUCE, REPLICA_APPEND
            out.port.send(frames)
            continue
        out.count(frames[-2][1], P.ErrorCode.OK)
        if due:  # held by a quota: until ``due``, if the sync came sooner
            out.hold_until(due, frames)
        else:
            out.port.send(frames)


def stop_leading(ctx: ProduceContext, actor) -> None:
    """The partition's leadership here is over: it follows another broker now, or a reassignment
    took it off this broker (router/replicas.py ``_stand_down``). Without ``repl`` its watermark is
    the log end, which may hold records the ISR never had (the high watermark was the ISR's least
    end), so nothing waiting here may be answered by it: produce waiters, parked FETCHes and this
    partition's part of parked FETCH_MULTIs are answered NOT_LEADER_OR_FOLLOWER first (found
    moving a partition under load: a parked read served the old leader's unreplicated tail), and
    their clients describe the topic again and go to the new leader."""
    code, why = P.ErrorCode.NOT_LEADER_OR_FOLLOWER, "this broker no longer leads the partition"
    fail_waiters(ctx, actor, code, why)
    for _deadline, ident, routing, _req, _who in actor.parked:
        ctx.out.count(P.Op.FETCH, code)
        ctx.out.port.send([*ident, with_code(routing, code), P.encode(P.ErrorReply(why))])
    actor.parked = []
    for m in (ctx.fetches.waits if ctx.fetches is not None else ()):
        if actor.slot in m.slots:  # answered at its deadline or with its other partitions' data
            m.slots.discard(actor.slot)
            m.targets = [(p, None, o, P.PartitionFetch(p, code, message=why)) if a is actor else (p, a, o, r)
                         for p, a, o, r in m.targets]
    actor.repl = None
    actor.publish_hw()


def fail_waiters(ctx: ProduceContext, actor, code: int, message: str) -> None:
    """Answer every waiter of ``actor`` with ``code``: it stopped leading (a follower now)."""
    for q in (actor.hw_waiters, actor.durable_waiters):
        while q:
            _end, frames, _due = q.popleft()
            if type(frames) is MultiPart:
                frames = frames.settle(code, message)
                if frames is not None:
                    ctx.out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)
                    ctx.out.port.send(frames)
                continue
            ctx.out.count(P.Op.PRODUCE, code)
            ctx.out.port.send(frames[:-2] + [with_code(frames[-2], code), P.encode(P.ErrorReply(message))])


def _request_id(routing: bytes) -> int:
    return P.ROUTING.unpack_from(routing)[4]
