"""Share groups in a cluster (docs/DESIGN.md "Share groups", "In a cluster").

Kafka's KIP-932 shape: a partition's leader is its share-partition leader. Each broker's share
coordinator (router/share.py) acquires and acknowledges records only of the partitions it leads,
reading them from its own workers; a member fetches from every leader of its topics
(client/share.py). What a leader writes to its own ``__share_group_state`` it also sends to
every other live broker (``SHARE_STATE_COPY``), and the acknowledgements wait for those copies
to be stored (or ``REPLICA_WAIT_S``), as the group coordinator's commits do (router/groups.py).
A broker keeps the copies it is sent as passive share partitions, in memory and in its own
``__share_group_state``: when it becomes a partition's leader (a failover, a reassignment, the
preferred leader back) it goes on from the last state the old leader answered for. Each snapshot
carries the partition's leader epoch and a write count; a copy replaces what a broker holds only
when it is newer by (epoch, count), so a deposed leader's late write cannot undo its successor's.
A broker that starts asks the others for all they hold (``pull``) before it serves share
requests: it may have missed copies while it was down. Dead letters go to the cluster topic
``<group>.dlq``, made by the controller at the first dead record, written at its leader.
"""

from __future__ import annotations

import logging
import time

from tailrace.broker.acl import is_broker
from tailrace.client import protocol as P
from tailrace.client import records as R
from tailrace.client import share_protocol as S

from .peers import Copies, Pull, others
from .share_state import SnapshotRecord, encode_snapshots, snapshot_records

log = logging.getLogger("tailrace.router")

REPLICA_WAIT_S = 2.0  # acknowledgements are answered once every other broker stored the copy, or after this long
PULL_WAIT_S = 5.0  # a starting broker waits this long at most for the others' share state
PULL_ASK_AGAIN_S = 1.0  # ...asking again this often the ones that were not ready
DLQ_ASK_AGAIN_S = 2.0  # the controller is asked to make a dead-letter topic this often, until it exists

_copy = P.decoder(S.ShareStateCopy)


class ShareCluster:
    """The cluster side of one router's share coordinator: who leads, copies out and in, the
    pull at start, dead-letter topics through the controller."""

    def __init__(self, coord, agent, peers, mirror):
        self.coord, self.agent, self.peers, self.mirror = coord, agent, peers, mirror
        next_id = coord.ctx.next_internal_id
        self.copies = Copies(peers, next_id, "share state copy", REPLICA_WAIT_S, log)
        self.pull = Pull(peers, next_id, P.Op.SHARE_STATE_COPY, P.encode(S.ShareStateCopy(pull=True)), self._on_pull,
                         "share state", PULL_WAIT_S, PULL_ASK_AGAIN_S, log)
        self.asked_dlq: dict[str, float] = {}

    @property
    def pulled(self) -> bool:
        return self.pull.done

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker is the share-partition leader (a broker's own topics: always)."""
        t = topic.encode()
        return not self.agent.managed(t) or self.agent.leads(t, partition)

    def leads_managed(self, topic: str, partition: int) -> bool:
        """Whether this broker leads a cluster topic's partition as the metadata says now (a
        broker that starts knows no assignment yet: it leads nothing of the cluster's)."""
        t = topic.encode()
        return self.agent.managed(t) and self.agent.leads(t, partition)

    def epoch(self, topic: str, partition: int) -> int:
        a = self.agent.assignment(topic.encode(), partition)
        return a.leader_epoch if a is not None else -1

    def leader_endpoint(self, topic: str, partition: int) -> str:
        a = self.agent.assignment(topic.encode(), partition)
        return self.agent.endpoint_of(a.leader) if a is not None else ""

    def others(self) -> list[str]:
        return others(self.agent)

    # --- copies out ------------------------------------------------------------------------------
    def copy_out(self, batch: bytes, done) -> None:
        """Send a batch of snapshot records just stored here to every other live broker; ``done``
        once all have stored it, or after REPLICA_WAIT_S (it is durable here either way)."""
        self.copies.send(self.others(), P.Op.SHARE_STATE_COPY, b"", P.encode(S.ShareStateCopy(batch)), done)

    def tick(self, now: float) -> None:
        self.copies.tick(now)
        if not self.pull.done and self.pull.step(now, self.others()):
            log.info("share coordinator ready in cluster: %d share groups", len(self.coord.groups))

    # --- copies in -------------------------------------------------------------------------------
    def serve_copy(self, req) -> None:
        """SHARE_STATE_COPY from another broker: keep a leader's copy, or answer a pull."""
        if req.principal is not None and not is_broker(req.principal):
            return req.reply(P.ErrorCode.NOT_AUTHORIZED, P.ErrorReply("SHARE_STATE_COPY is for the cluster's brokers"))
        if not self.coord.loaded:
            return req.reply(P.ErrorCode.NOT_READY, P.ErrorReply("the share coordinator is reading its state back"))
        body = _copy.decode(req.frames[2])
        if body.pull:  # what this broker holds as it is, even while it pulls others' (the puller keeps the newest)
            return req.reply(P.ErrorCode.OK, S.ShareStateCopy(self.snapshot_batch()))
        try:
            kept = self.take_copies(body.records)
        except R.BatchError as exc:
            return req.reply(P.ErrorCode.MALFORMED, P.ErrorReply(f"share state copy: not a record batch: {exc}"))
        if not kept:
            return req.reply(P.ErrorCode.OK, S.ShareStateCopy())
        self.coord.store(body.records, lambda code, why: req.reply(
            code, S.ShareStateCopy() if code == P.ErrorCode.OK else P.ErrorReply(f"share state copy not stored: {why}")))

    def snapshot_batch(self) -> bytes:
        """Every share partition and group setting this broker holds, as one batch (a pull)."""
        recs = []
        for g in self.coord.groups.values():
            recs.append(SnapshotRecord(g.name, "", -1, 0, 0, config=dict(g.config), version=g.config_version))
            recs.extend(sp.snapshot(g.name) for sp in g.parts.values() if sp.start >= 0)
        return encode_snapshots(recs)

    def take_copies(self, batch: bytes) -> bool:
        """Keep another broker's snapshot records that are newer than what this one holds (never
        for a partition it leads itself: its own state is the newest); True if any was kept."""
        kept = False
        for rec in snapshot_records(batch):
            kept |= self.coord.take(rec, copy=True)
        return kept

    def _on_pull(self, endpoint: str, frames: list[bytes]) -> None:
        """A broker's share state, asked for at start: the newer kept, and stored here."""
        records = _copy.decode(frames[1]).records
        if self.take_copies(records):
            self.coord.store(records, lambda code, why: None)

    # --- dead-letter topics ----------------------------------------------------------------------
    def dlq_ready(self, name: str) -> bool:
        """Whether cluster topic ``name`` is in this broker's catalog; if not, the controller is
        asked to make it (one partition, the cluster's default replication) and False."""
        catalog = self.coord.ctx.catalog
        if catalog.get(name) is not None:
            return True
        agent = self.agent
        if name in agent.topics:
            return self.mirror(name) is not None
        now = time.monotonic()
        if now - self.asked_dlq.get(name, 0.0) < DLQ_ASK_AGAIN_S:
            return False
        self.asked_dlq[name] = now
        rf = agent.default_replication_factor()
        if agent.controller.is_controller:
            from tailrace.cluster.errors import ClusterError  # a cluster only

            try:
                agent.create_topic(name, 1, {"ring.bytes": self.coord.ctx.s.ring_bytes}, rf)
            except ClusterError as exc:
                log.warning("dead-letter topic %r not made yet: %s", name, exc)
                return False
            return self.mirror(name) is not None
        ep = agent.endpoint_of(agent.controller_id)
        if ep:
            rid = self.coord.ctx.next_internal_id()
            header = P.encode(P.CreateTopicRequest(1, replication_factor=rf))
            self.peers.send(ep, [P.pack_routing(P.Op.CREATE_TOPIC, -1, rid, name.encode()), header], rid,
                            lambda _ep, _frames: None)  # made or exists: the watch brings it into the catalog
        return False

    def send(self, topic: str, partition: int, frames: list[bytes], rid: int) -> bool:
        """A request for a partition another broker leads, to that broker (replies to the
        coordinator's ``on_reply``)."""
        return self.peers.to_leader(self.agent, topic.encode(), partition, frames, rid,
                                    lambda code, reply: self.coord.on_reply(rid, P.Op.PRODUCE, code, reply))

