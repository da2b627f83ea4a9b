"""Consumer groups: the coordinator, in the router.

A group is a name, its members and its committed offsets. Members join, stay and leave with one
op, ``GROUP_HEARTBEAT`` (Kafka's KIP-848 consumer protocol): each heartbeat says what the member
subscribes to and which partitions it holds, and its reply says which partitions it may hold now.

**Assignment, cooperative.** The group's *target* (router/assignor.py: sticky, balanced within
one) is recomputed when members come and go, subscriptions change or a topic grows. A member is
told its target minus the partitions another member still holds: a partition moving from A to B
leaves A's reply first; A stops reading it, commits it, and says so in its next heartbeat (sent
at once); only then is B given it. Every other partition is never paused. While a member waits
for partitions or owes some back, its replies ask it to come back within ``FAST_HEARTBEAT_MS``.

**Liveness.** A member unheard of for its session timeout (default 45 s, Kafka's) is removed
and its partitions go to the others. A static member (``instance_id``, Kafka's
``group.instance.id``) that leaves "for now" (epoch -2, what a closing static consumer sends)
keeps its target until its session ends; one that joins again under the same instance id
within it takes the same partitions back, and nothing moves.

**Committed offsets** are stored in the broker's own log, in the internal topic
``__consumer_offsets`` (made at the first commit; 1 partition). Each commit appends a record
keyed by the group whose value is *all* of the group's offsets after the commit, produced with
``acks=durable``: the commit is answered only once that is synced, and the offsets a fetch
returns are only ever durable ones. Rebuilding at start reads the topic from its log start and
keeps the last record per group: the topic keeps records ``group_offsets_retention_ms`` (6
hours) and every group with offsets is written again every ``group_refresh_ms`` (2 hours), so a
start reads at most 6 hours of commits, however old the groups. A commit must come from a member
that holds the partitions (its heartbeats said so): from a member whose session ended
``UNKNOWN_MEMBER_ID``, for partitions it no longer holds ``FENCED_MEMBER_EPOCH``, and nothing is
stored. A commit without a member (a reset by
``tailrace groups reset-offsets``, or a consumer outside the group) is taken only while the
group has no members (else ``GROUP_NOT_EMPTY``), as Kafka.
"""

from __future__ import annotations

import logging
import time
import uuid

from dataclasses import dataclass
from typing import Callable

import msgspec

from tailrace.broker import datadir
from tailrace.broker.acl import is_broker
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import OFFSETS_TOPIC, Catalog
from tailrace.broker.stats import StatsFile, label_key
from tailrace.client import protocol as P
from tailrace.client.records import encode_batch, iter_batches

from .assignor import TP, assign
from .peers import Copies, Pull, others

log = logging.getLogger("tailrace.groups")

GROUPS_TOPIC = OFFSETS_TOPIC  # internal: refused to topic admin (broker/catalog.py)
STATS_PROCESS = datadir.GROUPS_STATS  # <run dir>/stats/groups.msgpack (broker/stats.py)
EMPTY_GROUP_KEEP_S = 7 * 86400  # an empty group's offsets are kept this long (Kafka's offsets.retention.minutes)
FAST_HEARTBEAT_MS = 100  # while partitions move
SESSION_MS = (1_000, 1_800_000)  # allowed session timeouts
RETRY_S = 2.0  # an internal produce or fetch unanswered this long is sent again
LOAD_BYTES = 4 << 20


class GroupRecord(msgspec.Struct, omit_defaults=True):
    group: str
    offsets: list[tuple[str, int, int]] = []
    deleted: bool = False
    version: int = 0  # the group's count of offset writes (a cluster keeps each group's highest copy)


_record_dec = msgspec.msgpack.Decoder(GroupRecord)
_decoders = {kind: msgspec.msgpack.Decoder(kind) for kind in
             (P.GroupHeartbeatRequest, P.OffsetCommitRequest, P.OffsetFetchRequest, P.FetchReply, P.ErrorReply, P.ProduceReply,
              P.ListGroupsRequest, P.ListGroupsReply)}
REPLICA_WAIT_S = 2.0  # cluster: a commit is answered once every other broker has its copy, or after this long
PULL_WAIT_S = 5.0  # cluster: a starting coordinator waits this long at most for the others' copies
PULL_ASK_AGAIN_S = 1.0  # and asks those that have not answered again this often


class Member:
    __slots__ = ("member_id", "instance_id", "topics", "session_s", "heartbeat_ms", "last_seen", "epoch",
                 "owned", "target", "away")

    def __init__(self, member_id: str, instance_id: str, now: float):
        self.member_id, self.instance_id = member_id, instance_id
        self.topics: list[str] = []
        self.session_s, self.heartbeat_ms = 45.0, 3000
        self.last_seen = now
        self.epoch = 1
        self.owned: set[TP] = set()  # what it holds (revoking included), as its heartbeats and our replies say
        self.target: set[TP] = set()  # what the assignor gives it
        self.away = False  # a static member that left for now: its target waits for it


class Group:
    def __init__(self, name: str):
        self.name = name
        self.members: dict[str, Member] = {}
        self.epoch = 0
        self.offsets: dict[TP, int] = {}  # committed: durable
        self.staged: dict[TP, int] = {}  # what the writes in flight will have made durable
        self.counts: dict[str, int] = {}  # partition counts the target was computed with
        self.written_at = 0.0  # monotonic time of the last record written (or loaded)
        self.emptied_at = time.monotonic()
        self.version = 0  # the offsets' write count (GroupRecord.version) of the last write stored
        self.issued = 0  # the highest version given to a write (writes in flight included)

    def state(self) -> str:
        if not self.members:
            return "empty"
        return "stable" if all(m.owned == m.target for m in self.members.values()) else "reconciling"


@dataclass
class GroupContext:
    """What the coordinator may read and do at the router: no sockets, no routes."""

    s: settings_mod.Settings
    catalog: Catalog
    make_internal_topic: Callable  # (name, partitions, config) -> the topic's entry, or None if it does not fit
    next_internal_id: Callable[[], int]  # a request id of the router's own; the reply comes to ``on_reply``
    send_internal: Callable  # (topic, partition, frames) -> False if the partition has no owner to send to
    cluster: object | None = None  # --cluster: the ClusterAgent (router/cluster_agent.py)
    peers: object | None = None  # --cluster: PeerLinks to the other brokers (router/peers.py)


def _from_broker(req) -> bool:
    """Whether a request came from another broker of the cluster: with --auth curve its key is a
    registered broker's (principal ``broker/<id>``); without auth anyone may, as with every op."""
    return req.principal is None or is_broker(req.principal)


class Coordinator:
    """The groups of one router. ``handle`` serves the group ops; ``tick`` expires sessions,
    retries internal requests and refreshes offsets; ``on_reply`` takes the workers' replies to
    the internal produces and fetches."""

    def __init__(self, ctx: GroupContext):
        self.ctx = ctx
        self.groups: dict[str, Group] = {}
        self.pending: dict[int, list] = {}  # rid -> [kind, sent, tries, payload...]
        self.loaded = ctx.catalog.get(GROUPS_TOPIC) is None  # nothing to read back
        self.load_offset = 0
        self.load_rid = 0
        self.load_sent = 0.0
        self.commits = 0
        self.pull = None  # cluster: the copies asked of the other brokers at start (router/peers.py Pull)
        self.copies = None  # cluster: commits waiting for their copies at the other brokers (router/peers.py Copies)
        # every group's committed offsets, for consumer lag on the metrics endpoint (ops/metrics.py)
        self.stats = StatsFile(ctx.s.ipc_path(), STATS_PROCESS)

    # --- serving ---------------------------------------------------------------------------
    def serve(self, req) -> None:
        """The handler of every COORDINATOR row of client/ops.py SPEC (a router/request.py Request)."""
        if self.ctx.cluster is not None and not self._cluster_serve(req):
            return
        self.handle(req.op, req.name, req.frames[2], req.reply)

    # --- a cluster: one coordinator per group, every broker a copy of every group's offsets ----
    def attach_cluster(self, agent, peers) -> None:
        self.ctx.cluster, self.ctx.peers = agent, peers
        self.copies = Copies(peers, self.ctx.next_internal_id, "group offsets copy", REPLICA_WAIT_S, log)
        self.pull = Pull(peers, self.ctx.next_internal_id, P.Op.LIST_GROUPS, P.encode(P.ListGroupsRequest(replicas=True)),
                         self._on_pull, "group copies", PULL_WAIT_S, PULL_ASK_AGAIN_S, log)  # once read back (tick)

    def coordinator_of(self, name: str) -> tuple[int, str]:
        """The group's coordinator (broker id, client endpoint): the first live broker of the
        group's rendezvous order (cluster/assign.py), every broker computing the same."""
        from tailrace.cluster.assign import rendezvous  # a cluster only: a single host never imports tailrace.cluster

        agent = self.ctx.cluster
        live = set(agent.brokers) | {agent.me}
        first = rendezvous(name, live)[0]
        return first, ("" if first == agent.me else agent.endpoint_of(first))

    def find(self, req) -> None:
        """FIND_COORDINATOR: the broker that coordinates the routing header's group."""
        if self.ctx.cluster is None:
            return req.reply(P.ErrorCode.OK, P.FindCoordinatorReply(-1, ""))
        broker, endpoint = self.coordinator_of(req.name)
        req.reply(P.ErrorCode.OK, P.FindCoordinatorReply(broker, endpoint or self.ctx.cluster.endpoint))

    def _cluster_serve(self, req) -> bool:
        """False if answered here: another broker's copy (OFFSET_COMMIT with ``replica``), a
        copy dump (LIST_GROUPS with ``replicas``), or NOT_COORDINATOR for another's group."""
        header = req.frames[2] if len(req.frames) > 2 else P.EMPTY_MAP
        if req.op == P.Op.LIST_GROUPS:
            if header != P.EMPTY_MAP and _decoders[P.ListGroupsRequest].decode(header).replicas:
                if not _from_broker(req):
                    req.reply(P.ErrorCode.NOT_AUTHORIZED, P.ErrorReply("LIST_GROUPS with replicas is for the cluster's brokers"))
                    return False
                if not self.loaded:  # its copies as they are, even while it pulls others' (the puller keeps the newest)
                    req.reply(P.ErrorCode.NOT_READY, P.ErrorReply("the group coordinator is reading its offsets back"))
                    return False
                req.reply(P.ErrorCode.OK, P.ListGroupsReply([
                    P.GroupInfo(g.name, "empty", 0, [], [(t, p, o) for (t, p), o in sorted(g.offsets.items())], g.version)
                    for g in self.groups.values() if g.version > 0]))
                return False
            return True  # the groups this broker coordinates
        if req.op == P.Op.OFFSET_COMMIT:
            body = _decoders[P.OffsetCommitRequest].decode(header)
            if body.replica > 0:
                if not _from_broker(req):  # a forged copy with a high version would shadow the real ones
                    req.reply(P.ErrorCode.NOT_AUTHORIZED, P.ErrorReply("OFFSET_COMMIT with replica is for the cluster's brokers"))
                    return False
                self._take_copy(req.name, body, req.reply)
                return False
        broker, endpoint = self.coordinator_of(req.name)
        if broker != self.ctx.cluster.me:
            req.reply(P.ErrorCode.NOT_COORDINATOR, P.ErrorReply(
                f"broker {broker} coordinates group {req.name!r}" + (f", at {endpoint}" if endpoint else " (not reachable now)"),
                endpoint=endpoint))
            return False
        return True

    def _take_copy(self, name: str, body: P.OffsetCommitRequest, reply) -> None:
        """Another broker's copy of a group's offsets: kept (durably, in our own log) if newer."""
        if not self.loaded:
            return reply(P.ErrorCode.NOT_READY, P.ErrorReply("the group coordinator is reading its offsets back"))
        g = self.groups.get(name)
        if g is not None and body.replica <= g.version:
            return reply(P.ErrorCode.OK, P.CommittedOffsets([]))
        if g is None:
            g = self.groups[name] = Group(name)
        snapshot = {(t, int(p)): int(o) for t, p, o in body.offsets}

        def done(code, why):
            if code == P.ErrorCode.OK and body.deleted and self.groups.get(name) is g and not g.members:
                del self.groups[name]
            reply(code, P.CommittedOffsets([]) if code == P.ErrorCode.OK else P.ErrorReply(why))
        self._write(g, snapshot, done, deleted=body.deleted, version=body.replica, copy=False)

    def _copy_out(self, g: Group, snapshot: dict, version: int, deleted: bool, done) -> None:
        """Send the group's offsets at ``version`` to every other live broker; ``done`` once all
        have stored them, or after REPLICA_WAIT_S (the commit is durable here either way)."""
        header = P.encode(P.OffsetCommitRequest([(t, p, o) for (t, p), o in sorted(snapshot.items())], replica=version,
                                                deleted=deleted))
        self.copies.send(others(self.ctx.cluster), P.Op.OFFSET_COMMIT, g.name.encode(), header, done)

    def _on_pull(self, endpoint: str, frames: list[bytes]) -> None:
        """A broker's copies, asked for at start: each group's newest kept (a broker that was
        down missed the commits meanwhile)."""
        for info in _decoders[P.ListGroupsReply].decode(frames[1]).groups:
            g = self.groups.get(info.group)
            if g is None or info.version > g.version:
                g = g or self.groups.setdefault(info.group, Group(info.group))
                self._write(g, {(t, int(p)): int(o) for t, p, o in info.offsets}, lambda code, why: None,
                            version=info.version, copy=False)

    @property
    def ready(self) -> bool:
        return self.loaded and (self.pull is None or self.pull.done)

    def handle(self, op: int, name: str, header: bytes, reply) -> None:
        if not self.ready:
            return reply(P.ErrorCode.NOT_READY, P.ErrorReply("the group coordinator is reading its offsets back"))
        if op == P.Op.LIST_GROUPS:  # in a cluster, the groups this broker coordinates (it holds copies of others')
            mine = [g for g in sorted(self.groups.values(), key=lambda g: g.name)
                    if self.ctx.cluster is None or self.coordinator_of(g.name)[0] == self.ctx.cluster.me]
            return reply(P.ErrorCode.OK, P.ListGroupsReply([self._info(g, full=False) for g in mine]))
        if not name:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("a group op names its group in the routing header's topic"))
        if op == P.Op.GROUP_HEARTBEAT:
            return self.heartbeat(name, _decoders[P.GroupHeartbeatRequest].decode(header), reply)
        if op == P.Op.OFFSET_COMMIT:
            return self.commit(name, _decoders[P.OffsetCommitRequest].decode(header), reply)
        g = self.groups.get(name)
        if op == P.Op.OFFSET_FETCH:
            req = _decoders[P.OffsetFetchRequest].decode(header)
            offs = sorted(g.offsets.items()) if g is not None else []
            return reply(P.ErrorCode.OK, P.CommittedOffsets([(t, p, o) for (t, p), o in offs if req.topics is None or t in req.topics]))
        if g is None:
            return reply(P.ErrorCode.UNKNOWN_GROUP, P.ErrorReply(f"unknown group {name!r}"))
        if op == P.Op.DESCRIBE_GROUP:
            return reply(P.ErrorCode.OK, self._info(g, full=True))
        # DELETE_GROUP
        if g.members:
            return reply(P.ErrorCode.GROUP_NOT_EMPTY, P.ErrorReply(f"group {name!r} has {len(g.members)} members"))
        self._write(g, {}, deleted=True, done=lambda code, why: self._deleted(g, code, why, reply))

    def _deleted(self, g: Group, code: int, why: str, reply) -> None:
        if code == P.ErrorCode.OK:
            if self.groups.get(g.name) is g and not g.members:
                del self.groups[g.name]
            log.info("group %r deleted", g.name)
            return reply(P.ErrorCode.OK)
        reply(code, P.ErrorReply(why))

    def _info(self, g: Group, full: bool) -> P.GroupInfo:
        members = [P.GroupMember(m.member_id, m.instance_id, list(m.topics), sorted(m.target), sorted(m.owned))
                   for m in sorted(g.members.values(), key=lambda m: m.member_id)] if full else []
        return P.GroupInfo(g.name, g.state(), g.epoch, members, [(t, p, o) for (t, p), o in sorted(g.offsets.items())] if full else [])

    def heartbeat(self, name: str, req: P.GroupHeartbeatRequest, reply) -> None:
        now = time.monotonic()
        g = self.groups.get(name)
        if req.member_epoch == 0:  # join
            if g is None:
                g = self.groups[name] = Group(name)
            m = None
            if req.instance_id:  # static: the same instance takes its place (and its target) back
                m = next((x for x in g.members.values() if x.instance_id == req.instance_id), None)
                if m is not None:
                    del g.members[m.member_id]
                    m.member_id, m.owned, m.away = uuid.uuid4().hex, set(), False
                    m.epoch += 1
                    g.members[m.member_id] = m
                    log.info("group %r: static member %r back as %s", name, req.instance_id, m.member_id)
            if m is None:
                m = Member(uuid.uuid4().hex, req.instance_id, now)
                g.members[m.member_id] = m
                log.info("group %r: member %s joined (%d members)", name, m.member_id, len(g.members))
            changed = True
        else:
            m = g.members.get(req.member_id) if g is not None else None
            if m is None:
                return reply(P.ErrorCode.UNKNOWN_MEMBER_ID, P.ErrorReply(f"group {name!r} has no member {req.member_id!r}: join again"))
            if req.member_epoch == -1 or (req.member_epoch == -2 and not m.instance_id):
                self._remove(g, m, "left")
                return reply(P.ErrorCode.OK, P.GroupHeartbeatReply(m.member_id, -1, [], m.heartbeat_ms))
            changed = False
        m.last_seen = now
        m.session_s = min(max(req.session_timeout_ms, SESSION_MS[0]), SESSION_MS[1]) / 1000
        m.heartbeat_ms = max(10, min(req.heartbeat_interval_ms, int(m.session_s * 1000) // 3))
        if req.member_epoch == -2:  # a static member away for now: its partitions wait for it
            m.away, m.owned = True, set()
            return reply(P.ErrorCode.OK, P.GroupHeartbeatReply(m.member_id, -2, [], m.heartbeat_ms))
        if req.topics is not None and sorted(set(req.topics)) != m.topics:
            m.topics = sorted(set(req.topics))
            changed = True
        if changed or self._counts(m.topics, g) != {t: g.counts.get(t) for t in m.topics}:
            self._rebalance(g)
        reported = {(t, int(p)) for t, p in req.owned}
        m.owned &= reported  # what it let go of is free now (and it never holds what it was not given)
        others = set().union(*(x.owned for x in g.members.values() if x is not m))
        now_holds = (m.owned & m.target) | (m.target - others)
        revoking = m.owned - m.target
        if now_holds != m.owned - revoking:
            m.epoch += 1
        m.owned = now_holds | revoking
        moving = revoking or (m.target - now_holds)
        reply(P.ErrorCode.OK, P.GroupHeartbeatReply(m.member_id, m.epoch, sorted(now_holds),
                                                   min(FAST_HEARTBEAT_MS, m.heartbeat_ms) if moving else m.heartbeat_ms))

    def _counts(self, topics, g: Group) -> dict[str, int | None]:
        self.ctx.catalog.reload()  # one stat: a topic grown or deleted since
        out = {}
        for t in topics:
            entry = self.ctx.catalog.get(t)
            out[t] = entry.partitions if entry is not None else None
        return out

    def _rebalance(self, g: Group) -> None:
        subs = {mid: m.topics for mid, m in g.members.items()}
        topics = sorted({t for s in subs.values() for t in s})
        counts = {t: n for t, n in self._counts(topics, g).items() if n is not None}
        new = assign(subs, counts, {mid: m.target for mid, m in g.members.items()})
        g.counts = {t: counts.get(t) for t in topics}
        if any(new[mid] != m.target for mid, m in g.members.items()):
            g.epoch += 1
            moved = sum(len(m.target - new[mid]) for mid, m in g.members.items())
            log.info("group %r epoch %d: %d members, %d partitions, %d move", g.name, g.epoch, len(g.members),
                     sum(len(v) for v in new.values()), moved)
        for mid, m in g.members.items():
            m.target = new[mid]

    def _remove(self, g: Group, m: Member, why: str) -> None:
        del g.members[m.member_id]
        log.info("group %r: member %s %s (%d left)", g.name, m.member_id, why, len(g.members))
        if not g.members:
            g.emptied_at = time.monotonic()
        self._rebalance(g)

    def commit(self, name: str, req: P.OffsetCommitRequest, reply) -> None:
        g = self.groups.get(name)
        if req.member_id:
            m = g.members.get(req.member_id) if g is not None else None
            if m is None:
                return reply(P.ErrorCode.UNKNOWN_MEMBER_ID, P.ErrorReply(f"group {name!r} has no member {req.member_id!r}"))
            foreign = [(t, p) for t, p, _o in req.offsets if (t, p) not in m.owned]
            if foreign:
                return reply(P.ErrorCode.FENCED_MEMBER_EPOCH, P.ErrorReply(
                    f"member {req.member_id} of group {name!r} does not hold {foreign[0][0]}/{foreign[0][1]} any more "
                    f"(its epoch is {m.epoch}, the commit's {req.member_epoch}): nothing stored"))
        elif g is not None and g.members:
            return reply(P.ErrorCode.GROUP_NOT_EMPTY, P.ErrorReply(
                f"group {name!r} has {len(g.members)} members: only they commit its offsets"))
        if any(o < 0 or p < 0 for _t, p, o in req.offsets):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("offsets and partitions are >= 0"))
        if g is None:
            g = self.groups[name] = Group(name)
        updates = {(t, int(p)): int(o) for t, p, o in req.offsets}
        self.commits += 1
        self._write(g, {**g.staged, **updates}, done=lambda code, why: reply(
            code, P.CommittedOffsets(sorted((t, p, o) for (t, p), o in updates.items())) if code == P.ErrorCode.OK else P.ErrorReply(why)))

    # --- the internal topic ----------------------------------------------------------------
    def _ensure_topic(self) -> bool:
        if self.ctx.catalog.get(GROUPS_TOPIC) is not None:
            return True
        return self.ctx.make_internal_topic(GROUPS_TOPIC, 1, {"retention.ms": self.ctx.s.group_offsets_retention_ms}) is not None

    def _write(self, g: Group, snapshot: dict[TP, int], done, deleted: bool = False, version: int | None = None,
               copy: bool = True) -> None:
        """Append the group's record (at ``version``, default the next); ``done(code, why)`` once
        it is durable (or failed), and in a cluster with ``copy`` once the other brokers have it."""
        if not self._ensure_topic():
            return done(P.ErrorCode.NOT_READY, "the offsets topic cannot be made (shared-memory budget or slots)")
        g.staged = dict(snapshot)
        if version is None:  # the next one, also past writes still in flight (two commits at once)
            version = g.issued = max(g.version, g.issued) + 1
        value = msgspec.msgpack.encode(GroupRecord(g.name, [(t, p, o) for (t, p), o in sorted(snapshot.items())], deleted,
                                                   version))
        batch = encode_batch([value], [g.name.encode()])
        rid = self.ctx.next_internal_id()
        if copy and self.ctx.cluster is not None:
            local_done = done
            done = lambda code, why: (self._copy_out(g, snapshot, version, deleted, local_done)  # noqa: E731
                                      if code == P.ErrorCode.OK else local_done(code, why))
        self.pending[rid] = ["produce", time.monotonic(), 1, g, snapshot, done, batch, version]
        self._send_produce(rid, batch)

    def _send_produce(self, rid: int, batch: bytes) -> bool:
        topic = GROUPS_TOPIC.encode()
        header = P.encode(P.ProduceRequest(acks=P.Acks.DURABLE))
        return self.ctx.send_internal(topic, 0, [P.pack_routing(P.Op.PRODUCE, 0, rid, topic), header, batch])

    def on_reply(self, rid: int, op: int, code: int, frames: list[bytes]) -> bool:
        """A worker's reply to an internal request of ours (False: not ours)."""
        item = self.pending.pop(rid, None)
        if item is None:
            if rid == self.load_rid and not self.loaded:
                self._on_load(code, frames)
                return True
            return False  # a stale answer (a load step asked again, a write given up on)
        if item[0] == "produce":
            _kind, _sent, tries, g, snapshot, done, batch, version = item
            if code == P.ErrorCode.OK:
                g.offsets = dict(snapshot)
                g.version = max(g.version, version)
                g.written_at = time.monotonic()
                done(P.ErrorCode.OK, "")
                return True
            if code in P.RETRIABLE and tries < 5:
                item[1], item[2] = time.monotonic(), tries + 1
                self.pending[rid] = item  # sent again at the next tick
                return True
            why = _decoders[P.ErrorReply].decode(frames[1]).message if len(frames) > 1 else ""
            done(code if code != P.ErrorCode.OK else P.ErrorCode.INTERNAL, f"offsets not stored: {why}")
            return True
        self._on_load(code, frames)
        return True

    def tick(self, now: float) -> None:
        if not self.loaded:
            if now - self.load_sent > RETRY_S:
                self._load_step()
            return
        if self.pull is not None and not self.pull.done and self.pull.step(now, others(self.ctx.cluster)):
            log.info("group coordinator ready in cluster: %d groups", len(self.groups))
        if self.copies is not None:
            self.copies.tick(now)
        for rid, item in list(self.pending.items()):
            if item[0] == "produce" and now - item[1] > RETRY_S:
                if item[2] >= 5:
                    del self.pending[rid]
                    item[5](P.ErrorCode.TIMEOUT, "offsets not stored: no worker answered")
                    continue
                item[1], item[2] = now, item[2] + 1
                self._send_produce(rid, item[6])
        for g in list(self.groups.values()):
            for m in list(g.members.values()):
                if now - m.last_seen > m.session_s:
                    self._remove(g, m, f"expired (no heartbeat for {m.session_s:.0f} s)")
            if g.offsets and now - g.written_at > self.ctx.s.group_refresh_ms / 1000 and not any(it[3] is g for it in self.pending.values() if it[0] == "produce"):
                if g.members or now - g.emptied_at < EMPTY_GROUP_KEEP_S:
                    self._write(g, dict(g.offsets), done=lambda code, why: None, version=g.version, copy=False)
        self.stats.maybe_write(self.stats_parts)

    def stats_parts(self) -> tuple[dict, dict, dict]:
        """Every group's committed offsets, keyed ``slot|group`` (the exporter names the partition
        from the slot and subtracts the offset from the control table's high watermark: lag)."""
        committed: dict[str, int] = {}
        for g in self.groups.values():
            for (topic, p), offset in g.offsets.items():
                t = self.ctx.catalog.get(topic)
                if t is not None and p < t.partitions:  # a deleted topic's offsets stay until the group goes
                    committed[label_key(t.slots[p], g.name)] = offset
        return {}, {"group_committed_offset": committed}, {}

    # --- reading the offsets back at start ---------------------------------------------------
    def _load_step(self) -> None:
        self.load_sent = time.monotonic()
        self.load_rid = self.ctx.next_internal_id()
        topic = GROUPS_TOPIC.encode()
        header = P.encode(P.FetchRequest(self.load_offset, max_bytes=LOAD_BYTES))
        self.ctx.send_internal(topic, 0, [P.pack_routing(P.Op.FETCH, 0, self.load_rid, topic), header])

    def _on_load(self, code: int, frames: list[bytes]) -> None:
        if code == P.ErrorCode.OFFSET_OUT_OF_RANGE:  # retention took the start: go on from the log start
            err = _decoders[P.ErrorReply].decode(frames[1])
            self.load_offset = max(self.load_offset, err.log_start_offset)
            return self._load_step()
        if code != P.ErrorCode.OK:
            return  # the tick asks again
        try:
            head = _decoders[P.FetchReply].decode(frames[1])
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
            return  # the tick asks again
        now = time.monotonic()
        if len(frames) > 2 and len(frames[2]):
            for v in iter_batches(frames[2]):
                for i in range(v.record_count):  # one step per record: at start only, over at most the retention of commits
                    if v.base_offset + i < self.load_offset:
                        continue
                    try:
                        rec = _record_dec.decode(v.value(i))
                    except (msgspec.DecodeError, msgspec.ValidationError):  # not ours (a client wrote it): skipped
                        log.warning("%s offset %d is not a group record: skipped", GROUPS_TOPIC, v.base_offset + i)
                        continue
                    if rec.deleted:
                        self.groups.pop(rec.group, None)
                        continue
                    g = self.groups.get(rec.group) or self.groups.setdefault(rec.group, Group(rec.group))
                    if rec.version and rec.version < g.version:
                        continue  # an older copy written after a newer one (a cluster's copies cross)
                    g.version = rec.version or g.version + 1
                    g.offsets = {(t, p): o for t, p, o in rec.offsets}
                    g.staged = dict(g.offsets)
                    g.written_at = now
        self.load_offset = max(self.load_offset, head.next_offset)
        if self.load_offset >= head.high_watermark:
            self.loaded = True
            log.info("group coordinator ready: %d groups read back up to offset %d", len(self.groups), self.load_offset)
        else:
            self._load_step()
