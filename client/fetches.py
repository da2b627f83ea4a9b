"""The consumer's fetches: which to send, and what a reply means (``ConsumerCore``'s half that
talks to the broker; client/consumer.py).

One fetch per assigned partition is in flight at a time. The partitions due a fetch whose owner
is known (DESCRIBE's endpoint) are grouped by topic and owner: a group of fewer than
``multi_partition_min`` (5) is a FETCH each (a few large fetches in flight overlap the
consumer's work with the broker's better than one request for all: 8 partitions over 2 workers
read 0.80x as fast as one FETCH_MULTI per worker), a larger one a FETCH_MULTI (docs/PROTOCOL.md
4.2a) whose long poll covers all of them; its reply
is taken apart into one answer per partition, each handled as a FETCH reply is (data, a reset
out of range, NOT_OWNER, an error).

Each group keeps a fetch session at its worker (KIP-227 in small): the first request opens it
with every position, later ones list only the partitions whose position moved since the last
request (and ``forget`` those that left the group), so a reader of 1,000 quiet partitions sends
a few bytes a poll, not 1,000 positions. A session is dropped (and the next request opens a new
one) when its worker says FETCH_SESSION_NOT_FOUND, when a request of it is lost (a timeout, a
closed connection: the worker may not have its last positions), and when the group is split
over more than one request.
"""

from __future__ import annotations

import logging
import time

from . import protocol as P
from .errors import OffsetOutOfRangeError, error_for

log = logging.getLogger("tailrace.consumer")
# What a worker's FETCH_MULTI replies may carry at once, shared by the requests a group is cut
# into (each asks for this over their number, and at least one partition's max_bytes). Kafka's
# fetch.max.bytes is 50 MiB for its one request a broker; here a group of 250 partitions is 4
# requests in flight, and at 50 MiB each the worker copied 200 MB of replies into fresh memory
# (a page fault per 4 KiB) before the reader took the first: 1,000 partitions read at 0.5x of 8.
# 8 MiB: as much in flight as four 2 MiB fetches, and no fault on either side (16 MiB: as fast
# here, with the reader faulting again; docs/BENCHMARKS.md "Large blocks").
GROUP_BYTES_IN_FLIGHT = 8 << 20
# A poll sends fetches for the partitions due one (no fetch in flight: ``Fetches._due``), not by
# looking at every assigned partition after each reply: a reader of 10,000 partitions took 10,000
# looks a reply (91 s for 6M records). All are looked at this often (a fetch lost with its reply).
FULL_SCAN_S = 0.5
_fetch_reply = P.decoder(P.FetchReply)
_multi_reply = P.decoder(P.FetchMultiReply)
_error_reply = P.decoder(P.ErrorReply)


class _Session:
    __slots__ = ("sid", "sent")

    def __init__(self):
        self.sid = 0  # 0: not opened yet (the next request opens it)
        self.sent: dict[int, int] = {}  # partition -> the position the worker holds for it


class Fetches:
    """Mixin of ``ConsumerCore``: its state (``assigned``, ``_by_rid``, ``multi_partition``, the
    limits) is set up there; the fetch sessions (``_sessions``) here."""

    _sessions: dict | None = None  # (topic, via, owner) -> _Session
    _due: set | None = None  # keys of assigned partitions that may want a fetch (None: look at all)
    _scanned = 0.0  # when all were last looked at

    def _mark_due(self, a) -> None:
        """``a`` has no fetch in flight any more: the next ``_send_fetches`` looks at it."""
        if self._due is not None:
            self._due.add((a.topic, a.partition))

    def _send_fetches(self, max_wait_ms: int, fetch_only: bool = False) -> None:
        now = time.monotonic()
        groups: dict[tuple, list] = {}
        if self._sessions is None:
            self._sessions = {}
        if self._due is None or now - self._scanned > FULL_SCAN_S:
            look = list(self.assigned.values())
            self._scanned = now
        else:
            get = self.assigned.get
            look = [a for a in map(get, self._due) if a is not None]
        due = self._due = set()
        for a in look:
            if fetch_only and a.tail is not None and not a.below:
                due.add((a.topic, a.partition))  # read from its ring (and looked at again: it may fall below)
                continue
            if a.inflight:
                if now - a.sent < a.wait_s + self.request_timeout_s:
                    continue
                self._by_rid.pop(a.inflight, None)  # lost with a broker process: ask again
                if a.via is not None:
                    self.routes.demote(a.topic, a.partition)
                self._drop_sessions(a.via)
            via = self._route(a.topic, a.partition)
            if self.multi_partition and not a.alone:
                owner = self.routes.group_of(a.topic, a.partition, via)
                if owner is not None:
                    groups.setdefault((a.topic, via, owner), []).append(a)
                    continue
            self._fetch_one(a, via, max_wait_ms, now)
        for key, group in groups.items():
            topic, via = key[0], key[1]
            if len(group) < self.multi_partition_min:  # a few partitions: a FETCH each keeps more in flight
                for a in group:
                    self._fetch_one(a, via, max_wait_ms, now)
                continue
            size = self.multi_partition_max
            total_bytes = max(self.max_bytes, GROUP_BYTES_IN_FLIGHT // -(-len(group) // size))
            for n, i in enumerate(range(0, len(group), size)):
                chunk = group[i:i + size]
                if len(chunk) < self.multi_partition_min:
                    for a in chunk:
                        self._fetch_one(a, via, max_wait_ms, now)
                    continue
                self._fetch_many(topic, via, (*key, n), chunk, max_wait_ms, now, total_bytes)

    def _fetch_many(self, topic: str, via: str | None, key: tuple, chunk: list, max_wait_ms: int, now: float,
                    total_bytes: int) -> None:
        """One FETCH_MULTI for ``chunk``, in the fetch session ``key`` names."""
        session = self._sessions.setdefault(key, _Session())
        if not session.sid and session.sent:
            session = None  # its opening request is in flight: this one goes without
        listed, forget = chunk, []
        if session is not None and session.sid:
            sent = session.sent
            listed = [a for a in chunk if sent.get(a.partition) != a.position]
            here = {a.partition for a in chunk}
            forget = [p for p in sent if p not in here]
            for p in forget:
                del sent[p]
        header = P.encode(P.FetchMultiRequest(
            [a.partition for a in listed], [a.position for a in listed], self.max_bytes, self.max_records,
            total_bytes, max_wait_ms, self.isolation,
            -1 if session is None else session.sid, forget))
        if session is not None:
            session.sent.update((a.partition, a.position) for a in listed)
        rid = self.pool.send(via, P.Op.FETCH_MULTI, topic, chunk[0].partition, header)
        for a in chunk:
            a.inflight, a.sent, a.wait_s, a.via = rid, now, max_wait_ms / 1000, via
        self._by_rid[rid] = (chunk, key, session) if session is not None else chunk

    def _drop_sessions(self, via: str | None) -> None:
        """Forget the sessions of requests sent to ``via``: one of their requests may have been
        lost, with positions the worker never took in."""
        if self._sessions:
            for key in [k for k in self._sessions if k[1] == via]:
                del self._sessions[key]

    def _fetch_one(self, a, via: str | None, max_wait_ms: int, now: float) -> None:
        header = P.encode(P.FetchRequest(a.position, self.max_bytes, self.max_records, max_wait_ms, self.isolation))
        rid = self.pool.send(via, P.Op.FETCH, a.topic, a.partition, header)
        a.inflight, a.sent, a.wait_s, a.via = rid, now, max_wait_ms / 1000, via
        self._by_rid[rid] = a

    def _connection_lost(self, via: str | None) -> None:
        """The connection to ``via`` (None: the router) closed: its fetches in flight will never
        be answered; the next ``_send_fetches`` asks again at once (``Pool.on_lost``)."""
        for a in self.assigned.values():
            if a.inflight and a.via == via:
                self._by_rid.pop(a.inflight, None)
                a.inflight = 0
                self._mark_due(a)
                if via is not None:
                    self.routes.demote(a.topic, a.partition)
        self._drop_sessions(via)

    def _raise_deferred(self) -> None:
        if self._deferred is not None:  # an error met after records were already handed out
            exc, self._deferred = self._deferred, None
            raise exc

    def _take_or_defer(self, r, out: list) -> bool:
        """``_take``; an error it raises after ``out`` already holds records (whose partitions'
        positions have moved on) is kept for the next poll, so no record is skipped. Returns
        False when one was kept (return ``out`` now)."""
        try:
            self._take(r, out)
            return True
        except Exception as exc:
            if not out:
                raise
            self._deferred = exc
            return False

    def _take(self, r, out: list) -> None:
        """One fetch reply: advance its partitions and add their data to ``out``."""
        entry = self._by_rid.pop(r.request_id, None)
        if entry is None:
            return
        if type(entry) is list:
            return self._take_multi(entry, r, out)
        if type(entry) is tuple:  # a FETCH_MULTI in a session
            return self._take_multi(entry[0], r, out, *entry[1:])
        a = entry
        if a.inflight != r.request_id:
            return
        a.inflight = 0
        self._mark_due(a)
        info = bounds = None
        if r.code == P.ErrorCode.OK:
            info = _fetch_reply.decode(r.header)
            self.throttle_ms += info.throttle_ms
        elif r.code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
            err = _error_reply.decode(r.header)
            bounds = (err.log_start_offset, err.high_watermark)
        self._answered(a, r.via, r.code, info, bounds, r.body, r.raise_for_code, out)

    def _take_multi(self, group: list, r, out: list, key=None, session: _Session | None = None) -> None:
        live = [a for a in group if a.inflight == r.request_id]
        for a in live:
            a.inflight = 0  # (a partition the reply leaves out is fetched again next turn)
            self._mark_due(a)
        if session is not None and self._sessions.get(key) is not session:
            session = None  # dropped since (a lost request): a new one opens with every position
        if r.code != P.ErrorCode.OK:  # the request as a whole was refused
            if session is not None:
                del self._sessions[key]  # the next request opens a new one, with every position
            if r.code == P.ErrorCode.FETCH_SESSION_NOT_FOUND:
                return
            for a in live:
                self._answered(a, r.via, r.code, None, None, None, r.raise_for_code, out)
            return
        rep = _multi_reply.decode(r.header)
        self.throttle_ms += rep.throttle_ms
        if session is not None and rep.session_id > 0:
            session.sid = rep.session_id
        by_partition = {a.partition: a for a in live}
        frames = iter(r.body or ())  # one frame per outcome with data, in outcome order
        for o in rep.results:
            chunk = next(frames) if o.body_bytes else None
            a = by_partition.get(o.partition)
            if a is None:
                continue
            info = P.FetchReply(o.high_watermark, o.durable_watermark, o.log_start_offset, o.next_offset, "multi")

            def fail(o=o):
                raise error_for(o.code, f"{_code_name(o.code)}: {o.message}")
            hw = o.durable_watermark if self.isolation == "durable" else o.high_watermark  # as FETCH's (its isolation's)
            self._answered(a, r.via, o.code, info, (o.log_start_offset, hw), chunk, fail, out)

    def _answered(self, a, via: str, code: int, info: P.FetchReply | None, bounds, body, fail, out: list) -> None:
        """One partition's answer: ``info`` and ``body`` when OK; ``bounds`` (log start, high
        watermark) when out of range; ``fail()`` raises any other error."""
        if a.below:
            a.below = False  # its ring is tried again from the new position
            self._fetching = True  # re-indexed below, or at the next ring read
        self.routes.answered(a.topic, a.partition, via, code)
        a.alone = code == P.ErrorCode.NOT_OWNER
        if a.alone:
            return  # asked again on its own through the router on the next turn (its group's owner is stale)
        if code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER:
            return  # a cluster's leader moved or is down: fetched again from its leader once described again
        if code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
            log_start, hw = bounds
            to = {"earliest": log_start, "latest": hw}.get(self.auto_offset_reset, -1)
            if to >= 0:
                log.warning("%s/%d: offset %d out of range [%d, %d]: position reset to %d (auto_offset_reset=%s)",
                            a.topic, a.partition, a.position, log_start, hw, to, self.auto_offset_reset)
                self.resets += 1
                a.position = to
                self._index_tails()
                return
            raise OffsetOutOfRangeError(f"{a.topic}/{a.partition}: offset {a.position} out of range",
                                        log_start_offset=log_start, high_watermark=hw)
        if code != P.ErrorCode.OK:
            fail()
        self.last_reply[(a.topic, a.partition)] = info
        if body is not None and len(body) and info.next_offset > a.position:
            start = a.position
            a.position = info.next_offset
            out.append((a, start, info, body))
        if a.tail is not None:
            self._index_tails()


def _code_name(code: int) -> str:
    try:
        return P.ErrorCode(code).name
    except ValueError:
        return f"code {code}"
