"""Which partitions this worker hosts: adopting one (ADOPT, or the first request the router
assigns), finding the actor a request is for, and letting actors go (fenced, or their topic
deleted).

An assignment comes from the router (``[slot u32, owner epoch u64]``, docs/PROTOCOL.md): an
actor of a lower epoch is re-confirmed (``reassign``), a higher one refuses it (NOT_OWNER, a
stale assignment). A client addressing the worker directly names a topic and partition, served
only if this worker already hosts it.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from tailrace.broker import record_policy
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.client import protocol as P
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.retention import crash_point
from tailrace.shm.layout import C_OWNER_EPOCH
from tailrace.shm.ring import ControlTable

from .context import Outbox, Traffic, Turn
from .keeper import RingKeeper
from .partition import Fenced, PartitionActor

log = logging.getLogger("tailrace.worker")


class Owned:
    """The partition actors of one worker and what making or dropping one needs: the control
    table, the catalog, the settings, the shared journal reader; and, to answer the requests an
    actor let go still holds, the outbox and the turn's waiting sets."""

    def __init__(self, s: settings_mod.Settings, worker_id: int, table: ControlTable, catalog: Catalog,
                 journal: JournalReader, out: Outbox, turn: Turn, traffic: Traffic):
        self.s, self.worker_id, self.table, self.catalog, self.journal = s, worker_id, table, catalog, journal
        self.out, self.turn, self.traffic = out, turn, traffic
        self.actors: dict[int, PartitionActor] = {}  # slot -> actor
        self.adopted_new = False  # an actor was made here: tell the flusher (kick KICK_ADOPTED) to rescan its rows
        self._fences = None  # (slots, epochs) of the actors as numpy arrays (check_fences); None: remake
        self.unlocked: set[int] = set()  # slots whose actor does not hold its owner lock (yet)
        # what the rings hold and giving back what is cold: this worker's share of the budget (actors/keeper.py)
        self.keeper = RingKeeper(s.shm_budget_bytes // max(1, s.workers), s.ring_idle_ms / 1000, s.ring_warm_bytes,
                                 crash=(lambda step: crash_point(s, step)) if s.debug_crash_at.startswith("ring_") else None)

    def actor_for(self, assign: bytes | None, topic: bytes, partition: int, reply, write: bool = False):
        """The actor for this request, adopting the partition if the router says we own it. A
        direct ``write`` (a client's produce, not the router's) to a partition another broker
        leads now is refused NOT_LEADER_OR_FOLLOWER: a client's route to this worker may be older
        than the leader change, and a copy that no longer leads would take and acknowledge what
        no replica of the ISR holds (reads of it are left alone: tests and tools read a follower's
        copy there, and the router path is what clients are sent back to)."""
        if assign is not None:
            if len(assign) != P.ASSIGN.size:
                reply(P.ErrorCode.MALFORMED, P.ErrorReply("bad assignment frame"))
                return None
            slot, epoch = P.ASSIGN.unpack(assign)
            if epoch >= 1 << 63:  # the control row holds epochs as int64
                reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"owner epoch {epoch} out of range"))
                return None
            actor = self.actors.get(slot)
            if actor is not None and actor.epoch > epoch:
                reply(P.ErrorCode.NOT_OWNER, P.ErrorReply(f"stale assignment: epoch {epoch} < {actor.epoch}"))
                return None
            if actor is None or actor.epoch != epoch:
                actor = self.adopt(slot, epoch, reply)
            if actor is not None:  # the router's word: this broker serves it (a REPLICA_APPEND says otherwise again)
                actor.led_elsewhere = False
            return actor
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
        if write and actor.led_elsewhere:  # a direct client with a stale route (cluster)
            reply(P.ErrorCode.NOT_LEADER_OR_FOLLOWER, P.ErrorReply(
                f"this broker does not lead topic={name!r} partition={partition}: describe the topic for its leader"))
            return None
        return actor

    def adopt(self, slot: int, epoch: int, reply):
        self.check_catalog()  # one stat: the slot may belong to another topic since (a deleted one's, reused)
        actor = self.actors.get(slot)
        try:
            if actor is not None:
                actor.reassign(epoch)  # same process: keep the lock, the ring, the waiters
                self._fences = None
                return actor
            found = self.catalog.by_slot.get(slot)
            if found is None:
                reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"slot {slot} is no partition's (its topic was deleted)"))
                return None
            topic, partition = found
            s = self.s
            actor = PartitionActor(self.table, s.instance, slot, topic.topic_id, partition,
                                   topic.ring_bytes, epoch, s.data_dir, self.journal, s.ipc_path())
            actor.policy = record_policy.policy_of(topic.config)
        except Fenced as exc:
            reply(P.ErrorCode.NOT_OWNER, P.ErrorReply(str(exc)))
            return None
        self.actors[slot] = actor
        self._fences = None
        if not actor.lock.held:
            self.unlocked.add(slot)
        self.keeper.add(slot, actor.writer, time.monotonic())
        self.adopted_new = True
        return actor

    def check_catalog(self) -> None:
        """Re-read the catalog if it changed, apply changed record settings (ALTER_CONFIGS), and
        let go of the actors of deleted topics: their
        waiting requests are answered UNKNOWN_TOPIC (a durable produce not yet synced was not
        stored for good), and later ones get it from the catalog."""
        if not self.catalog.reload():
            return
        for slot, actor in list(self.actors.items()):
            found = self.catalog.by_slot.get(slot)
            if found is None or found[0].topic_id != actor.topic_id:
                self.drop_actor(slot, "its topic was deleted")
            else:
                actor.policy = record_policy.policy_of(found[0].config)  # compression.type, timestamp type...

    def drop_actor(self, slot: int, why: str) -> None:
        actor = self.actors.pop(slot)
        self._fences = None
        self.keeper.forget(slot)
        out, code = self.out, P.ErrorCode.UNKNOWN_TOPIC
        for _end, frames, _due in (*actor.durable_waiters, *actor.hw_waiters):
            if not isinstance(frames, list):  # one partition of a PRODUCE_MULTI (actors/produce.py MultiPart)
                frames = frames.settle(code, f"batch not durable: {why}")
                if frames is not None:
                    out.count(P.Op.PRODUCE_MULTI, P.ErrorCode.OK)
                    out.port.send(frames)
                continue
            out.count(P.Op.PRODUCE, code)
            out.port.send([*frames[:-2], with_code(frames[-2], code), P.encode(P.ErrorReply(f"batch not durable: {why}"))])
        for _deadline, ident, routing, _req, _who in actor.parked:
            out.count(P.Op.FETCH, code)
            out.port.send([*ident, with_code(routing, code), P.encode(P.ErrorReply(why))])
        actor.durable_waiters.clear()
        actor.hw_waiters.clear()
        actor.parked = []
        self.turn.parked_slots.discard(slot)
        self.turn.waiting_slots.discard(slot)
        self.traffic.fetched.pop(slot, None)
        actor.close()
        log.info("slot %d let go: %s", slot, why)

    def check_fences(self) -> None:
        """Let go of partitions another owner has fenced us out of (also when idle). Looks at
        the actors whose row's owner epoch is not theirs, or that wait for their lock: one numpy
        compare over the owned rows finds them (a Python look at each of 5,000 actors every
        50 ms was a third of an idle worker's time)."""
        if self._fences is None:
            n = len(self.actors)
            self._fences = (np.fromiter(self.actors, dtype=np.int64, count=n),
                            np.fromiter((a.epoch for a in self.actors.values()), dtype=np.int64, count=n))
        slots, epochs = self._fences
        look = set(slots[self.table.rows[slots, C_OWNER_EPOCH] != epochs].tolist())
        look |= self.unlocked
        for slot in look:
            actor = self.actors.get(slot)
            if actor is None:
                self.unlocked.discard(slot)
                continue
            if actor.check_ownership():
                self.unlocked.discard(slot)
            elif actor.writer.fenced and not actor.durable_waiters and not actor.hw_waiters and not actor.parked:
                actor.close()
                del self.actors[slot]
                self._fences = None
                self.unlocked.discard(slot)
                self.keeper.forget(slot)
            else:
                self.unlocked.add(slot)

    def close(self) -> None:
        for actor in self.actors.values():
            actor.close()


def adopt(owned: Owned, ident, assign, topic, partition, rest, who, reply) -> None:
    """ADOPT (internal, router -> worker): host the assigned partition now, ahead of traffic."""
    if owned.actor_for(assign, topic, partition, reply) is not None:
        reply(P.ErrorCode.OK)


def with_code(routing: bytes, code: int) -> bytes:
    """A routing header with its code replaced (a reply built earlier, answered otherwise)."""
    v, op, _c, partition, rid = P.ROUTING.unpack_from(routing)
    return P.ROUTING.pack(v, op, code, partition, rid) + routing[P.ROUTING_BYTES:]
