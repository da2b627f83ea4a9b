"""The router process: the front door. Reads only routing headers, forwards, serves metadata.

Sockets: a ROUTER bound at ``settings.bind`` (default tcp://127.0.0.1:7420) for clients, and one
DEALER per worker (identity ``b"router"``, router/links.py) connected to
``ipc://<ipc_dir>/worker-<i>.ipc``.

For produce and fetch it looks up the partition's slot in the catalog and its owner in the
sticky scheduler (router/placement.py), and forwards ``[client_id, assign, routing, header,
body...]`` to the owner (``assign`` = slot and owner epoch, so a restarted worker adopts the
partition with no other handshake). Replies come back on the DEALER as ``[client_id, routing,
...]`` and go out as they are. It never decodes frame 1 or 2 of a produce or fetch.

``Router`` holds the loop's state, the envelope check (broker/envelope.py) and the dispatch: one
handler per op the router takes, from client/ops.py's SPEC by its ``served`` column (Kafka's
``KafkaApis.handle``). The handlers live in their own modules over narrow contexts, never the
router: topic admin in router/topics.py, STATUS and SET_WORKERS in router/status.py, DESCRIBE
and LIST_OFFSETS in router/offsets.py, the group ops in router/groups.py, the share-group ops in
router/share.py (its state written once per loop, after the sockets are drained: ``flush``),
PRODUCE_DELAYED in router/timer.py (due batches taken every loop: ``poll``); worker liveness
(router/liveness.py) is a part the router holds.
"""

from __future__ import annotations

import logging
import struct
import time
from functools import partial
from typing import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from tailrace.broker import acl, auth, datadir
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog, stored_worker_count
from tailrace.broker.envelope import Envelope, refusal
from tailrace.broker.heap import HeapTrim
from tailrace.broker.reply_port import ReplyPort
from tailrace.broker.stats import StatsFile
from tailrace.client import ops
from tailrace.client import protocol as P

from . import status, topics
from .groups import Coordinator, GroupContext
from .share import ShareContext, ShareCoordinator
from .timer import Timer, TimerContext
from .links import WorkerLinks
from .liveness import HEARTBEAT_S, WorkerLiveness
from .offsets import AskContext, OffsetAsks
from .peers import PeerLinks
from .placement import Placement, next_generation
from .replicas import LeaderDuties, ReplicaFetcher
from .request import Request
from .scheduler import StickyScheduler
from .traffic import Traffic

log = logging.getLogger("tailrace.router")

DRAIN_MAX = 512
EXIT_OK = 0

# the routing-header checks of every client request (broker/envelope.py, over client/ops.py's SPEC)
ENVELOPE = Envelope("router")
# forward_many reads the partition list of a many-partition op's header (its SPEC row's request type), nothing else
_MANY = {row.op: (ops.DECODERS[row.op], row.bodies) for row in ops.SPEC if row.many}

Handler = Callable[[Request], None]


class DispatchError(Exception):
    """Raised when an op the router takes (client/ops.py SPEC) has no handler, or one it does
    not take has one."""


def dispatch_table(own: dict[int, Handler], by_served: dict[str, Handler]) -> dict[int, Handler]:
    """op -> handler for every SPEC row the router takes: a ``router`` row by its own handler
    (``own``), the others by who serves them (``by_served``: the owner, any worker, the group
    coordinator). A row without a handler, or a handler without a row, raises DispatchError."""
    table: dict[int, Handler] = {}
    for row in ops.SPEC:
        if row.served not in ops.AT_ROUTER:
            continue
        handler = own.get(row.op) if row.served == ops.ROUTER else by_served.get(row.served)
        if handler is None:
            raise DispatchError(f"op {row.op.name} ({int(row.op)}) is served by {row.served!r} at the router but has no handler")
        table[row.op] = handler
    stray = sorted(P.Op(op).name for op in own if ops.BY_OP[op].served != ops.ROUTER)
    if stray:
        raise DispatchError(f"handlers for ops the router does not serve itself: {', '.join(stray)}")
    return table


class Router:
    """The front door: client requests in, replies out, produce and fetch forwarded to owners.
    What each request does is its handler's (the module docstring's list)."""

    def __init__(self, s: settings_mod.Settings, ctx: zmq.Context | None = None, poller: zmq.Poller | None = None,
                 worker_keys=None, acls: acl.Acls | None = None):
        self.s = s
        self.catalog = Catalog(s.data_dir)
        count = stored_worker_count(s.data_dir) or s.workers  # workers 0..count-1 take partitions
        self.placement = Placement(self.catalog, StickyScheduler(count), next_generation(s.data_dir))
        # with --auth curve: the router's CURVE keys towards the workers (broker/auth.py)
        self.links = WorkerLinks(s, ctx, poller, worker_keys)
        self.traffic = Traffic()  # router/traffic.py: totals and rates from the heartbeats
        self.liveness = WorkerLiveness(s, count, self.placement, self.links, self.traffic)
        self.acls = acls  # with --auth curve: who may do what (broker/acl.py)
        self.cluster = None  # with --cluster: router/cluster_agent.py's ClusterAgent (set by main before serving)
        self.replicas: ReplicaFetcher | None = None  # with --cluster: the follower's copies (router/replicas.py)
        self.leaders: LeaderDuties | None = None  # with --cluster: the leader's side of them
        self.port: ReplyPort | None = None
        self.monitor: zmq.Socket | None = None
        self.clients = 0  # client connections to the front socket (its monitor's accepted - disconnected)
        self.forwarded = 0  # produce and fetch requests forwarded to workers
        self._internal_id = 0  # request ids of the router's own (offsets questions, group commits)
        self.stats = StatsFile(s.ipc_path(), datadir.ROUTER_ROLE)  # for the metrics exporter (broker/stats.py)
        self.topic_ctx = topics.TopicContext(s, self.catalog, self.placement, acls)
        self.status_ctx = status.StatusContext(s, self.catalog, self.placement, self.liveness, self.traffic, time.time(),
                                               forwarded=lambda: self.forwarded, clients=lambda: self.clients)
        self.asks = OffsetAsks(AskContext(s, self.catalog, self.placement, self.liveness, self.links,
                                          self.next_internal_id, lambda frames: self.port.send(frames)))
        self.groups = Coordinator(GroupContext(s, self.catalog, self.make_internal_topic, self.next_internal_id,
                                               self.send_internal))  # consumer groups (router/groups.py)
        self.shares = ShareCoordinator(ShareContext(s, self.catalog, self.make_internal_topic, self.next_internal_id,
                                                    self.send_internal, lambda frames: self.port.send(frames), acls))
        self.timer = Timer(TimerContext(s, self.catalog, self.make_internal_topic, self.next_internal_id,
                                        self.send_internal))  # delayed delivery (router/timer.py)
        self.queue_stats = StatsFile(s.ipc_path(), datadir.QUEUES_STATS)
        own = {**{op: partial(fn, self.topic_ctx) for op, fn in topics.HANDLERS.items()},
               **{op: partial(fn, self.status_ctx) for op, fn in status.HANDLERS.items()},
               P.Op.DESCRIBE_TOPIC: self.asks.ask, P.Op.FIND_COORDINATOR: self.groups.find,
               P.Op.PRODUCE_DELAYED: self.timer.produce}
        self.handlers = dispatch_table(own, {ops.OWNER: self.forward, ops.ANY_WORKER: self.asks.ask,
                                             ops.COORDINATOR: self.groups.serve, ops.SHARE: self.shares.serve})

    # --- front door ----------------------------------------------------------------------
    def on_client(self, frames: list[bytes], principal: str | None = None) -> None:
        ident = frames[0]
        routing = frames[1] if len(frames) > 1 else b""
        try:
            version, op, _c, partition, request_id, topic = P.unpack_routing(routing)
        except struct.error:
            self.port.send([ident, P.pack_routing(0, -1, 0, b"", P.ErrorCode.MALFORMED), P.encode(
                P.ErrorReply(f"first frame must be a {P.ROUTING_BYTES}-byte routing header, got {len(routing)} bytes"))])
            return

        def reply(code, body=None):
            self.port.send([ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), code),
                            P.encode(body) if body is not None else P.EMPTY_MAP])

        why = ENVELOPE.check(version, op, topic, len(frames) - 1)  # before forwarding; a worker checks again
        if why is not None:
            return reply(why[0], P.ErrorReply(why[1]))
        try:
            self.handlers[op](Request(ident, routing, op, partition, topic, frames, reply, principal))
        except P.DECODE_ERRORS as exc:
            reply(P.ErrorCode.MALFORMED, P.ErrorReply(f"undecodable header: {type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.exception("request op=%s failed", op)
            reply(P.ErrorCode.INTERNAL, P.ErrorReply(f"internal error: {type(exc).__name__}: {exc}"))

    def on_client_as(self, frames: list[bytes], principal: str) -> None:
        """A request from an authenticated connection (--auth curve): its principal's rules first."""
        refused = refusal(self.acls, principal, frames[:1], frames)  # broker/envelope.py, as a worker checks it
        if refused is not None:
            self.port.send(refused)
            return
        self.on_client(frames, principal)

    def refuse(self, frames: list[bytes]) -> None:
        """A request whose CURVE key is no longer in the allow-list: NOT_AUTHORIZED, nothing done."""
        self.port.send(auth.refusal(frames[:1], frames[1] if len(frames) > 1 else b"",
                                    "this client's key is not in the broker's allow-list"))

    def forward(self, req: Request) -> None:
        """The handler of the OWNER rows (produce, fetch): to the partition's owner, unread; a
        many-partition op (its row's ``many``) by ``forward_many``."""
        if req.op in _MANY:
            return self.forward_many(req)
        if self.cluster is not None:
            refused = self.cluster.refusal(req.topic, req.partition)
            if refused is not None:
                return req.reply(P.ErrorCode.NOT_LEADER_OR_FOLLOWER, P.ErrorReply(refused[0], endpoint=refused[1]))
        route = self.placement.route(req.topic, req.partition)
        if route is None and self.cluster is not None and topics.mirror_topic(self.topic_ctx, req.name) is not None:
            route = self.placement.route(req.topic, req.partition)  # a cluster topic not mirrored yet: now it is
        if route is None:
            code = P.ErrorCode.UNKNOWN_TOPIC if self.catalog.get(req.name) is None else P.ErrorCode.UNKNOWN_PARTITION
            return req.reply(code, P.ErrorReply(f"unknown topic or partition: topic={req.name!r} partition={req.partition}"))
        worker, assign = route
        self.forwarded += 1
        if self.leaders is not None:
            self.leaders.ensure(req.topic, req.partition)  # a replicated partition's worker knows its followers first
        self.placement.told[(req.topic, req.partition)] = assign
        # with --auth curve the owner hears who the client is (its quotas, broker/quota.py)
        said = assign if req.principal is None else assign + req.principal.encode()
        self.links.send(worker, [req.ident, said, *req.frames[1:]])

    def forward_many(self, req: Request) -> None:
        """The handler of the many-partition OWNER rows (PRODUCE_MULTI, FETCH_MULTI): to the owner
        of the routing header's partition (when >= 0) or of the first listed partition it knows,
        with the entry count and one assign entry per listed partition; a partition that worker
        does not own gets ``NO_SLOT`` and its code (UNKNOWN_PARTITION, NOT_OWNER), which the
        worker answers for it. The header is decoded for its partition list only; batches are
        not read."""
        dec, bodies = _MANY[req.op]
        parts = dec.decode(req.frames[2]).partitions
        if len(parts) > P.MAX_REQUEST_PARTITIONS:
            return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"{len(parts)} partitions: at most {P.MAX_REQUEST_PARTITIONS} a request"))
        if bodies and len(parts) != len(req.frames) - 3:  # the worker checks the rest (acks, a partition twice)
            return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"header lists {len(parts)} partitions for {len(req.frames) - 3} batch frames: one batch frame per partition"))
        routes = [self.placement.route(req.topic, p) for p in parts]
        led = None
        if self.cluster is not None and self.cluster.managed(req.topic):
            led = [self.cluster.leads(req.topic, p) for p in parts]
            routes = [r if ok else None for r, ok in zip(routes, led)]
        # the owner of the routing header's partition (a fetch session may list none), else of the first known one
        first = self.placement.route(req.topic, req.partition) if req.partition >= 0 else None
        first = first or next((r for r in routes if r is not None), None)
        if first is None and led is not None:
            return req.reply(P.ErrorCode.NOT_LEADER_OR_FOLLOWER, P.ErrorReply(
                f"broker {self.cluster.me} leads none of partitions {parts[:8]} of topic {req.name!r}"))
        if first is None:
            code = P.ErrorCode.UNKNOWN_TOPIC if self.catalog.get(req.name) is None else P.ErrorCode.UNKNOWN_PARTITION
            return req.reply(code, P.ErrorReply(f"unknown topic or partitions: topic={req.name!r} partitions={parts[:8]}"))
        worker = first[0]
        entries = []
        told = self.placement.told
        for i, (p, r) in enumerate(zip(parts, routes)):
            if r is None and led is not None and not led[i] and self.cluster.assignment(req.topic, p) is not None:
                entries.append(P.ASSIGN.pack(P.NO_SLOT, P.ErrorCode.NOT_LEADER_OR_FOLLOWER))
            elif r is None:
                entries.append(P.ASSIGN.pack(P.NO_SLOT, P.ErrorCode.UNKNOWN_PARTITION))
            elif r[0] != worker:
                entries.append(P.ASSIGN.pack(P.NO_SLOT, P.ErrorCode.NOT_OWNER))
            else:
                entries.append(r[1])
                told[(req.topic, p)] = r[1]
                if self.leaders is not None:
                    self.leaders.ensure(req.topic, p)
        self.forwarded += 1
        said = P.ASSIGN_COUNT.pack(len(entries)) + b"".join(entries)
        if req.principal is not None:
            said += req.principal.encode()
        self.links.send(worker, [req.ident, said, *req.frames[1:]])

    # --- the cluster (--cluster): router/cluster_agent.py ----------------------------------
    def attach_cluster(self, agent) -> None:
        self.cluster = agent
        self.topic_ctx.cluster = agent
        self.status_ctx.cluster = agent
        peers = PeerLinks(self.links.ctx, self.links.poller, self.links.keys)
        self.asks.attach_cluster(agent, peers, partial(topics.mirror_topic, self.topic_ctx))
        self.groups.attach_cluster(agent, peers)
        self.shares.attach_cluster(agent, peers, partial(topics.mirror_topic, self.topic_ctx))
        self.timer.attach_cluster(agent, peers, partial(topics.mirror_topic, self.topic_ctx))
        self.replicas = agent.fetcher = ReplicaFetcher(agent, peers, self.send_internal, self.next_internal_id,
                                                       partial(topics.mirror_topic, self.topic_ctx))
        self.status_ctx.replicas = self.replicas
        self.leaders = LeaderDuties(agent, self.placement, self.catalog, self.send_internal,
                                    lambda w: self.traffic.current.get(w, (0,))[0], self.s.replica_lag_time_max_ms)

    def mirror(self) -> None:
        """Take the cluster topics whose metadata changed into the catalog (router/topics.py)."""
        changed, full = self.cluster.take_changes()
        if full:  # deleted in the cluster while this broker was down or cut off: its cluster topics etcd lacks
            gone = {t.name for t in self.catalog.data.topics.values() if t.cluster_id and t.name not in self.cluster.topics}
            if gone and not self.cluster.topics:  # an etcd with no topic at all: more likely emptied than all deleted
                log.error("cluster: etcd lists no topic; this broker's %d cluster topics are kept (delete them through "
                          "the cluster once it is known they are gone)", len(gone))
            else:
                changed |= gone
        for name in sorted(changed):
            topics.mirror_topic(self.topic_ctx, name, watched=True)
        if changed or full:
            self.replicas.tick()  # partitions to follow now, or no longer
            self.leaders.tick()  # replicated partitions led here: their workers told

    # --- the router's own requests (the group coordinator's, offsets questions) -----------
    def next_internal_id(self) -> int:
        self._internal_id += 1
        return self._internal_id

    def send_internal(self, topic: bytes, partition: int, frames: list[bytes]) -> bool:
        """Send a request of the router's own (router/groups.py) to the partition's owner; its
        reply comes back to ``on_internal_reply``. False if the partition has no route."""
        route = self.placement.route(topic, partition)
        if route is None or route[0] not in self.links:
            return False
        worker, assign = route
        self.placement.told[(topic, partition)] = assign
        self.links.send(worker, [b"", assign, *frames])
        return True

    def make_internal_topic(self, name: str, partitions: int, config: dict[str, int]):
        """Create a topic of the broker's own (``__consumer_offsets``); None if it does not fit."""
        entry, why = topics.add_topic(self.topic_ctx, name, partitions, self.s.ring_bytes, config)
        if entry is None:
            log.error("internal topic %r not created: %s", name, why)
            return None
        log.info("internal topic %r created", name)
        return entry

    def on_worker_reply(self, frames: list[bytes]) -> None:
        """A reply from a worker: to its client as it is, or to the router itself (empty id)."""
        if frames[0]:
            self.port.send(frames)
        elif len(frames) >= 3:
            try:
                self.on_internal_reply(frames)
            except Exception:  # noqa: BLE001 - a bug answering one question must not take the router down
                log.exception("router: a worker's reply to an internal request failed")

    def on_internal_reply(self, frames: list[bytes]) -> None:
        _v, op, code, _p, rid, topic = P.unpack_routing(frames[1])
        if op == P.Op.PING:
            info = self.liveness.on_ping_reply(frames[2])
            if self.leaders is not None and info.isr:
                self.leaders.on_ping(info)
        elif op == P.Op.LEADER_AND_ISR:
            pass
        elif op == P.Op.REPLICA_APPEND and self.replicas is not None:
            self.replicas.on_local_reply(rid, code, frames)
        elif op in (P.Op.PRODUCE, P.Op.FETCH):
            try:
                (self.groups.on_reply(rid, op, code, frames[1:]) or self.shares.on_reply(rid, op, code, frames[1:])
                 or self.timer.on_reply(rid, op, code, frames[1:]))
            except Exception:  # a coordinator bug must not take the router down with it
                log.exception("group or share coordinator: reply to internal request %d failed", rid)
        elif op != P.Op.ADOPT:
            self.asks.on_reply(rid, code, topic, frames[2])

    def tick(self, now: float) -> None:
        """Once per HEARTBEAT_S: liveness, questions unanswered, group sessions, client count."""
        self.liveness.tick()
        self.asks.again()
        try:
            self.groups.tick(now)
        except Exception:  # noqa: BLE001 - as above: the router keeps serving
            log.exception("group coordinator tick failed")
        try:
            self.shares.tick(now)
        except Exception:  # noqa: BLE001 - as above
            log.exception("share coordinator tick failed")
        try:
            self.timer.tick(now)
            self.queue_stats.maybe_write(self.queue_parts)
        except Exception:  # noqa: BLE001 - as above
            log.exception("timer tick failed")
        if self.acls is not None:
            self.acls.refresh()
        if self.cluster is not None:
            rates = self.traffic.rates()
            self.cluster.measured(rates["bytes_in"], rates["bytes_out"])
            self.asks.peers.expire(30.0)
            self.replicas.tick()
            self.leaders.tick()
        self.count_clients()
        self.stats.maybe_write(partial(status.stats_parts, self.status_ctx))

    def queue_parts(self) -> tuple[dict, dict, dict]:
        counters, gauges = self.shares.stats_parts()
        counters["delayed_delivered_batches"] = {"": self.timer.delivered}
        gauges["delayed_backlog_batches"] = {"": self.timer.backlog()}
        return counters, gauges, {}

    def count_clients(self) -> None:
        """Drain the front socket's monitor: connections accepted and gone."""
        if self.monitor is None:
            return
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_ACCEPTED:
                self.clients += 1
            elif event == zmq.EVENT_DISCONNECTED:
                self.clients = max(0, self.clients - 1)


def open_front(ctx: zmq.Context, s: settings_mod.Settings, curve: bool) -> zmq.Socket:
    """The clients' ROUTER socket, bound (with --auth curve, a CURVE server)."""
    front = ctx.socket(zmq.ROUTER)
    if curve:
        auth.make_server(front, s.data_dir)
    ReplyPort.configure(front)
    front.setsockopt(zmq.RCVHWM, 100_000)
    front.setsockopt(zmq.MAXMSGSIZE, s.max_frame_bytes)  # a larger part drops the peer, unread
    return front


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s router %(levelname)s %(message)s")
    s = settings_mod.from_env()
    claim = datadir.enter_program(s, datadir.ROUTER_ROLE, log)
    if claim is None:
        return datadir.EXIT_REFUSED
    stop: list = []
    datadir.stop_on_signals(stop)
    ctx, poller = zmq.Context(), zmq.Poller()
    guard = None
    if s.auth == "curve":
        guard = auth.Guard(ctx, s.data_dir, auth.allow_dir_of(s), with_router=False)
        router = Router(s, ctx, poller, auth.router_client_keys(s.data_dir), acl.Acls(s.data_dir))
    else:
        router = Router(s, ctx, poller)
        if not auth.is_loopback(s.bind):
            log.warning("INSECURE: %s listens beyond this host without authentication (--insecure); anyone who "
                        "reaches it can read, write and administer everything", s.bind)
    if s.cluster:
        from .cluster_agent import ClusterAgent, wait_synced  # a single host never imports etcd's client
        try:
            router.attach_cluster(ClusterAgent(s).start())
        except Exception as exc:  # noqa: BLE001 - etcd unreachable, the id taken: said, and supervisord tries again
            log.error("cluster %s at %s: cannot join: %s: %s", s.cluster_name, s.cluster, type(exc).__name__, exc)
            return datadir.EXIT_REFUSED if type(exc).__name__ in ("BrokerIdInUse", "ClusterKeyMismatch", "ClusterIdentityMismatch") else 1
        if not wait_synced(router.cluster, 10.0):
            log.warning("cluster: the metadata was not read within 10 s; serving what the catalog holds")
        router.mirror()
    front = open_front(ctx, s, guard is not None)
    router.monitor = front.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    front.bind(s.bind)
    router.port = ReplyPort(front, log, "router")
    poller.register(front, zmq.POLLIN)
    if guard is not None:
        poller.register(guard.zap.zap_socket, zmq.POLLIN)
    for w in range(router.liveness.count):
        router.links.connect(w)
    log.info("router serving on %s with %d workers (generation %d, auth %s)", s.bind, router.liveness.count,
             router.placement.generation, s.auth)
    last_tick = 0.0
    heap, worked = HeapTrim(), False  # freed heap given back once the router goes quiet (broker/heap.py)
    while not stop:
        events = dict(poller.poll(2 if router.port.backlog else 100))
        if guard is not None and guard.zap.zap_socket in events:
            guard.zap.service()
        if front in events:
            worked = True
            if guard is None:
                P.drain(front, router.on_client, DRAIN_MAX)
            else:
                guard.drain(front, router.on_client_as, router.refuse, DRAIN_MAX)
        for d in list(router.links.dealers.values()):
            if d in events:
                P.drain(d, router.on_worker_reply, DRAIN_MAX)
        if router.asks.peers is not None:
            for ep, sock in list(router.asks.peers.socks.items()):
                if sock in events:
                    P.drain(sock, partial(router.asks.peers.on_reply, ep), DRAIN_MAX)
            for ep, mon in list(router.asks.peers.monitors.items()):
                if mon in events and router.asks.peers.on_monitor(ep):
                    log.info("cluster: %s refused our CURVE handshake (it had not seen our registration yet): "
                             "connecting again at the next question", ep)
        if router.shares.write_due:
            try:
                router.shares.flush()  # one state write per share group per loop, for every request waiting on it
            except Exception:  # noqa: BLE001 - the router keeps serving
                log.exception("share coordinator flush failed")
        if router.port.backlog:
            router.port.flush()
        if router.cluster is not None:
            router.mirror()
        now = time.monotonic()
        if router.shares.parked:
            try:
                router.shares.poll(now)  # share fetches whose wait ended
            except Exception:  # noqa: BLE001 - the router keeps serving
                log.exception("share coordinator poll failed")
        try:
            router.timer.poll(int(time.time() * 1000))  # delayed batches now due
        except Exception:  # noqa: BLE001 - the router keeps serving
            log.exception("timer poll failed")
        if now - last_tick > HEARTBEAT_S:
            if guard is not None:
                if router.cluster is not None:  # the other brokers' routers, as their registrations say
                    guard.allow.set_fixed(router.cluster.broker_keys())
                guard.allow.refresh()
            router.tick(now)
            last_tick = now
            heap.maybe(now, worked)
            worked = False
    if router.cluster is not None:
        router.cluster.stop()
        router.asks.peers.close()
    front.disable_monitor()
    router.monitor.close(0)
    front.close(0)
    router.links.close()
    if guard is not None:
        guard.close()
    ctx.term()
    datadir.leave_program(claim)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
