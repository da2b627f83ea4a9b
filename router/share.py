"""Share groups: queue semantics on the log, coordinated in the router (docs/DESIGN.md "Share groups").

Kafka's share groups (KIP-932) in tailrace's shape. Any number of members read the same
partitions; each ``SHARE_FETCH`` acknowledges what the member finished (ranges: ACCEPT, RELEASE,
REJECT) and *acquires* records for the group's lock duration, so no other member gets them
meanwhile. A lock that ends, a member that leaves or goes silent, and a RELEASE give records
back (a RELEASE after the group's backoff for the record's delivery count, RocketMQ's retry
levels, unless it names its own delay); a record delivered ``share.delivery.count.limit`` times
and still not accepted, or REJECTed, goes to the group's dead-letter topic (``<group>.dlq`` by
default, made at its first record) with its provenance in headers, or is archived when the group
has none.

**State.** Each share partition is a window of numpy arrays (router/share_state.py). The
coordinator reads the log through the partition's owner like any consumer (one read in flight
per share partition, long-polled) and keeps the window's batches, so a redelivery and a dead
letter come from memory. **Durability**: every change an acknowledgement makes is written to
``__share_group_state`` (a snapshot record per share partition changed, zstd-compressed, one
produce per group per router loop for every request in it: ``flush``, ``acks=durable``) before the request is answered: an ACCEPT answered is
never lost. Acquisitions are not written; a restart makes what was acquired available again
(delivery counts as last written): at least once, and the duplicate window is the records
acquired but not yet acknowledged when the broker stopped. At start the topic is read back,
keeping the last record per share partition; the window's bytes are read again from the log.
Every share partition is written again every ``REFRESH_S`` and the topic keeps ``KEEP_S``.

In a cluster (``--cluster``) each broker is the share-partition leader of the partitions it
leads: router/share_cluster.py copies its state to the other brokers and takes theirs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import msgspec
import numpy as np

from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import SHARE_STATE_TOPIC, Catalog
from tailrace.client import protocol as P
from tailrace.client import share_protocol as S
from tailrace.client.views import iter_batches

from .readback import ReadBack
from .share_state import (ARCHIVE, DEFAULT_BACKOFF_MS, SharePartition, SnapshotRecord, check_config, encode_snapshots, ranges,
                          split_batches)

log = logging.getLogger("tailrace.router")

RETRY_S = 2.0  # an internal read or write unanswered this long is sent again
READ_BYTES = 4 << 20  # one read of a share partition's log, at most
READ_WAIT_MS = 500  # a read that finds nothing waits this long at the owner for records (a long poll)
DLQ_CHUNK = 500  # dead records sent to the dead-letter topic in one produce, at most
REFRESH_S = 600.0  # every share partition's snapshot is written again this often...
KEEP_S = 1800.0  # ...and __share_group_state keeps records this long: a start reads at most that
LATEST = 1 << 62  # a read there is out of range, and the error names the log's end

_error_reply = P.decoder(P.ErrorReply)
_snapshot = P.decoder(SnapshotRecord)
_DECODE = {S.ShareFetchRequest: P.decoder(S.ShareFetchRequest), S.AlterShareGroupRequest: P.decoder(S.AlterShareGroupRequest)}


def _tid(entry) -> int:
    """A topic's id as share state keeps it: the cluster's for a cluster topic (the same on
    every broker), else this broker's catalog id."""
    return entry.cluster_id or entry.topic_id


def _same_topic(sp: SharePartition, entry) -> bool:
    """Whether share state is of the topic as it is now, not of one deleted and made again under
    its name. State begun under this broker's own id, before the cluster's id for the topic
    reached the catalog (the controller makes a topic a moment before its watch brings the id),
    takes the cluster's."""
    if entry.cluster_id and sp.topic_id == entry.topic_id:
        sp.topic_id = entry.cluster_id
    return not sp.topic_id or sp.topic_id == _tid(entry)


@dataclass
class ShareContext:
    """What the share coordinator may read and do at the router."""

    s: settings_mod.Settings
    catalog: Catalog
    make_internal_topic: Callable  # (name, partitions, config) -> entry or None (router/server.py)
    next_internal_id: Callable[[], int]
    send_internal: Callable  # (topic, partition, frames) -> False if the partition has no owner
    send_client: Callable  # (frames): a reply to a client, identity first
    acls: object | None = None  # with --auth curve: broker/acl.py Acls
    cluster: object | None = None


class Member:
    __slots__ = ("id", "index", "topics", "last_seen")

    def __init__(self, member_id: str, index: int, now: float):
        self.id, self.index, self.topics, self.last_seen = member_id, index, [], now


class ShareGroup:
    def __init__(self, name: str, s: settings_mod.Settings):
        self.name, self.s = name, s
        self.config: dict[str, str] = {}  # what was set; defaults filled in by ``settings``
        self.members: dict[str, Member] = {}
        self.next_index = 0
        self.parts: dict[tuple[str, int], SharePartition] = {}
        self.rotor = 0  # where the next fetch starts among the partitions (fairness)
        self.delivered = 0
        self.awaiting: list = []  # (request, reply frames) answered once the next write is durable
        self.config_written_at = 0.0
        self.config_version = 0  # the settings' count of writes (a cluster keeps the highest)
        self.refresh_settings()

    def settings(self) -> dict[str, str]:
        s = self.s
        return {"share.record.lock.duration.ms": str(s.share_record_lock_duration_ms),
                "share.delivery.count.limit": str(s.share_delivery_count_limit),
                "share.retry.backoff.ms": DEFAULT_BACKOFF_MS, "share.dlq.topic": f"{self.name}.dlq",
                "share.auto.offset.reset": "latest", "share.session.timeout.ms": str(s.share_session_timeout_ms),
                **self.config}

    def refresh_settings(self) -> None:
        c = self.settings()
        self.lock_s = int(c["share.record.lock.duration.ms"]) / 1000
        self.limit = int(c["share.delivery.count.limit"])
        self.backoff_s = [int(x) / 1000 for x in c["share.retry.backoff.ms"].split(",")]
        self.dlq = "" if c["share.dlq.topic"] == ARCHIVE else c["share.dlq.topic"]
        self.earliest = c["share.auto.offset.reset"] == "earliest"
        self.session_s = int(c["share.session.timeout.ms"]) / 1000

    def member(self, member_id: str, now: float) -> Member:
        m = self.members.get(member_id)
        if m is None:
            m = self.members[member_id] = Member(member_id, self.next_index, now)
            self.next_index += 1
        m.last_seen = now
        return m


class Waiter:
    """A SHARE_FETCH waiting for records (parked), or any share request being answered."""

    __slots__ = ("req", "group", "member", "body", "outcomes", "deadline", "wrote")

    def __init__(self, req, group: ShareGroup, member: Member, body: S.ShareFetchRequest, outcomes: list, deadline: float):
        self.req, self.group, self.member, self.body, self.outcomes, self.deadline = req, group, member, body, outcomes, deadline
        self.wrote = False  # an acknowledgement changed state: answered once that is durable


class ShareCoordinator:
    """The share groups of one router: ``serve`` takes the share ops, ``on_reply`` the owners'
    answers to its reads and writes, ``poll`` (every loop) answers waiters whose wait ended,
    ``tick`` (every heartbeat) ends locks and sessions, writes dead letters and snapshots."""

    def __init__(self, ctx: ShareContext):
        self.ctx = ctx
        self.groups: dict[str, ShareGroup] = {}
        self.pending: dict[int, list] = {}  # rid -> [kind, sent, ...]
        self.parked: list[Waiter] = []
        self.write_due: dict[str, ShareGroup] = {}  # groups with requests waiting for a write (``flush``)
        self.loaded = ctx.catalog.get(SHARE_STATE_TOPIC) is None
        self.cl = None  # --cluster: router/share_cluster.py ShareCluster
        self.back = ReadBack(SHARE_STATE_TOPIC, ctx.next_internal_id, ctx.send_internal)  # at start (router/readback.py)

    def attach_cluster(self, agent, peers, mirror) -> None:
        from .share_cluster import ShareCluster  # a cluster only

        self.ctx.cluster = agent
        self.cl = ShareCluster(self, agent, peers, mirror)

    def _leads(self, topic: str, partition: int) -> bool:
        return self.cl is None or self.cl.leads(topic, partition)

    def _topic(self, name: str):
        e = self.ctx.catalog.get(name)
        if e is None and self.cl is not None and name in self.cl.agent.topics:
            e = self.cl.mirror(name)  # a cluster topic this broker's view has and its catalog not yet
        return e

    # --- serving ---------------------------------------------------------------------------
    def serve(self, req) -> None:
        op = req.op
        if op == P.Op.SHARE_STATE_COPY:
            if self.cl is None:
                return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("SHARE_STATE_COPY is between a cluster's brokers"))
            return self.cl.serve_copy(req)
        if not self.loaded or (self.cl is not None and not self.cl.pulled):
            return req.reply(P.ErrorCode.NOT_READY, P.ErrorReply("the share coordinator is reading its state back"))
        if op == P.Op.LIST_SHARE_GROUPS:
            return req.reply(P.ErrorCode.OK, S.ListShareGroupsReply(sorted(self.groups)))
        if op == P.Op.DESCRIBE_SHARE_GROUP:
            g = self.groups.get(req.name)
            if g is None:
                return req.reply(P.ErrorCode.UNKNOWN_GROUP, P.ErrorReply(f"no share group {req.name!r}"))
            return req.reply(P.ErrorCode.OK, self.info(g))
        if op == P.Op.ALTER_SHARE_GROUP:
            return self._alter(req, _DECODE[S.AlterShareGroupRequest].decode(req.frames[2]))
        self._fetch(req, _DECODE[S.ShareFetchRequest].decode(req.frames[2]))

    def group(self, name: str) -> ShareGroup:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = ShareGroup(name, self.ctx.s)
        return g

    def _fetch(self, req, body: S.ShareFetchRequest) -> None:
        now = time.monotonic()
        if not body.member_id or body.max_records < 1 or body.max_bytes < 1 or body.max_wait_ms < 0:
            return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("member_id, max_records >= 1, max_bytes >= 1 and max_wait_ms >= 0 are needed"))
        for t in body.topics:
            if t.startswith("__") or self._topic(t) is None:
                return req.reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"topic {t!r} does not exist"))
            acls = self.ctx.acls
            if acls is not None and req.principal is not None and not acls.allows(req.principal, "consume", t):
                return req.reply(P.ErrorCode.NOT_AUTHORIZED, P.ErrorReply(f"principal {req.principal!r} may not consume from topic {t!r}"))
        g = self.group(req.name)
        m = g.member(body.member_id, now)
        if body.topics:
            m.topics = list(body.topics)
        outcomes = [self._ack(g, m, a, now) for a in body.acks]
        w = Waiter(req, g, m, body, outcomes, now + body.max_wait_ms / 1000)
        w.wrote = bool(outcomes) and any(sp.dirty for sp in g.parts.values())
        if body.leave:
            for sp in g.parts.values():
                sp.release_member(m.index, now, g.limit)
            del g.members[m.id]
            w.wrote = True
            return self._finish(w, [])
        if req.op == P.Op.SHARE_ACKNOWLEDGE:
            return self._finish(w, [])
        self._try(w, now)
        if self.parked and w in self.parked and w.wrote:  # the acknowledgements are answered now, not after the wait
            self.parked.remove(w)
            self._finish(w, [])

    def _ack(self, g: ShareGroup, m: Member, a: S.ShareAck, now: float) -> S.AckOutcome:
        def out(code, message=""):
            return S.AckOutcome(a.topic, a.partition, a.first, a.last, code, message)
        t = self.ctx.catalog.get(a.topic)
        if t is None:
            return out(P.ErrorCode.UNKNOWN_TOPIC, f"topic {a.topic!r} does not exist")
        if not 0 <= a.partition < t.partitions:
            return out(P.ErrorCode.UNKNOWN_PARTITION, f"topic {a.topic!r} has {t.partitions} partitions")
        if not self._leads(a.topic, a.partition):
            ep = self.cl.leader_endpoint(a.topic, a.partition)
            return out(P.ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{a.topic}/{a.partition} is led by {ep or 'no broker now'}: "
                       "acknowledge there (its records were acquired from its leader)")
        if a.type not in (S.ACCEPT, S.RELEASE, S.REJECT) or a.last < a.first:
            return out(P.ErrorCode.INVALID_REQUEST, f"type {a.type} (1 accept, 2 release, 3 reject), range {a.first}..{a.last}")
        sp = g.parts.get((a.topic, a.partition))
        missed = a.last - a.first + 1 if sp is None else sp.acknowledge(
            m.index, a.first, a.last, a.type, None if a.delay_ms < 0 else a.delay_ms / 1000, a.error, now, g.limit, g.backoff_s)
        if missed:
            return out(P.ErrorCode.INVALID_RECORD_STATE, f"{missed} of the {a.last - a.first + 1} offsets were not held by "
                       f"this member (never acquired by it, already acknowledged, or its lock ended)")
        return out(P.ErrorCode.OK)

    def _try(self, w: Waiter, now: float) -> None:
        g, m, body = w.group, w.member, w.body
        keys = [(t, p, e) for t in m.topics if (e := self.ctx.catalog.get(t)) is not None
                for p in range(e.partitions) if self._leads(t, p)]
        if keys:
            g.rotor = (g.rotor + 1) % len(keys)
            keys = keys[g.rotor:] + keys[: g.rotor]
        results, n, nbytes = [], body.max_records, 0
        for t, p, e in keys:
            sp = g.parts.get((t, p))
            if sp is None or not _same_topic(sp, e):  # new, or its topic was made again
                sp = g.parts[(t, p)] = SharePartition(t, p, -1, _tid(e))
            if sp.start < 0:
                self._read(g, sp)
                continue
            if n > 0 and nbytes < body.max_bytes:
                offs, counts = sp.acquire(m.index, n, now, g.lock_s)
                if len(offs):
                    data = sp.body_for(offs)
                    results.append((sp, offs, counts, data))
                    n -= len(offs)
                    nbytes += sum(len(d) for d in data)
            if sp.wants_read(self.ctx.s.share_max_in_flight):
                self._read(g, sp)
        if results or now >= w.deadline:
            self._finish(w, results)
        elif w not in self.parked:
            self.parked.append(w)

    def _finish(self, w: Waiter, results: list) -> None:
        parts, bodies = [], []
        for sp, offs, counts, data in results:
            parts.append(S.SharePartitionData(sp.topic, sp.partition, ranges(offs, counts), sum(len(d) for d in data)))
            bodies.extend(data)
            w.group.delivered += len(offs)
        reply = S.ShareFetchReply(parts, w.outcomes, int(w.group.lock_s * 1000))
        frames = [P.encode(reply), b"".join(bodies)]
        if not w.wrote:
            return self._answer(w.req, P.ErrorCode.OK, frames)
        w.group.awaiting.append((w.req, frames))  # answered once the state is durable: one write per group
        self.write_due[w.group.name] = w.group  # and router loop (``flush``), whatever the requests in it

    def flush(self) -> None:
        """End of a router loop: write the changed state of every group that has requests
        waiting on it, once each, and answer them when it is durable."""
        due, self.write_due = self.write_due, {}
        for g in due.values():
            waiting, g.awaiting = g.awaiting, []

            def done(code, why, waiting=waiting):
                err = [P.encode(P.ErrorReply(f"acknowledgements not stored: {why}"))]
                for req, frames in waiting:
                    self._answer(req, code, frames if code == P.ErrorCode.OK else err)
            self._write(g, done)

    def _answer(self, req, code: int, frames: list) -> None:
        rid = P.unpack_routing(req.routing)[4]
        self.ctx.send_client([req.ident, P.pack_routing(req.op, req.partition, rid, P.echo_topic(req.topic), code), *frames])

    def poll(self, now: float) -> None:
        """Every loop of the router: waiters whose wait ended are answered (empty)."""
        if self.parked and any(w.deadline <= now for w in self.parked):
            for w in [w for w in self.parked if w.deadline <= now]:
                self.parked.remove(w)
                self._try(w, now)

    def _wake(self, now: float) -> None:
        waiting, self.parked = self.parked, []
        for w in waiting:
            if w.member.id in w.group.members:
                self._try(w, now)
            else:  # its session ended while it waited: answered empty (its next request joins again)
                self._finish(w, [])

    # --- reading the log -------------------------------------------------------------------------
    def _read(self, g: ShareGroup, sp: SharePartition) -> None:
        if sp.fetching:
            return
        rid = self.ctx.next_internal_id()
        if sp.start < 0:
            offset, records = (0 if g.earliest else LATEST), self.ctx.s.share_max_in_flight
        else:
            offset = sp.buf_end
            records = max(sp.end - sp.buf_end, self.ctx.s.share_max_in_flight - (sp.end - sp.start), 1)
        topic = sp.topic.encode()
        header = P.encode(P.FetchRequest(offset, max_bytes=READ_BYTES, max_records=records, max_wait_ms=READ_WAIT_MS))
        if self.ctx.send_internal(topic, sp.partition, [P.pack_routing(P.Op.FETCH, sp.partition, rid, topic), header]):
            sp.fetching = rid
            self.pending[rid] = ["read", time.monotonic(), g, sp, offset]

    def _on_read(self, item: list, code: int, frames: list) -> None:
        _k, _sent, g, sp, offset = item
        sp.fetching = 0
        if code == P.ErrorCode.OK:
            batches = split_batches(frames[2]) if len(frames) > 2 else []
            if sp.start < 0:
                sp.restart(offset)
            if batches and batches[-1][1] > sp.buf_end:
                sp.add_batches(batches)
        elif code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
            err = _error_reply.decode(frames[1])
            if sp.start < 0 or 0 <= err.high_watermark < sp.buf_end:  # new, or the log is behind what was read
                if sp.start >= 0:
                    log.warning("share group %s: %s/%d ends at %d, below the %d read: started again", g.name, sp.topic,
                                sp.partition, err.high_watermark, sp.buf_end)
                start = err.log_start_offset if g.earliest or err.high_watermark < 0 else err.high_watermark
                sp.restart(max(start, 0))
                sp.dirty = True
            elif err.log_start_offset > sp.buf_end:
                sp.skip_to(err.log_start_offset)  # retention took records never done: archived
        self._wake(time.monotonic())

    # --- dead letters ----------------------------------------------------------------------------
    def _dead_letters(self, g: ShareGroup) -> None:
        for sp in g.parts.values():
            if sp.dlq_busy or sp.start < 0 or not self._leads(sp.topic, sp.partition):
                continue
            offs = sp.dead(DLQ_CHUNK)
            if not len(offs):
                continue
            if not g.dlq:
                sp.archive(offs)
                continue
            if self.cl is not None:
                if not self.cl.dlq_ready(g.dlq):
                    return
            elif self.ctx.catalog.get(g.dlq) is None and self.ctx.make_internal_topic(g.dlq, 1, {}) is None:
                return
            batch = sp.dead_batch(g.name, offs)
            rid = self.ctx.next_internal_id()
            sp.dlq_busy = True
            self.pending[rid] = ["dlq", time.monotonic(), g, sp, offs, batch, 1]
            self._send_produce(g.dlq, rid, batch)

    def _send_produce(self, topic: str, rid: int, batch: bytes) -> bool:
        t = topic.encode()
        frames = [P.pack_routing(P.Op.PRODUCE, 0, rid, t), P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)), batch]
        if not self._leads(topic, 0):  # a cluster's dead-letter topic led by another broker
            return self.cl.send(topic, 0, frames, rid)
        return self.ctx.send_internal(t, 0, frames)

    # --- writing the state -----------------------------------------------------------------------
    def _write(self, g: ShareGroup, done, config: bool = False) -> None:
        """Write every changed share partition of ``g`` (and its settings with ``config``) to
        ``__share_group_state``; ``done(code, why)`` once it is durable."""
        now = time.monotonic()
        changed = [sp for sp in g.parts.values() if sp.dirty and sp.start >= 0 and self._leads(sp.topic, sp.partition)]
        for sp in changed:
            sp.version += 1
            sp.epoch = -1 if self.cl is None else self.cl.epoch(sp.topic, sp.partition)
        recs = [sp.snapshot(g.name) for sp in changed]
        if config or not recs:
            g.config_version += 1
            recs.append(SnapshotRecord(g.name, "", -1, 0, 0, config=dict(g.config), version=g.config_version))
            g.config_written_at = now
        for sp in changed:
            sp.dirty, sp.written_at = False, now
        batch = encode_snapshots(recs)
        if self.cl is not None:  # answered once the other brokers have the copy too
            local_done = done
            done = lambda code, why: (self.cl.copy_out(batch, local_done)  # noqa: E731
                                      if code == P.ErrorCode.OK else local_done(code, why))
        self.store(batch, done, g, changed)

    def store(self, batch: bytes, done, g: ShareGroup | None = None, changed: list = ()) -> None:
        """Append a batch of snapshot records to ``__share_group_state``; ``done(code, why)``."""
        if self.ctx.catalog.get(SHARE_STATE_TOPIC) is None and self.ctx.make_internal_topic(
                SHARE_STATE_TOPIC, 1, {"retention.ms": int(KEEP_S * 1000)}) is None:
            return done(P.ErrorCode.NOT_READY, "the share state topic cannot be made (shared-memory budget or slots)")
        rid = self.ctx.next_internal_id()
        self.pending[rid] = ["write", time.monotonic(), g, list(changed), done, batch, 1]
        self._send_produce(SHARE_STATE_TOPIC, rid, batch)

    def take(self, rec: SnapshotRecord, copy: bool = False) -> bool:
        """Hold a snapshot record (read back, or a copy) unless what is held is newer."""
        g = self.group(rec.group)
        if rec.config is not None:
            if rec.version < g.config_version:
                return False
            g.config, g.config_version = dict(rec.config), rec.version
            g.refresh_settings()
            return True
        key = (rec.topic, rec.partition)
        sp = g.parts.get(key)
        if copy and self.cl.leads_managed(rec.topic, rec.partition):
            return False
        if sp is not None and sp.topic_id == rec.topic_id and (sp.epoch, sp.version) > (rec.epoch, rec.version):
            return False
        g.parts[key] = SharePartition.restore(rec)
        return True

    def on_reply(self, rid: int, op: int, code: int, frames: list) -> bool:
        """An owner's reply to a request of ours (False: not ours)."""
        item = self.pending.pop(rid, None)
        if item is None:
            if rid == self.back.rid and not self.loaded:
                self._on_load(code, frames)
                return True
            return False
        kind = item[0]
        if kind == "read":
            self._on_read(item, code, frames)
            return True
        why = _error_reply.decode(frames[1]).message if code != P.ErrorCode.OK and len(frames) > 1 else ""
        if code in P.RETRIABLE and item[6] < 5:
            item[1], item[6] = time.monotonic(), item[6] + 1
            self.pending[rid] = item  # sent again at the next tick
            return True
        self._settle(item, code, why)
        return True

    def _settle(self, item: list, code: int, why: str) -> None:
        kind = item[0]
        if kind == "write":
            if code != P.ErrorCode.OK:
                for sp in item[3]:
                    sp.dirty = True
            item[4](code, why)
        elif kind == "dlq":
            sp = item[3]
            sp.dlq_busy = False
            if code == P.ErrorCode.OK:
                sp.archive(item[4])
            else:
                log.warning("share group %s: dead letters to %s not stored: %s", item[2].name, item[2].dlq, why)

    def tick(self, now: float) -> None:
        if not self.loaded:
            if self.back.due(now):
                self.back.step()
            return
        if self.cl is not None:
            self.cl.tick(now)
        for rid, item in list(self.pending.items()):
            if now - item[1] <= RETRY_S:
                continue
            if item[0] == "read":
                del self.pending[rid]
                item[3].fetching = 0
            elif item[6] >= 5:
                del self.pending[rid]
                self._settle(item, P.ErrorCode.TIMEOUT, "no worker answered")
            else:
                item[1], item[6] = now, item[6] + 1
                self._send_produce(SHARE_STATE_TOPIC if item[0] == "write" else item[2].dlq, rid, item[5])
        woke = False
        for g in self.groups.values():
            for key, sp in list(g.parts.items()):  # a topic deleted (or made again: a new id) takes its state with it
                e = self.ctx.catalog.get(key[0])
                if e is None or key[1] >= e.partitions or not _same_topic(sp, e):
                    del g.parts[key]
            for m in [m for m in g.members.values() if now - m.last_seen > g.session_s]:
                log.info("share group %s: member %s left (silent for %.0f s): its records go back", g.name, m.id, g.session_s)
                for sp in g.parts.values():
                    woke |= bool(sp.release_member(m.index, now, g.limit))
                del g.members[m.id]
            for sp in g.parts.values():
                if self.cl is not None and not self.cl.leads(sp.topic, sp.partition):
                    continue  # another broker's: a copy, kept as it was sent
                woke |= bool(sp.expire(now, g.limit))
                if not sp.dirty and sp.start >= 0 and now - sp.written_at > REFRESH_S:
                    sp.dirty = True
            self._dead_letters(g)
            if any(sp.dirty for sp in g.parts.values()) or now - g.config_written_at > REFRESH_S:
                self._write(g, lambda code, why: None, config=now - g.config_written_at > REFRESH_S)
        if woke or any(sp.until.size and sp.due_at() <= now for g in self.groups.values() for sp in g.parts.values()):
            self._wake(now)

    def stats_parts(self) -> tuple[dict, dict]:
        """(counters, gauges) for the metrics endpoint (ops/metrics.py ``share_*``): partitions by slot."""
        counters: dict[str, dict] = {"share_deliveries": {}, "share_redeliveries": {}, "share_dead_letters": {}}
        in_flight, acquired = {}, {}
        for g in self.groups.values():
            counters["share_deliveries"][g.name] = g.delivered
            counters["share_redeliveries"][g.name] = sum(sp.redelivered for sp in g.parts.values())
            counters["share_dead_letters"][g.name] = sum(sp.dead_total for sp in g.parts.values())
            for (t, p), sp in g.parts.items():
                e = self.ctx.catalog.get(t)
                if e is None or p >= e.partitions or sp.start < 0 or not self._leads(t, p):
                    continue
                key = f"{e.slots[p]}|{g.name}"
                c = sp.counts_by_state()
                in_flight[key] = sp.end - sp.start - c.get(S.ACKNOWLEDGED, 0) - c.get(S.ARCHIVED, 0)
                acquired[key] = c.get(S.ACQUIRED, 0)
        return counters, {"share_in_flight": in_flight, "share_acquired": acquired}

    # --- describing and altering -------------------------------------------------------------------
    def info(self, g: ShareGroup) -> S.ShareGroupInfo:
        now = time.monotonic()
        members = [S.ShareMemberInfo(m.id, m.topics, sum(int(np.count_nonzero((sp.state == S.ACQUIRED) & (sp.owner == m.index)))
                                                             for sp in g.parts.values()), int((now - m.last_seen) * 1000))
                   for m in g.members.values()]
        parts = []
        for (t, p), sp in sorted(g.parts.items()):
            if sp.start < 0 or not self._leads(t, p):
                continue
            c = sp.counts_by_state()
            live = sp.end - sp.start - c.get(S.ACKNOWLEDGED, 0) - c.get(S.ARCHIVED, 0)
            parts.append(S.SharePartitionInfo(t, p, sp.start, sp.end, live, c.get(S.ACQUIRED, 0), c.get(S.AVAILABLE, 0),
                                              sp.histogram(), sp.dead_total))
        return S.ShareGroupInfo(g.name, g.settings(), members, parts, g.dlq, [] if self.cl is None else self.cl.others())

    def _alter(self, req, body: S.AlterShareGroupRequest) -> None:
        for k, v in body.config.items():
            why = check_config(k, v)
            if why is not None:
                return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(why))
        g = self.group(req.name)
        for k, v in body.config.items():
            if v == "":
                g.config.pop(k, None)
            else:
                g.config[k] = v
        g.refresh_settings()
        self._write(g, lambda code, why: req.reply(code, self.info(g) if code == P.ErrorCode.OK else P.ErrorReply(why)), config=True)

    # --- reading the state back at start -----------------------------------------------------------
    def _on_load(self, code: int, frames: list) -> None:
        body = self.back.take(code, frames)
        if body is None:
            return
        if len(body):
            for v in iter_batches(body):
                for i in range(v.record_count):  # at start only: one step per snapshot record
                    if v.base_offset + i < self.back.offset:
                        continue
                    try:
                        rec = _snapshot.decode(v.value(i))
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        log.warning("%s offset %d is not a share state record: skipped", SHARE_STATE_TOPIC, v.base_offset + i)
                        continue
                    self.take(rec)
        if self.back.advance():
            self.loaded = True
            log.info("share coordinator ready: %d share groups read back up to offset %d", len(self.groups), self.back.offset)
