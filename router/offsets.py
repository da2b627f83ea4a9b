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

    def ask(self, req: Request) -> None:
        """The handler of DESCRIBE_TOPIC and LIST_OFFSETS."""
        catalog, name = self.ctx.catalog, req.name
        if catalog.get(name) is None:
            catalog.reload()
            if catalog.get(name) is None:
                return req.reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
        header = req.header if req.op == P.Op.LIST_OFFSETS and req.header is not None else P.EMPTY_MAP
        rid = self.ctx.next_id()
        worker = self._worker(req.topic, None)
        self.pending[rid] = [req.ident, req.routing, name, worker, time.monotonic(), 1, header]
        self._send(rid, worker, req.topic, header)

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
        for rid, ask in list(self.pending.items()):
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
        pending = self.pending.pop(rid, None)
        if pending is None:
            return
        ident, routing, name = pending[:3]
        _v, client_op, _c, partition, request_id, _t = P.unpack_routing(routing)
        head = P.pack_routing(client_op, partition, request_id, topic, code)
        if code != P.ErrorCode.OK or client_op == P.Op.LIST_OFFSETS:
            return self.ctx.send([ident, head, body])
        s, placement = self.ctx.s, self.ctx.placement
        offsets = _list_offsets_dec.decode(body)
        t = self.ctx.catalog.get(name)
        parts = []
        for po in offsets.partitions:
            w, assign = placement.routes[(topic, po.partition)]
            parts.append(P.PartitionInfo(po.partition, w, s.worker_endpoint(w), po.log_start_offset, po.high_watermark,
                                         po.durable_watermark, adopted=placement.told.get((topic, po.partition)) == assign,
                                         slot=t.slots[po.partition], local_endpoint=s.worker_unix_endpoint(w),
                                         ring_unflushed_bytes=po.ring_unflushed_bytes, appended_bytes=po.appended_bytes))
        if not self.data_id:
            self.data_id = data_dir_id(s.data_dir) or 0
        self.ctx.send([ident, head, P.encode(P.DescribeReply(info(s, t), parts, s.instance, self.data_id, s.max_batch_bytes))])
