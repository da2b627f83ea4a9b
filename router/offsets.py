"""DESCRIBE_TOPIC and LIST_OFFSETS at the router: questions a worker answers for the client.

Offsets live in shared memory, which workers read: the router asks one (the owner of partition
0 if it answers heartbeats, else another that does) under an internal request id, and answers
the client when the reply comes back; for DESCRIBE it merges each partition's owner, endpoints
and adoption in. A question left unanswered ``ASK_RETRY_S`` is asked again, elsewhere if
possible: the worker may have died with it in its socket. Reading offsets changes nothing, so
asking twice is safe; after ``ASK_TRIES`` the client hears NOT_READY (retriable).

``OffsetAsks`` holds the questions in flight over an ``AskContext``: settings, catalog,
placement, the liveness view, the worker links, the router's id counter and its reply port.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.client import protocol as P
from tailrace.persistence.recovery import data_dir_id

from .links import WorkerLinks
from .liveness import HEARTBEAT_S, WorkerLiveness
from .placement import Placement
from .request import Request
from .topics import info

log = logging.getLogger("tailrace.router")

ASK_RETRY_S = 1.0  # an offsets question unanswered this long goes again, to another worker if one answers
ASK_TRIES = 5  # then the client hears NOT_READY (retriable) instead of waiting out its own timeout

_list_offsets_dec = P.decoder(P.ListOffsetsReply)
_describe_dec = P.decoder(P.DescribeReply)
_list_offsets_req = P.decoder(P.ListOffsetsRequest)
_describe_req = P.decoder(P.DescribeRequest)
PEER_TIMEOUT_S = 2.0  # cluster: another broker's answer waited for this long at most


class Merge:
    """Cluster: one client question answered from this broker's worker and other leaders."""

    __slots__ = ("waiting", "remote", "local", "started")

    def __init__(self):
        self.waiting: dict[str, list[int]] = {}  # endpoint of a broker asked -> the partitions it leads, until it answers
        self.remote: list[tuple[list[int], bytes]] = []  # (the partitions of a broker that answered, its reply's body)
        self.local: tuple[int, bytes] | None = None  # this broker's worker: (code, body)
        self.started = time.monotonic()


@dataclass
class AskContext:
    s: settings_mod.Settings
    catalog: Catalog
    placement: Placement
    liveness: WorkerLiveness
    links: WorkerLinks
    next_id: Callable[[], int]  # the router's internal request ids (shared with the group coordinator)
    send: Callable[[list[bytes]], None]  # to a client, through the reply port


class OffsetAsks:
    def __init__(self, ctx: AskContext):
        self.ctx = ctx
        # internal request id -> [client id, routing, topic name, worker asked, when, tries, header]
        self.pending: dict[int, list] = {}
        self.data_id = 0  # the data directory's identity (for DESCRIBE), once the flusher made it
        self.cluster = None  # --cluster: the ClusterAgent, and PeerLinks to the other brokers
        self.peers = None
        self.mirror = None  # --cluster: take a cluster topic into the catalog now (router/topics.py mirror_topic)
        self.merges: dict[int, Merge] = {}  # internal request id -> a question other brokers help answer

    def attach_cluster(self, agent, peers, mirror) -> None:
        self.cluster, self.peers, self.mirror = agent, peers, mirror

    def ask(self, req: Request) -> None:
        """The handler of DESCRIBE_TOPIC and LIST_OFFSETS."""
        catalog, name = self.ctx.catalog, req.name
        if catalog.get(name) is None:
            catalog.reload()
            if catalog.get(name) is None and self.cluster is not None:
                self.mirror(name)  # a cluster topic this broker's view has and its catalog not yet
            if catalog.get(name) is None:
                return req.reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        header = req.header if req.op == P.Op.LIST_OFFSETS and req.header is not None else P.EMPTY_MAP
        rid = self.ctx.next_id()
        worker = self._worker(req.topic, None)
        self.pending[rid] = [req.ident, req.routing, name, worker, time.monotonic(), 1, header]
        if self.cluster is not None and self.cluster.managed(req.topic) and not self._local_only(req):
            self._ask_peers(rid, req, header, catalog.get(name).partitions)
        self._send(rid, worker, req.topic, header)

    @staticmethod
    def _local_only(req: Request) -> bool:
        if req.header is None or req.header == P.EMPTY_MAP:
            return False
        dec = _list_offsets_req if req.op == P.Op.LIST_OFFSETS else _describe_req
        return dec.decode(req.header).local

    def _ask_peers(self, rid: int, req: Request, header: bytes, partitions: int) -> None:
        """Cluster: ask every other live leader of the topic the same question, about its own
        log only; the client is answered once all have (``on_peer_reply``) or PEER_TIMEOUT_S."""
        remote = self.cluster.remote_leaders(req.topic, partitions)
        if not remote:
            return
        if req.op == P.Op.LIST_OFFSETS:
            ask = P.ListOffsetsRequest(_list_offsets_req.decode(header).timestamp_ms if header != P.EMPTY_MAP else -1,
                                       local=True)
        else:
            ask = P.DescribeRequest(local=True)
        routing, body = P.pack_routing(req.op, -1, rid, req.topic), P.encode(ask)
        self.merges[rid] = merge = Merge()
        for broker, parts in remote.items():
            ep = self.cluster.endpoint_of(broker)
            if ep and self.peers.send(ep, [routing, body], rid, self.on_peer_reply):
                merge.waiting[ep] = parts  # else unreachable now: its partitions are answered without it

    def on_peer_reply(self, endpoint: str, frames: list[bytes]) -> None:
        """The answer of the broker at ``endpoint`` to a question ``_ask_peers`` asked."""
        if len(frames) < 2:
            return
        _v, _op, code, _p, rid, _t = P.unpack_routing(frames[0])
        merge = self.merges.get(rid)
        if merge is None or endpoint not in merge.waiting:
            return
        parts = merge.waiting.pop(endpoint)
        if code == P.ErrorCode.OK:
            merge.remote.append((parts, frames[1]))
        self._finish(rid)

    def _finish(self, rid: int, timed_out: bool = False) -> None:
        """Answer a merged question once this broker's worker and every broker asked have
        answered (or PEER_TIMEOUT_S passed): each partition as its leader said it."""
        merge = self.merges.get(rid)
        if merge is None or merge.local is None or (merge.waiting and not timed_out):
            return
        del self.merges[rid]
        code, body = merge.local
        ask = self.pending.pop(rid, None)
        if ask is None:
            return
        if code == P.ErrorCode.OK and merge.waiting:
            missing = sorted(p for parts in merge.waiting.values() for p in parts)
            code, body = P.ErrorCode.NOT_READY, P.encode(P.ErrorReply(
                f"brokers {sorted(merge.waiting)} did not answer for partitions {missing[:16]} within {PEER_TIMEOUT_S} s"))
        self._answer(ask, code, body, merge.remote)

    def _worker(self, topic: bytes, avoid: int | None) -> int:
        """Any worker reads offsets from shared memory: the owner of partition 0 if it answers
        heartbeats, else another that does (never ``avoid``, the one that left a question
        unanswered, when there is a choice)."""
        now, routes, dealers, live = time.monotonic(), self.ctx.placement.routes, self.ctx.links.dealers, self.ctx.liveness
        owner = routes[(topic, 0)][0] if (topic, 0) in routes else min(dealers)

        def fresh(w: int) -> bool:  # answered one of the last heartbeats (long before it is declared dead)
            return w != avoid and live.answering(w, now) and now - live.last_pong.get(w, 0.0) < 3 * HEARTBEAT_S

        if fresh(owner):
            return owner
        others = [w for w in sorted(dealers) if fresh(w)]
        if others:
            return others[0]
        return owner if owner in dealers else min(dealers)

    def _send(self, rid: int, worker: int, topic: bytes, header: bytes) -> None:
        self.ctx.links.send(worker, [b"", b"\0" * P.ASSIGN.size, P.pack_routing(P.Op.LIST_OFFSETS, -1, rid, topic), header])

    def again(self) -> None:
        """Questions a worker did not answer: ask again, elsewhere if possible; after ASK_TRIES
        tell the client NOT_READY."""
        now = time.monotonic()
        for rid, merge in list(self.merges.items()):
            if rid not in self.pending:
                del self.merges[rid]  # answered NOT_READY already
            elif now - merge.started >= PEER_TIMEOUT_S and merge.local is not None:
                self._finish(rid, timed_out=True)
        for rid, ask in list(self.pending.items()):
            if rid in self.merges and self.merges[rid].local is not None:
                continue  # the worker answered; other brokers are waited for above
            ident, routing, name, worker, sent, tries, header = ask
            if now - sent < ASK_RETRY_S:
                continue
            _v, op, _c, partition, request_id, topic = P.unpack_routing(routing)
            if tries >= ASK_TRIES or (topic, 0) not in self.ctx.placement.routes:
                del self.pending[rid]
                self.ctx.send([ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), P.ErrorCode.NOT_READY),
                               P.encode(P.ErrorReply(f"no worker answered for the offsets of topic {name!r} in {tries} tries"))])
                continue
            w = self._worker(topic, worker)
            log.warning("offsets of topic %r unanswered by worker %d for %.1f s: asking worker %d", name, worker, now - sent, w)
            ask[3:6] = [w, now, tries + 1]
            self._send(rid, w, topic, header)

    def on_reply(self, rid: int, code: int, topic: bytes, body: bytes) -> None:
        """A worker's answer to question ``rid`` (a late second answer finds nothing: dropped)."""
        merge = self.merges.get(rid)
        if merge is not None:
            if rid in self.pending and merge.local is None:
                merge.local = (code, body)
                self._finish(rid)
            return
        pending = self.pending.pop(rid, None)
        if pending is not None:
            self._answer(pending, code, body, ())

    def _answer(self, pending: list, code: int, body: bytes, remote) -> None:
        """Answer the client: the worker's offsets as they are (LIST_OFFSETS) or as a
        DESCRIBE; in a cluster each partition another broker leads as that broker said."""
        ident, routing, name = pending[:3]
        _v, client_op, _c, partition, request_id, topic = P.unpack_routing(routing)
        head = P.pack_routing(client_op, partition, request_id, P.echo_topic(topic), code)
        if code != P.ErrorCode.OK:
            return self.ctx.send([ident, head, body])
        if client_op == P.Op.LIST_OFFSETS:
            if remote:
                offsets = _list_offsets_dec.decode(body)
                by_p = {po.partition: po for po in offsets.partitions}
                for parts, rbody in remote:
                    theirs = {po.partition: po for po in _list_offsets_dec.decode(rbody).partitions}
                    by_p.update({p: theirs[p] for p in parts if p in theirs})
                offsets.partitions = [by_p[p] for p in sorted(by_p)]
                body = P.encode(offsets)
            return self.ctx.send([ident, head, body])
        s, placement = self.ctx.s, self.ctx.placement
        offsets = _list_offsets_dec.decode(body)
        t = self.ctx.catalog.get(name)
        if t is None:  # deleted while the question was out
            return self.ctx.send([ident, P.pack_routing(client_op, partition, request_id, P.echo_topic(topic),
                                                        P.ErrorCode.UNKNOWN_TOPIC),
                                  P.encode(P.ErrorReply(f"unknown topic {name!r} (deleted)"))])
        parts, endpoints = [], {}  # worker -> its two endpoints, made once a worker, not once a partition
        for po in offsets.partitions:
            route = placement.routes.get((topic, po.partition))
            if route is None or po.partition >= t.partitions:
                continue  # not placed (any more): a topic deleted and made again while the question was out
            w, assign = route
            eps = endpoints.get(w)
            if eps is None:
                eps = endpoints[w] = (s.worker_endpoint(w), s.worker_unix_endpoint(w))
            parts.append(P.PartitionInfo(po.partition, w, eps[0], po.log_start_offset, po.high_watermark,
                                         po.durable_watermark, adopted=placement.told.get((topic, po.partition)) == assign,
                                         slot=t.slots[po.partition], local_endpoint=eps[1],
                                         ring_unflushed_bytes=po.ring_unflushed_bytes, appended_bytes=po.appended_bytes))
        if not self.data_id:
            self.data_id = data_dir_id(s.data_dir) or 0
        reply = P.DescribeReply(info(s, t), parts, s.instance, self.data_id, s.max_batch_bytes)
        if self.cluster is not None and self.cluster.managed(topic):
            self._with_leaders(topic, reply, remote)
        self.ctx.send([ident, head, P.encode(reply)])

    def _with_leaders(self, topic: bytes, reply: P.DescribeReply, remote) -> None:
        """Cluster: each partition's leader and epoch; a partition another broker leads as that
        broker described it, addressed through its endpoint (never this broker's rings)."""
        agent = self.cluster
        reply.broker_id = agent.me
        theirs = {}
        for parts, rbody in remote:
            described = {pi.partition: pi for pi in _describe_dec.decode(rbody).partitions}
            theirs.update({p: described[p] for p in parts if p in described})
        out = []
        for pi in reply.partitions:
            a = agent.assignment(topic, pi.partition)
            if a is None:
                out.append(pi)
                continue
            if a.leader != agent.me:
                pi = theirs.get(pi.partition, pi)
                pi.adopted, pi.slot, pi.local_endpoint = False, -1, ""
                pi.leader_endpoint = agent.endpoint_of(a.leader)
            elif len(a.replicas) > 1:  # replicated, led here: its rings run past the high watermark, and its
                pi.adopted, pi.slot, pi.local_endpoint = False, -1, ""  # first request goes through the router (LeaderDuties)
            pi.leader, pi.leader_epoch = a.leader, a.leader_epoch
            pi.replicas, pi.isr, pi.target = list(a.replicas), list(a.isr), list(a.target)
            out.append(pi)
        reply.partitions = out
        reply.topic.replication_factor = agent.replication_factor(topic)
