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

A group is cut into lanes (``_Lane``) of at most ``multi_partition_max`` partitions, made once
and kept while the partitions' routes hold (``Routes.epoch``): one FETCH_MULTI in flight per
lane, in a fetch session of its own at its worker (KIP-227 in small). The first request opens
it with every position, later ones list only the partitions whose position moved since the
last request (and ``forget`` those that left the lane), so a reader of 1,000 quiet partitions
sends a few bytes a poll, not 1,000 positions; the worker leaves quiet partitions out of its
reply, and the consumer looks only at what a reply holds. A session is dropped (and the next
request opens a new one) when its worker says FETCH_SESSION_NOT_FOUND and when a request of it
is lost (a timeout, a closed connection: the worker may not have its last positions). A lane
is dissolved, and its partitions grouped afresh, when a route changes, when its request is
lost, or a member answers NOT_OWNER or NOT_LEADER_OR_FOLLOWER (that one alone); a member leaves
it when unassigned, sought, or read from its ring.
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
# a partition's answer that takes it out of its lane: its route changed
_REGROUP = (P.ErrorCode.NOT_OWNER, P.ErrorCode.NOT_LEADER_OR_FOLLOWER)


class _Session:
    __slots__ = ("sid", "sent")

    def __init__(self):
        self.sid = 0  # 0: not opened yet (the next request opens it)
        self.sent: dict[int, int] = {}  # partition -> the position the worker holds for it


class _Lane:
    """Partitions of one topic and owner fetched together: one FETCH_MULTI at a time, in one fetch
    session. Its members stay together while their route holds (``epoch``: ``Routes.epoch`` when
    it was made), so the session lists only the positions that moved, and a quiet member costs
    nothing a poll on either side: the worker leaves it out of its reply, and the consumer looks
    only at what a reply holds, not at every member."""

    __slots__ = ("topic", "via", "key", "members", "session", "rid", "sent", "wait_s", "epoch")

    def __init__(self, topic: str, via: str | None, key: tuple, members: list, epoch: int):
        self.topic, self.via, self.key, self.epoch = topic, via, key, epoch
        self.members = {a.partition: a for a in members}  # partition -> _Assigned
        self.session = _Session()
        self.rid, self.sent, self.wait_s = 0, 0.0, 0.0  # the request in flight (0: none)


class Fetches:
    """Mixin of ``ConsumerCore``: its state (``assigned``, ``_by_rid``, ``multi_partition``, the
    limits) is set up there; the lanes (``_lanes``) here."""

    _lanes: dict | None = None  # _Lane -> None (insertion-ordered set)
    _lane_counts: dict | None = None  # (topic, via, owner) -> lanes of that group
    _due: set | None = None  # keys of assigned partitions that may want a fetch (None: look at all)
    _scanned = 0.0  # when all were last looked at

    def _mark_due(self, a) -> None:
        """``a`` has no fetch in flight any more: the next ``_send_fetches`` looks at it."""
        if self._due is not None:
            self._due.add((a.topic, a.partition))

    def _send_fetches(self, max_wait_ms: int, fetch_only: bool = False) -> None:
        now = time.monotonic()
        groups: dict[tuple, list] = {}
        if self._lanes is None:
            self._lanes, self._lane_counts = {}, {}
        for lane in list(self._lanes):
            if lane.rid:
                if now - lane.sent >= lane.wait_s + self.request_timeout_s:
                    self._lane_lost(lane)  # lost with a broker process: its members are asked again
                continue
            if self.routes.due(lane.topic):
                self._route(lane.topic, next(iter(lane.members)))  # a DESCRIBE (inline, or a task)
            if lane.epoch != self.routes.epoch:
                self._dissolve(lane)  # a route may have changed: its members are grouped afresh
            else:
                self._send_lane(lane, max_wait_ms, now)
        if self._due is None or now - self._scanned > FULL_SCAN_S:
            look = list(self.assigned.values())
            self._scanned = now
        else:
            get = self.assigned.get
            look = [a for a in map(get, self._due) if a is not None]
        due = self._due = set()
        for a in look:
            if a.lane is not None:
                continue  # its lane fetches it
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
            if self.multi_partition and not a.alone and a.tail is None:
                owner = self.routes.group_of(a.topic, a.partition, via)
                if owner is not None:
                    groups.setdefault((a.topic, via, owner), []).append(a)
                    continue
            self._fetch_one(a, via, max_wait_ms, now)
        epoch = self.routes.epoch
        for key, group in groups.items():
            topic, via = key[0], key[1]
            if len(group) < self.multi_partition_min:  # a few partitions: a FETCH each keeps more in flight
                for a in group:
                    self._fetch_one(a, via, max_wait_ms, now)
                continue
            size = self.multi_partition_max
            for i in range(0, len(group), size):
                chunk = group[i:i + size]
                if len(chunk) < self.multi_partition_min:
                    for a in chunk:
                        self._fetch_one(a, via, max_wait_ms, now)
                    continue
                lane = _Lane(topic, via, key, chunk, epoch)
                for a in chunk:
                    a.lane = lane
                self._lanes[lane] = None
                self._lane_counts[key] = self._lane_counts.get(key, 0) + 1
                self._send_lane(lane, max_wait_ms, now)

    def _send_lane(self, lane: _Lane, max_wait_ms: int, now: float) -> None:
        """One FETCH_MULTI for ``lane``: in its session, only the positions that moved."""
        session, members = lane.session, lane.members
        if session.sid:
            sent = session.sent
            listed = [a for a in members.values() if sent.get(a.partition) != a.position]
            forget = [p for p in sent if p not in members]
            for p in forget:
                del sent[p]
        else:  # opening it: every position
            session.sent.clear()
            listed, forget = list(members.values()), []
        # what a worker's replies may carry at once, shared by its lanes
        total_bytes = max(self.max_bytes, GROUP_BYTES_IN_FLIGHT // self._lane_counts.get(lane.key, 1))
        header = P.encode(P.FetchMultiRequest(
            [a.partition for a in listed], [a.position for a in listed], self.max_bytes, self.max_records,
            total_bytes, max_wait_ms, self.isolation, session.sid, forget))
        session.sent.update((a.partition, a.position) for a in listed)
        lane.rid = self.pool.send(lane.via, P.Op.FETCH_MULTI, lane.topic, next(iter(members)), header)
        lane.sent, lane.wait_s = now, max_wait_ms / 1000
        self._by_rid[lane.rid] = lane

    def _leave_lane(self, a) -> None:
        """``a`` leaves its lane (unassigned, sought, read from its ring, or its route changed):
        the lane's next request forgets it, and a reply in flight for it is ignored."""
        lane = a.lane
        if lane is not None:
            a.lane = None
            lane.members.pop(a.partition, None)
            if not lane.members:
                self._dissolve(lane)

    def _dissolve(self, lane: _Lane) -> None:
        """Its members are fetched (and grouped) afresh by the next ``_send_fetches``."""
        if self._lanes.pop(lane, 0) is None:
            self._lane_counts[lane.key] -= 1
        if lane.rid:
            self._by_rid.pop(lane.rid, None)
            lane.rid = 0
        for a in lane.members.values():
            a.lane = None
            self._mark_due(a)
        lane.members = {}

    def _lane_lost(self, lane: _Lane) -> None:
        """``lane``'s request was never answered: its members go through the router and are
        described again (as a lost FETCH's partition), its worker's sessions are dropped."""
        if lane.via is not None:
            for a in lane.members.values():
                self.routes.demote(a.topic, a.partition)
        self._drop_sessions(lane.via)
        self._dissolve(lane)

    def _drop_sessions(self, via: str | None) -> None:
        """Forget the sessions of lanes sent to ``via``: one of their requests may have been lost,
        with positions the worker never took in (each opens a new one with every position)."""
        for lane in self._lanes or ():
            if lane.via == via:
                lane.session = _Session()

    def _fetch_one(self, a, via: str | None, max_wait_ms: int, now: float) -> None:
        header = P.encode(P.FetchRequest(a.position, self.max_bytes, self.max_records, max_wait_ms, self.isolation))
        rid = self.pool.send(via, P.Op.FETCH, a.topic, a.partition, header)
        a.inflight, a.sent, a.wait_s, a.via = rid, now, max_wait_ms / 1000, via
        self._by_rid[rid] = a

    def _connection_lost(self, via: str | None) -> None:
        """The connection to ``via`` (None: the router) closed: its fetches in flight will never
        be answered; the next ``_send_fetches`` asks again at once (``Pool.on_lost``)."""
        for lane in [lane for lane in self._lanes or () if lane.via == via]:
            if lane.rid and via is not None:
                self._lane_lost(lane)
            elif lane.rid:
                self._dissolve(lane)
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
        if type(entry) is _Lane:
            return self._take_lane(entry, r, out)
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

    def _take_lane(self, lane: _Lane, r, out: list) -> None:
        """A lane's reply: only the partitions it holds are looked at (a member it leaves out had
        nothing new, or did not fit: the worker's session still holds its position)."""
        lane.rid = 0
        if r.code != P.ErrorCode.OK:  # the request as a whole was refused
            lane.session = _Session()  # the next request opens a new one, with every position
            if r.code == P.ErrorCode.FETCH_SESSION_NOT_FOUND:
                return
            members = list(lane.members.values())
            self._dissolve(lane)
            for a in members:
                self._answered(a, r.via, r.code, None, None, None, r.raise_for_code, out)
            return
        rep = _multi_reply.decode(r.header)
        self.throttle_ms += rep.throttle_ms
        if rep.session_id > 0:
            lane.session.sid = rep.session_id
        members = lane.members
        frames = iter(r.body or ())  # one frame per outcome with data, in outcome order
        for o in rep.results:
            chunk = next(frames) if o.body_bytes else None
            a = members.get(o.partition)
            if a is None:
                continue  # left the lane since the request went
            info = P.FetchReply(o.high_watermark, o.durable_watermark, o.log_start_offset, o.next_offset, "multi")

            def fail(o=o):
                raise error_for(o.code, f"{_code_name(o.code)}: {o.message}")
            if o.code in _REGROUP:
                self._leave_lane(a)  # routed afresh on its own (its owner or leader moved)
                self._mark_due(a)
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
