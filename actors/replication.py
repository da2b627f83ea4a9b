"""A replicated partition's leader (issue 34): who its followers are, how far each has copied,
the high watermark that follows from it, and the ISR it wants.

The router tells the partition's worker, before any request it forwards to it, that this broker
leads a partition of several replicas, with its leader epoch, replicas, ISR and
``min.insync.replicas`` (LEADER_AND_ISR, Kafka's LeaderAndIsr; again on every change). From
then on the actor has a ``Replication``:

- **Followers report** in each FETCH they send (``replica``: their broker id, ``offset``: where
  their log ends, ``replica_durable``: what they have synced); a follower is *caught up* when it
  asks from the leader's log end, or (Kafka's rule) as of its previous fetch when it now holds
  everything the leader held then.
- **High watermark** = the least log end over the in-sync replicas (the leader's own included),
  never lower than it was: what every ISR member holds. Consumers read up to it (memory
  isolation); acks=all is answered once it covers the batch. **Durable high watermark** = the
  least synced end over the ISR: what durable-isolation consumers read up to, and what acks=durable
  waits for: synced on the leader and on every in-sync follower (at least min.insync.replicas - 1
  of them, else refused), since a new leader may be any ISR member.
  Both count the union of the ISR and the one proposed while a change is pending (a joining
  follower counts from the moment it is proposed, a leaving one until etcd has it).
- **ISR** (``wanted_isr``, asked on every PING): the leader, and every follower that has been
  caught up within ``replica.lag.time.max.ms`` (a follower in the ISR when the leader learned it
  gets that long from then). The router writes a changed ISR to etcd (compare-and-swap, the
  leader's epoch compared) and tells the worker the result as a new LEADER_AND_ISR.

Single writer: only the worker's loop thread touches it. Not persisted: a restarted leader starts
from the log start and the followers' next fetches raise it again (a consumer asking past it
meanwhile gets nothing yet, never OFFSET_OUT_OF_RANGE below the log end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tailrace.broker import acl
from tailrace.client import ops
from tailrace.client import protocol as P

from . import epochs
from .adopt import Owned
from .context import Turn

_leader_dec = ops.DECODERS[P.Op.LEADER_AND_ISR]


class Replication:
    __slots__ = ("me", "leader_epoch", "replicas", "isr", "min_isr", "lag_ns", "ends", "durables", "caught_up",
                 "last_fetch", "proposed", "epoch_ends", "shrunk", "_hw", "_durable_hw")

    def __init__(self, req: P.LeaderAndIsrRequest, log_start: int, now_ns: int):
        self.ends: dict[int, int] = {}  # follower -> where its log ended at its last fetch
        self.durables: dict[int, int] = {}  # follower -> what it had synced then
        self.caught_up: dict[int, int] = {}  # follower -> monotonic ns it last held all we held (see ``fetched``)
        self.last_fetch: dict[int, tuple[int, int]] = {}  # follower -> (our log end, monotonic ns) at its last fetch
        self.proposed: list[int] | None = None  # the ISR asked for and not yet confirmed
        self.epoch_ends: dict[int, tuple[int, int]] = {}  # an earlier epoch -> epochs.end_of_epoch of it here
        # the watermarks as they were when the ISR fell below min.insync.replicas (taken by
        # actors/produce.py release_durable: waiters past them are refused, not acknowledged)
        self.shrunk: tuple[int, int] | None = None
        self._hw = self._durable_hw = log_start
        self.isr: list[int] = []
        self.update(req, now_ns)

    def update(self, req: P.LeaderAndIsrRequest, now_ns: int) -> None:
        if getattr(self, "leader_epoch", req.leader_epoch) != req.leader_epoch:
            # led again at a later epoch: what followers said before is of another epoch's logs
            for d in (self.ends, self.durables, self.caught_up, self.last_fetch, self.epoch_ends):
                d.clear()
        was_short = bool(self.isr) and self.short()
        self.me, self.leader_epoch = req.leader, req.leader_epoch
        self.replicas = list(req.replicas)
        joined = [b for b in req.isr if b not in self.isr]
        left = [b for b in self.isr if b not in req.isr and b != req.leader]
        self.isr = list(req.isr) if req.leader in req.isr else [req.leader, *req.isr]
        self.min_isr = max(1, req.min_isr)
        self.lag_ns = max(1, req.lag_ms) * 1_000_000
        for b in joined:  # in the ISR as told: it has the lag time from now to show it keeps up
            self.caught_up[b] = max(self.caught_up.get(b, 0), now_ns)
        for b in left:  # taken out (its broker is gone: the controller): back only once it has caught up again
            self.caught_up.pop(b, None)
            self.last_fetch.pop(b, None)
        if self.proposed is not None and sorted(self.proposed) == sorted(self.isr):
            self.proposed = None
        if self.short() and not was_short and self.shrunk is None:
            # Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: what waits for replication now would be
            # "covered" by an ISR too small to count; only what the old ISR held is acknowledged
            self.shrunk = (self._hw, self._durable_hw)

    def counted(self) -> set[int]:
        """The followers the watermarks wait for: the ISR's, with the proposed ISR's while pending."""
        out = set(self.isr)
        if self.proposed is not None:
            out.update(self.proposed)
        out.discard(self.me)
        return out

    def short(self) -> bool:
        """Fewer in-sync replicas than min.insync.replicas: acks=all and durable are refused."""
        return len(self.isr) < self.min_isr

    def hw_at(self, log_end: int) -> int:
        """The high watermark, given the leader's own log end."""
        self._hw = max(self._hw, self._least(self.ends, log_end))
        return self._hw

    def durable_hw_at(self, own_durable: int) -> int:
        """The durable high watermark, given what the leader itself has synced."""
        self._durable_hw = max(self._durable_hw, self._least(self.durables, own_durable))
        return self._durable_hw

    def _least(self, by_follower: dict[int, int], own: int) -> int:
        """The least of ``own`` and each counted follower's value (-1 for one not heard from)."""
        counted = self.counted()
        return min(own, *(by_follower.get(b, -1) for b in counted)) if counted else own

    def fetched(self, broker: int, offset: int, durable: int, log_end: int, now_ns: int) -> bool:
        """A follower's FETCH: where it ends and what it synced. False if it is no replica of ours."""
        if broker == self.me or broker not in self.replicas:
            return False
        self.ends[broker] = offset
        self.durables[broker] = min(durable, offset) if durable >= 0 else -1
        # Kafka's rule: caught up now if it asks from our log end; else caught up as of its last
        # fetch if it holds everything we held then (under steady load it is rarely exactly at the end)
        last = self.last_fetch.get(broker)
        if offset >= log_end:
            self.caught_up[broker] = now_ns
        elif last is not None and offset >= last[0]:
            self.caught_up[broker] = max(self.caught_up.get(broker, 0), last[1])
        self.last_fetch[broker] = (log_end, now_ns)
        return True

    def wanted_isr(self, now_ns: int) -> list[int] | None:
        """The ISR this leader wants now (replicas order), or None if it is the current one."""
        want = [b for b in self.replicas if b == self.me or now_ns - self.caught_up.get(b, -self.lag_ns) <= self.lag_ns]
        if self.me not in want:
            want.insert(0, self.me)
        if sorted(want) == sorted(self.isr):
            self.proposed = None
            return None
        self.proposed = want
        return want


@dataclass(slots=True)
class ReplicationContext:
    owned: Owned
    turn: Turn


def leader_and_isr(ctx: ReplicationContext, ident, assign, topic, partition, rest, who, reply) -> None:
    """LEADER_AND_ISR (router -> worker): this broker leads the partition, with these followers."""
    req = _leader_dec.decode(rest[1])
    actor = ctx.owned.actor_for(assign, topic, partition, reply)
    if actor is None:
        return
    now = time.monotonic_ns()
    if actor.repl is None:
        actor.repl = Replication(req, actor.owner_row.log_start_offset, now)
    else:
        actor.repl.update(req, now)
    actor.leader_epoch = req.leader_epoch  # stamped into every batch it appends from now
    moved(ctx.turn, actor)  # an ISR that shrank may let the watermarks move
    actor.publish_hw()
    reply(P.ErrorCode.OK, P.Empty())


def moved(turn: Turn, actor) -> None:
    """The watermarks of ``actor`` may have moved: look at its parked fetches and its waiters."""
    turn.appended.add(actor.slot)
    if actor.durable_waiters or actor.hw_waiters:
        turn.waiting_slots.add(actor.slot)


def follower_fetch(turn: Turn, actor, req: P.FetchRequest, who: str | None) -> tuple | None:
    """A follower's FETCH at the leader: check it, and take its position (the watermarks may
    move). None to go on and read, or (code, reply body) to answer at once: refused (under
    --auth curve only brokers fetch as a replica; a follower of another leader epoch), or a copy
    that diverged from this log, told where it stops agreeing (``diverging``)."""
    if who is not None and not acl.is_broker(who):
        return P.ErrorCode.NOT_AUTHORIZED, P.ErrorReply(f"principal {who!r} is not a broker: only brokers fetch as a replica")
    repl = actor.repl
    if repl is None:
        return None
    if req.leader_epoch >= 0 and req.leader_epoch != repl.leader_epoch:
        return P.ErrorCode.NOT_LEADER_OR_FOLLOWER, P.ErrorReply(
            f"follower at leader epoch {req.leader_epoch}, this leader at {repl.leader_epoch}")
    cut = diverging(actor, repl, req.last_epoch, req.offset)
    if cut is not None:  # its position is not counted: its log is not a prefix of ours
        row = actor.owner_row
        return P.ErrorCode.OK, P.FetchReply(high_watermark=actor.watermark("memory"),
                                            durable_watermark=actor.watermark("durable"),
                                            log_start_offset=row.log_start_offset, next_offset=req.offset,
                                            diverging_epoch=cut[0], diverging_end=cut[1])
    if repl.fetched(req.replica, req.offset, req.replica_durable, actor.owner_row.next_offset, time.monotonic_ns()):
        moved(turn, actor)
        actor.publish_hw()
    return None


def diverging(actor, repl: Replication, last_epoch: int, offset: int) -> tuple[int, int] | None:
    """None if a copy ending at ``offset`` with a last batch of ``last_epoch`` is a prefix of this
    log; else (the largest epoch at or below ``last_epoch`` this log holds, where it ends here):
    KIP-320's diverging epoch. Answers for epochs below the leader's own are kept (they cannot
    change while it leads)."""
    if last_epoch < 0 or offset <= actor.owner_row.log_start_offset:
        return None  # an empty copy (or none of it left here to compare): nothing to cut
    if last_epoch == repl.leader_epoch:
        return None if offset <= actor.owner_row.next_offset else (last_epoch, actor.owner_row.next_offset)
    found = repl.epoch_ends.get(last_epoch)
    if found is None:
        try:
            found = epochs.end_of_epoch(actor, last_epoch)
        except OSError:
            return None  # expired under the search (retention): the next fetch asks again
        if last_epoch < repl.leader_epoch:
            repl.epoch_ends[last_epoch] = found
    epoch, end = found
    return None if epoch == last_epoch and offset <= end else found
