"""The router process: the front door. Reads only routing headers, forwards, serves metadata.

Sockets: a ROUTER bound at ``settings.bind`` (default tcp://127.0.0.1:7420) for clients, and one
DEALER per worker (identity ``b"router"``) connected to ``ipc://<ipc_dir>/worker-<i>.ipc``.

For produce and fetch it looks up the partition's slot in the catalog and its owner in the
sticky scheduler, and forwards ``[client_id, assign, routing, header, body...]`` to the owner
(``assign`` = slot and owner epoch, so a restarted worker adopts the partition with no other
handshake). Replies come back on the DEALER as ``[client_id, routing, ...]`` and go out as they
are. It never decodes frame 1 or 2 of a produce or fetch.

Metadata (create, list, describe topics; status) is served here; topic definitions are written
durably by ``Catalog.add_topic`` before the reply.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from tailrace.broker import acl, auth, datadir
from tailrace.broker.reply_port import ReplyPort
from tailrace.broker.datadir import ROUTER_FILE, journal_usage, write_atomic
from tailrace.broker.envelope import Envelope, refusal
from tailrace.broker.stats import StatsFile, flusher_disk
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import INTERNAL_TOPICS, Catalog, internal_topic_refusal, stored_worker_count, valid_topic_name
from tailrace.persistence.recovery import data_dir_id
from tailrace.persistence.retire import free_slots
from tailrace.shm.layout import ring_region_bytes

from .groups import Coordinator
from .traffic import Traffic
from .liveness import HEARTBEAT_S, MAX_WORKERS, WorkerLiveness
from .scheduler import StickyScheduler


log = logging.getLogger("tailrace.router")

DRAIN_MAX = 512
ASK_RETRY_S = 1.0  # an offsets question unanswered this long goes again, to another worker if one answers
ASK_TRIES = 5  # then the client hears NOT_READY (retriable) instead of waiting out its own timeout
MAX_PARTITIONS = 1024
MIN_RING_BYTES = 64 * 1024
EXIT_OK = 0

_create_dec = P.decoder(P.CreateTopicRequest)
_set_workers_dec = P.decoder(P.SetWorkersRequest)
_create_partitions_dec = P.decoder(P.CreatePartitionsRequest)
_alter_configs_dec = P.decoder(P.AlterConfigsRequest)
_list_offsets_dec = P.decoder(P.ListOffsetsReply)
_list_topics_dec = P.decoder(P.ListTopicsRequest)

# the routing-header checks of every client request (broker/envelope.py, over client/ops.py's SPEC)
ENVELOPE = Envelope("router")


# topic admin refused on the broker's own topics (INTERNAL_TOPIC), with what it would do
TOPIC_ADMIN = {P.Op.CREATE_TOPIC: "created", P.Op.CREATE_PARTITIONS: "altered", P.Op.ALTER_CONFIGS: "altered", P.Op.DELETE_TOPIC: "deleted"}

GROUP_OPS = ops.GROUP_OPS  # answered by the group coordinator (router/groups.py)


def next_generation(data_dir: str) -> int:
    """Bump and durably store the router generation: owner epochs only ever grow."""
    path = Path(data_dir) / ROUTER_FILE
    try:
        gen = int(json.loads(path.read_text())["generation"]) + 1
    except (FileNotFoundError, ValueError, KeyError):
        gen = 1
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"generation": gen}).encode())
    return gen


class Router(WorkerLiveness):
    """The front door: client requests, replies, forwarding to owners, topic metadata. Worker
    liveness and placement over time are router/liveness.py's."""

    def __init__(self, s: settings_mod.Settings):
        self.s = s
        self.data_id = 0  # the data directory's identity (for DESCRIBE), once the flusher made it
        self.catalog = Catalog(s.data_dir)
        self.count = stored_worker_count(s.data_dir) or s.workers  # workers 0..count-1 take partitions
        self.scheduler = StickyScheduler(self.count)
        self.generation = next_generation(s.data_dir)
        self._epoch_counter = 0
        self.routes: dict[tuple[bytes, int], tuple[int, bytes]] = {}  # (topic, partition) -> (worker, assign frame)
        # internal request id -> [client id, routing, topic, worker asked, when, tries, header]: offsets
        # questions on their way to a worker, asked again while unanswered (ask_again)
        self.pending: dict[int, list] = {}
        self._internal_id = 0
        self.front: zmq.Socket | None = None
        self.port: ReplyPort | None = None
        self.ctx: zmq.Context | None = None
        self.poller: zmq.Poller | None = None
        self.dealers: dict[int, zmq.Socket] = {}  # worker -> DEALER connected to its endpoint
        WorkerLiveness.__init__(self, s)
        self.started = time.time()
        self.traffic = Traffic()  # router/traffic.py: totals and rates from the heartbeats
        self.stats = StatsFile(s.ipc_path(), "router")  # for the metrics exporter (broker/stats.py)
        self.clients = 0  # client connections to the front socket (its monitor's accepted - disconnected)
        self.monitor: zmq.Socket | None = None
        self.worker_keys = None  # with --auth curve: the router's CURVE keys towards the workers (broker/auth.py)
        self.acls: acl.Acls | None = None  # with --auth curve: who may do what (broker/acl.py)
        self.principal: str | None = None  # the authenticated principal of the request being served
        self.forwarded = 0  # produce and fetch requests forwarded to workers
        # (topic, partition) -> the assignment its owner was last sent (a forwarded request or an
        # ADOPT): equal to the route's means the owner has adopted it, or will with the request
        # already on its way; DESCRIBE says so, and clients then go to the owner from the start.
        self.told: dict[tuple[bytes, int], bytes] = {}
        for name in sorted(self.catalog.data.topics, key=lambda n: self.catalog.data.topics[n].topic_id):
            self._place_topic(name)
        self.groups = Coordinator(self)  # consumer groups (router/groups.py)

    def _info(self, t) -> P.TopicInfo:
        """A topic as clients see it, with its effective settings (its own, else the broker's)."""
        config = {"retention.ms": str(t.config.get("retention.ms", self.s.retention_ms)),
                  "retention.bytes": str(t.config.get("retention.bytes", self.s.retention_bytes)), "ring.bytes": str(t.ring_bytes)}
        return P.TopicInfo(t.name, t.topic_id, t.partitions, t.ring_bytes, config)

    def _epoch(self) -> int:
        self._epoch_counter += 1
        return (self.generation << 32) | self._epoch_counter

    def _place_topic(self, name: str, first: int = 0) -> None:
        """Place the topic's partitions from ``first`` on (the others keep their routes)."""
        t = self.catalog.get(name)
        tb = name.encode()
        for p, slot in enumerate(t.slots[first:], start=first):
            w = self.scheduler.place(slot)
            self.routes[(tb, p)] = (w, P.ASSIGN.pack(slot, self._epoch()))

    # --- front door ----------------------------------------------------------------------
    def on_client(self, frames: list[bytes]) -> None:
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
        if op in ops.FORWARDED:
            route = self.routes.get((topic, partition))
            if route is None:
                self._refresh_routes()
                route = self.routes.get((topic, partition))
            if route is None:
                name = topic.decode("utf-8", "replace")
                code = P.ErrorCode.UNKNOWN_TOPIC if self.catalog.get(name) is None else P.ErrorCode.UNKNOWN_PARTITION
                return reply(code, P.ErrorReply(f"unknown topic or partition: topic={name!r} partition={partition}"))
            worker, assign = route
            self.forwarded += 1
            self.told[(topic, partition)] = assign
            # with --auth curve the owner hears who the client is (its quotas, broker/quota.py)
            said = assign if self.principal is None else assign + self.principal.encode()
            P.send_frames(self.dealers[worker], [ident, said, *frames[1:]])
            return
        try:
            if op in TOPIC_ADMIN and (why := internal_topic_refusal(topic.decode("utf-8", "replace"), TOPIC_ADMIN[op])):
                reply(P.ErrorCode.INTERNAL_TOPIC, P.ErrorReply(why))
            elif op == P.Op.CREATE_TOPIC:
                self.create_topic(topic, frames, reply)
            elif op == P.Op.LIST_TOPICS:
                internal = len(frames) > 2 and _list_topics_dec.decode(frames[2]).internal
                topics = [t for t in self.catalog.data.topics.values() if internal or t.name not in INTERNAL_TOPICS]
                if self.principal is not None and self.acls is not None and self.acls.enabled:  # what it may describe
                    topics = [t for t in topics if self.acls.may_describe(self.principal, t.name)]
                reply(P.ErrorCode.OK, P.ListTopicsReply([self._info(t) for t in topics]))
            elif op == P.Op.DESCRIBE_TOPIC or op == P.Op.LIST_OFFSETS:
                header = frames[2] if op == P.Op.LIST_OFFSETS and len(frames) > 2 else P.EMPTY_MAP
                self.ask_offsets(ident, routing, topic, header, reply)
            elif op == P.Op.STATUS:
                reply(P.ErrorCode.OK, self.status())
            elif op == P.Op.CREATE_PARTITIONS:
                self.create_partitions(topic, frames, reply)
            elif op == P.Op.ALTER_CONFIGS:
                self.alter_configs(topic, frames, reply)
            elif op == P.Op.DELETE_TOPIC:
                self.delete_topic(topic, reply)
            elif op in GROUP_OPS:
                self.groups.handle(op, topic.decode("utf-8", "replace"), frames[2], reply)
            else:  # SET_WORKERS: the envelope let no other op through
                n = _set_workers_dec.decode(frames[2]).workers
                if not 1 <= n <= MAX_WORKERS:
                    return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"workers={n} must be 1..{MAX_WORKERS}"))
                self.set_workers(n)
                reply(P.ErrorCode.OK, self.status())
        except P.DECODE_ERRORS as exc:
            reply(P.ErrorCode.MALFORMED, P.ErrorReply(f"undecodable header: {type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.exception("metadata request op=%s failed", op)
            reply(P.ErrorCode.INTERNAL, P.ErrorReply(f"internal error: {type(exc).__name__}: {exc}"))

    def on_client_as(self, frames: list[bytes], principal: str) -> None:
        """A request from an authenticated connection (--auth curve): its principal's rules first."""
        refused = refusal(self.acls, principal, frames[:1], frames)  # broker/envelope.py, as a worker checks it
        if refused is not None:
            self.port.send(refused)
            return
        self.principal = principal
        try:
            self.on_client(frames)
        finally:
            self.principal = None

    def refuse(self, frames: list[bytes]) -> None:
        """A request whose CURVE key is no longer in the allow-list: NOT_AUTHORIZED, nothing done."""
        self.port.send(auth.refusal(frames[:1], frames[1] if len(frames) > 1 else b"",
                                    "this client's key is not in the broker's allow-list"))

    def _refresh_routes(self) -> None:
        if self.catalog.reload():
            for name in self.catalog.data.topics:
                if (name.encode(), 0) not in self.routes:
                    self._place_topic(name)

    def create_topic(self, topic: bytes, frames, reply) -> None:
        req = _create_dec.decode(frames[2])
        name = topic.decode("utf-8", "replace")
        config, why = check_config(req.config, creating=True)
        if why is not None:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(why))
        if "ring.bytes" in config:
            if req.ring_bytes and req.ring_bytes != config["ring.bytes"]:
                return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("ring_bytes and config ring.bytes disagree"))
            req.ring_bytes = config.pop("ring.bytes")
        if not valid_topic_name(name):
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"bad topic name {name!r}: 1-{P.MAX_TOPIC_BYTES} UTF-8 bytes of letters, digits, '.', '_', '-', not '.' or '..'"))
        if self.catalog.get(name) is not None:
            return reply(P.ErrorCode.TOPIC_EXISTS, P.ErrorReply(f"topic {name!r} exists"))
        if not 1 <= req.partitions <= MAX_PARTITIONS:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"partitions={req.partitions} must be 1..{MAX_PARTITIONS}"))
        ring = req.ring_bytes or self.s.ring_bytes
        if ring < MIN_RING_BYTES or ring % 4096 or ring < 2 * self.s.max_batch_bytes:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"ring_bytes={ring} must be a multiple of 4096, >= {MIN_RING_BYTES} and >= 2 x max_batch_bytes ({self.s.max_batch_bytes})"))
        entry, why = self._add_topic(name, req.partitions, ring, config)
        if entry is None:
            return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(why))
        reply(P.ErrorCode.OK, self._info(entry))

    def _add_topic(self, name: str, partitions: int, ring: int, config: dict[str, int]):
        """Add a checked topic where the shared-memory budget and the slots allow: (its entry,
        None), written durably, its files made and its partitions placed; or (None, why not)."""
        used = self.catalog.shm_bytes(ring_region_bytes)
        need = partitions * ring_region_bytes(ring)
        if used + need > self.s.shm_budget_bytes:
            return None, f"topic {name!r} needs {need} bytes of shared memory; {used} of the budget {self.s.shm_budget_bytes} are in use"
        free = free_slots(self.catalog, self.s)
        if self.catalog.slots_available(self.s.max_slots, free) < partitions:
            return None, f"no free partition slots (max_slots={self.s.max_slots}; a deleted topic's are free within a second)"
        entry = self.catalog.add_topic(name, partitions, ring, config, free)
        self._prepare_slots(entry.slots)
        self._place_topic(name)
        return entry, None

    def create_partitions(self, topic: bytes, frames, reply) -> None:
        """Grow a topic (Kafka's CreatePartitions: to a new total, never down). The catalog is
        written before the reply; the new partitions are placed like a new topic's."""
        total = _create_partitions_dec.decode(frames[2]).partitions
        name = topic.decode("utf-8", "replace")
        t = self.catalog.get(name)
        if t is None:
            return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        if not t.partitions < total <= MAX_PARTITIONS:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"partitions={total}: a topic only grows; topic {name!r} has {t.partitions}, at most {MAX_PARTITIONS}"))
        need = (total - t.partitions) * ring_region_bytes(t.ring_bytes)
        used = self.catalog.shm_bytes(ring_region_bytes)
        if used + need > self.s.shm_budget_bytes:
            return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(
                f"{total - t.partitions} more partitions of topic {name!r} need {need} bytes of shared memory; "
                f"{used} of the budget {self.s.shm_budget_bytes} are in use"))
        free = free_slots(self.catalog, self.s)
        if self.catalog.slots_available(self.s.max_slots, free) < total - t.partitions:
            return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(f"no free partition slots (max_slots={self.s.max_slots})"))
        old = t.partitions
        entry = self.catalog.add_partitions(name, total, free)
        self._prepare_slots(entry.slots[old:])
        self._place_topic(name, first=old)
        log.info("topic %r grown from %d to %d partitions", name, old, total)
        reply(P.ErrorCode.OK, self._info(entry))

    def delete_topic(self, topic: bytes, reply) -> None:
        """Delete a topic (Kafka's DeleteTopics). The catalog without it, its slots retired, is
        written durably before the reply: that is the deletion. From then on the router answers
        its requests UNKNOWN_TOPIC, the workers drop its actors at their next catalog check, and
        the flusher clears its slots (persistence/retire.py); recovery skips its journal batches."""
        name = topic.decode("utf-8", "replace")
        self.catalog.reload()
        t = self.catalog.get(name)
        if t is None:
            return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        self.catalog.delete_topic(name)
        for p, slot in enumerate(t.slots):
            self.routes.pop((topic, p), None)
            self.told.pop((topic, p), None)
            self.scheduler.release(slot)
        log.info("topic %r deleted (id %d, slots %s)", name, t.topic_id, t.slots)
        reply(P.ErrorCode.OK, self._info(t))

    def next_internal_id(self) -> int:
        self._internal_id += 1
        return self._internal_id

    def send_internal(self, topic: bytes, partition: int, frames: list[bytes]) -> bool:
        """Send a request of the router's own (router/groups.py) to the partition's owner; its
        reply comes back to ``on_internal_reply``. False if the partition has no route."""
        route = self.routes.get((topic, partition))
        if route is None:
            self._refresh_routes()
            route = self.routes.get((topic, partition))
        if route is None or route[0] not in self.dealers:
            return False
        worker, assign = route
        self.told[(topic, partition)] = assign
        P.send_frames(self.dealers[worker], [b"", assign, *frames])
        return True

    def make_internal_topic(self, name: str, partitions: int, config: dict[str, int]):
        """Create a topic of the broker's own (``__consumer_offsets``); None if it does not fit."""
        entry, why = self._add_topic(name, partitions, self.s.ring_bytes, config)
        if entry is None:
            log.error("internal topic %r not created: %s", name, why)
            return None
        log.info("internal topic %r created", name)
        return entry

    def _prepare_slots(self, slots) -> None:
        """Make new partitions' index and lock files now, with the topic: a file created on the
        data directory's filesystem costs about 0.2 ms here, and the first write to 1,000 fresh
        partitions paid 0.4 s for them. Empty files; their owners open them as they would."""
        index_dir = os.path.join(self.s.data_dir, datadir.INDEX_DIR)
        os.makedirs(index_dir, exist_ok=True)
        for slot in slots:
            for path, mode in ((os.path.join(index_dir, datadir.index_name(slot)), 0o666),
                               (os.path.join(self.s.ipc_path(), datadir.slot_lock_name(slot)), 0o600)):
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, mode))
                except OSError as exc:  # the owner makes it then: only slower
                    log.warning("could not make %s ahead: %s", path, exc)

    def alter_configs(self, topic: bytes, frames, reply) -> None:
        """Set or reset a topic's settings, durably before the reply; the flusher applies
        retention.ms at its next pass."""
        req = _alter_configs_dec.decode(frames[2])
        name = topic.decode("utf-8", "replace")
        if self.catalog.get(name) is None:
            return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        config, why = check_config(req.config, creating=False)
        if why is not None:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(why))
        entry = self.catalog.set_config(name, config)
        log.info("topic %r settings changed: %s", name, config)
        reply(P.ErrorCode.OK, self._info(entry))

    def ask_offsets(self, ident, routing, topic, header, reply) -> None:
        """Offsets live in shared memory, which workers read: ask one, merge owners in."""
        name = topic.decode("utf-8", "replace")
        if self.catalog.get(name) is None:
            self.catalog.reload()
            if self.catalog.get(name) is None:
                return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        self._internal_id += 1
        rid = self._internal_id
        worker = self._offsets_worker(topic, None)
        self.pending[rid] = [ident, routing, name, worker, time.monotonic(), 1, header]
        self._send_ask(rid, worker, topic, header)

    def _offsets_worker(self, topic: bytes, avoid: int | None) -> int:
        """Any worker reads offsets from shared memory: the owner of partition 0 if it answers
        heartbeats, else another that does (never ``avoid``, the one that left a question
        unanswered, when there is a choice)."""
        now = time.monotonic()
        owner = self.routes[(topic, 0)][0] if (topic, 0) in self.routes else min(self.dealers)

        def fresh(w: int) -> bool:  # answered one of the last heartbeats (long before it is declared dead)
            return w != avoid and self._answering(w, now) and now - self.last_pong.get(w, 0.0) < 3 * HEARTBEAT_S

        if fresh(owner):
            return owner
        others = [w for w in sorted(self.dealers) if fresh(w)]
        if others:
            return others[0]
        return owner if owner in self.dealers else min(self.dealers)

    def _send_ask(self, rid: int, worker: int, topic: bytes, header: bytes) -> None:
        P.send_frames(self.dealers[worker], [b"", b"\0" * P.ASSIGN.size, P.pack_routing(P.Op.LIST_OFFSETS, -1, rid, topic), header])

    def ask_again(self) -> None:
        """Offsets questions a worker did not answer: its process may have died with the question
        in its socket (a kill -9 before the router declared it dead). Reading offsets changes
        nothing, so ask again, elsewhere if possible; after ASK_TRIES tell the client NOT_READY."""
        now = time.monotonic()
        for rid, ask in list(self.pending.items()):
            ident, routing, name, worker, sent, tries, header = ask
            if now - sent < ASK_RETRY_S:
                continue
            _v, op, _c, partition, request_id, topic = P.unpack_routing(routing)
            if tries >= ASK_TRIES or (topic, 0) not in self.routes:
                del self.pending[rid]
                self.port.send([ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), P.ErrorCode.NOT_READY),
                                P.encode(P.ErrorReply(f"no worker answered for the offsets of topic {name!r} in {tries} tries"))])
                continue
            w = self._offsets_worker(topic, worker)
            log.warning("offsets of topic %r unanswered by worker %d for %.1f s: asking worker %d", name, worker, now - sent, w)
            ask[3:6] = [w, now, tries + 1]
            self._send_ask(rid, w, topic, header)

    def on_worker_reply(self, frames: list[bytes]) -> None:
        """A reply from a worker: to its client as it is, or to the router itself (empty id)."""
        if frames[0]:
            self.port.send(frames)
        elif len(frames) >= 3:
            self.on_internal_reply(frames)

    def on_internal_reply(self, frames: list[bytes]) -> None:
        _v, op, code, _p, rid, topic = P.unpack_routing(frames[1])
        if op == P.Op.PING:
            self.on_ping_reply(frames[2])
            return
        if op == P.Op.ADOPT:
            return
        if op in (P.Op.PRODUCE, P.Op.FETCH):
            try:
                self.groups.on_reply(rid, op, code, frames[1:])
            except Exception:  # a coordinator bug must not take the router down with it
                log.exception("group coordinator: reply to internal request %d failed", rid)
            return
        pending = self.pending.pop(rid, None)
        if pending is None:
            return
        ident, routing, name = pending[:3]
        _v, client_op, _c, partition, request_id, _t = P.unpack_routing(routing)
        head = P.pack_routing(client_op, partition, request_id, topic, code)
        if code != P.ErrorCode.OK or client_op == P.Op.LIST_OFFSETS:
            self.port.send([ident, head, frames[2]])
            return
        offsets = _list_offsets_dec.decode(frames[2])
        t = self.catalog.get(name)
        parts = []
        for po in offsets.partitions:
            w, assign = self.routes[(topic, po.partition)]
            parts.append(P.PartitionInfo(po.partition, w, self.s.worker_endpoint(w), po.log_start_offset, po.high_watermark,
                                         po.durable_watermark, adopted=self.told.get((topic, po.partition)) == assign,
                                         slot=t.slots[po.partition], local_endpoint=self.s.worker_unix_endpoint(w),
                                         ring_unflushed_bytes=po.ring_unflushed_bytes, appended_bytes=po.appended_bytes))
        if not self.data_id:
            self.data_id = data_dir_id(self.s.data_dir) or 0
        self.port.send([ident, head, P.encode(P.DescribeReply(self._info(t), parts, self.s.instance, self.data_id,
                                                                      self.s.max_batch_bytes))])

    def status(self) -> P.StatusReply:
        now = time.monotonic()
        return P.StatusReply(
            pid=os.getpid(),
            uptime_s=round(time.time() - self.started, 3),
            bind=self.s.bind,
            data_dir=os.path.realpath(self.s.data_dir),
            generation=self.generation,
            forwarded=self.forwarded,
            moves=[list(m) for m in self.moves],
            topics=len(self.catalog.data.topics),
            partitions=sum(t.partitions for t in self.catalog.data.topics.values()),
            worker_count=self.count,
            spread_pending=self.spread_pending,
            workers=[
                P.WorkerStatus(w, self.s.worker_endpoint(w), len(self.scheduler.partitions_of(w)), self._answering(w, now),
                               w in self.retiring)
                for w in sorted(set(range(self.count)) | set(self.retiring))
            ],
            **dict(zip(P.TOTALS, self.traffic.totals())),
            rates=self.traffic.rates(),
            unflushed_records=self.traffic.unflushed(),
            journal_bytes=journal_usage(self.s.data_dir)[1],
            shm_used_bytes=self.catalog.shm_bytes(ring_region_bytes),
            shm_budget_bytes=self.s.shm_budget_bytes,
            disk_max_used_ratio=self.s.disk_max_used_ratio,
            **flusher_disk(self.s.ipc_path()),  # storage full, as the flusher's disk guard last said
        )

    def stats_parts(self) -> tuple[dict, dict, dict]:
        """The router's view of the workers and the partitions, for the metrics exporter."""
        now = time.monotonic()
        workers = sorted(set(range(self.count)) | set(self.retiring))
        gauges = {
            "worker_heartbeat_age_seconds": {str(w): round(now - self.last_pong[w], 3) for w in workers
                                             if w in self.seen and w in self.last_pong},  # never answered: no age
            "worker_partitions": {str(w): len(self.scheduler.partitions_of(w)) for w in workers},
            "worker_load": {str(w): round(self.scheduler.total(w), 3) for w in workers if w in self.scheduler.load},
            "worker_up": {str(w): int(self._answering(w, now)) for w in workers},
            "partition_owner_worker": {str(slot): w for slot, w in self.scheduler.owner.items()},
            "clients_connected": {"": self.clients},
        }
        return {"worker_restarts": {str(w): n for w, n in self.traffic.restarts.items()}}, gauges, {}

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


def check_config(config: dict[str, str], creating: bool) -> tuple[dict[str, int | None], str | None]:
    """A request's topic settings as stored values (None: back to the broker's default), or
    why they are refused. Names and values: ``P.TOPIC_CONFIGS``."""
    out: dict[str, int | None] = {}
    for name, raw in config.items():
        if name not in P.TOPIC_CONFIGS:
            return {}, f"unknown topic setting {name!r}: one of {', '.join(P.TOPIC_CONFIGS)}"
        if name == "ring.bytes" and not creating:
            return {}, "ring.bytes is set when a topic is created; a topic's rings do not change size"
        if raw == "" and not creating:
            out[name] = None
            continue
        try:
            value = int(raw)
        except (TypeError, ValueError):
            return {}, f"{name}={raw!r}: an integer"
        if name in ("retention.ms", "retention.bytes") and value < -1:
            return {}, f"{name}={value}: a count, or -1 for no limit"
        out[name] = value
    return out, None


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s router %(levelname)s %(message)s")
    s = settings_mod.from_env()
    claim = datadir.enter_program(s, "router", log)
    if claim is None:
        return datadir.EXIT_REFUSED
    stop: list = []
    datadir.stop_on_signals(stop)
    router = Router(s)
    ctx = zmq.Context()
    guard = None
    if s.auth == "curve":
        guard = auth.Guard(ctx, s.data_dir, s.allow_dir, with_router=False)
        router.worker_keys = auth.router_client_keys(s.data_dir)
        router.acls = acl.Acls(s.data_dir)
    elif not auth.is_loopback(s.bind):
        log.warning("INSECURE: %s listens beyond this host without authentication (--insecure); anyone who "
                    "reaches it can read, write and administer everything", s.bind)
    front = ctx.socket(zmq.ROUTER)
    if guard is not None:
        auth.make_server(front, s.data_dir)
    ReplyPort.configure(front)
    front.setsockopt(zmq.RCVHWM, 100_000)
    front.setsockopt(zmq.MAXMSGSIZE, s.max_frame_bytes)  # a larger part drops the peer, unread
    router.monitor = front.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    front.bind(s.bind)
    router.front = front
    router.port = ReplyPort(front, log, "router")
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    if guard is not None:
        poller.register(guard.zap.zap_socket, zmq.POLLIN)
    router.ctx, router.poller = ctx, poller
    for w in range(router.count):
        router._connect(w)
    log.info("router serving on %s with %d workers (generation %d, auth %s)", s.bind, router.count, router.generation, s.auth)
    last_ping = 0.0
    while not stop:
        events = dict(poller.poll(2 if router.port.backlog else 100))
        if guard is not None and guard.zap.zap_socket in events:
            guard.zap.service()
        if front in events:
            if guard is None:
                P.drain(front, router.on_client, DRAIN_MAX)
            else:
                guard.drain(front, router.on_client_as, router.refuse, DRAIN_MAX)
        for d in list(router.dealers.values()):
            if d in events:
                P.drain(d, router.on_worker_reply, DRAIN_MAX)
        if router.port.backlog:
            router.port.flush()
        now = time.monotonic()
        if now - last_ping > HEARTBEAT_S:
            router.tick()
            router.ask_again()
            try:
                router.groups.tick(now)
            except Exception:  # noqa: BLE001 - as above: the router keeps serving
                log.exception("group coordinator tick failed")
            if guard is not None:
                guard.allow.refresh()
                router.acls.refresh()
            router.count_clients()
            router.stats.maybe_write(router.stats_parts)
            last_ping = now
    front.disable_monitor()
    router.monitor.close(0)
    front.close(0)
    for d in router.dealers.values():
        d.close(0)
    if guard is not None:
        guard.close()
    ctx.term()
    datadir.leave_program(claim)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
