"""A consumer's membership of a group (``Consumer(group=...)``): heartbeats, assignment changes,
commits. The coordinator is the broker's (router/groups.py); this is the member's half of the
protocol (docs/PROTOCOL.md, 4.7e):

- ``subscribe`` joins at the next poll (a heartbeat with epoch 0); every heartbeat reports the
  partitions the consumer holds, and its reply says which it may hold now;
- a partition in the reply that the consumer does not hold is *assigned*: it starts at the
  group's committed offset, or where ``auto_offset_reset`` says when there is none (Kafka's
  ``auto.offset.reset``; ``latest`` unless given); ``on_assign`` is called;
- a partition it holds that the reply leaves out is *revoked*: its position is committed (with
  ``auto_commit``), ``on_revoke`` is called, it is dropped, and the next heartbeat goes at once,
  so its new owner is told to start;
- with ``auto_commit`` the positions are committed every ``auto_commit_interval_ms`` at a poll
  (what earlier polls returned counts as processed: at least once, docs/GUARANTEES.md), at a
  revoke and at ``close``;
- a member the group forgot (``UNKNOWN_MEMBER_ID``: its session ended) has lost its partitions:
  they are dropped without a commit (their new owners may have read on) and it joins again.

The protocol is written once, without I/O: each operation is a generator that yields the
requests it needs (``(op, topic, header)``, or ``("assigned", topic)`` once a topic's partitions
are added) and is sent their replies (or thrown their errors). ``run`` drives one with blocking
requests (``Consumer``), ``run_async`` with awaited ones (``aio.AsyncConsumer``).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Generator, Iterable

from . import protocol as P
from .errors import (ConnectionLostError, FencedMemberEpochError, NotCoordinatorError, NotReadyError, TimeoutError_,
                     UnknownMemberIdError)

log = logging.getLogger("tailrace.group")
TP = tuple[str, int]
# the options of a group consumer (Consumer(group=..., **these)), Kafka's names where it has them
GROUP_OPTIONS = frozenset({"auto_commit", "auto_commit_interval_ms", "group_instance_id", "on_assign", "on_revoke",
                           "session_timeout_ms", "heartbeat_interval_ms"})


class Membership:
    """The member side of one consumer's group: ``step`` at every poll, ``commit``,
    ``committed``, ``leave`` (each a generator: see the module docstring)."""

    def __init__(self, consumer, group: str, *, auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, group_instance_id: str | None = None,
                 on_assign: Callable[[list[TP]], None] | None = None, on_revoke: Callable[[list[TP]], None] | None = None,
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3000):
        self.c = consumer
        self.group = group
        self.auto_commit, self.commit_every_s = auto_commit, auto_commit_interval_ms / 1000
        self.instance_id = group_instance_id or ""
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.session_ms, self.heartbeat_ms = session_timeout_ms, heartbeat_interval_ms
        self.topics: list[str] = []
        self.member_id, self.epoch = "", 0
        self.topics_sent = False
        self.next_heartbeat = 0.0
        self.next_commit = time.monotonic() + self.commit_every_s
        self.committed_at: dict[TP, int] = {}  # what this member last committed
        self.rebalances = 0

    def subscribe(self, topics: Iterable[str]) -> None:
        self.topics = sorted(set(topics))
        self.topics_sent = False
        self.next_heartbeat = 0.0

    def due(self) -> bool:
        """Whether ``step`` has anything to do now (a poll skips it otherwise: two clock reads)."""
        now = time.monotonic()
        return bool(self.topics and now >= self.next_heartbeat) or (self.auto_commit and bool(self.member_id) and now >= self.next_commit)

    def step(self) -> Generator:
        """At a poll: a heartbeat when due (several while partitions move), a commit when due."""
        now = time.monotonic()
        if self.topics and now >= self.next_heartbeat:
            for _ in range(4):  # a revoke is reported at once, and may let the reply grant more
                if not (yield from self.heartbeat()):
                    break
        if self.auto_commit and self.member_id and now >= self.next_commit:
            self.next_commit = now + self.commit_every_s
            yield from self.commit_positions(None)

    def heartbeat(self) -> Generator:
        """One heartbeat; returns True if it revoked something (report it at once)."""
        held = sorted(self.c.assigned)
        req = P.GroupHeartbeatRequest(self.member_id, self.epoch, self.instance_id,
                                      None if self.topics_sent else list(self.topics), held, self.session_ms,
                                      self.heartbeat_ms)
        try:
            r = yield (P.Op.GROUP_HEARTBEAT, self.group, P.encode(req))
        except UnknownMemberIdError:
            log.warning("group %r forgot member %s (its session ended): partitions lost, joining again", self.group, self.member_id)
            yield from self._drop(sorted(self.c.assigned), commit=False)
            self.member_id, self.epoch, self.topics_sent = "", 0, False
            self.next_heartbeat = 0.0
            return True
        except NotReadyError:
            self.next_heartbeat = time.monotonic() + 0.2
            return False
        rep = P.decoder(P.GroupHeartbeatReply).decode(r.header)
        self.member_id, self.epoch, self.topics_sent = rep.member_id, rep.member_epoch, True
        self.next_heartbeat = time.monotonic() + rep.heartbeat_interval_ms / 1000
        now_holds = {(t, int(p)) for t, p in rep.assignment}
        revoked = sorted(set(self.c.assigned) - now_holds)
        added = sorted(now_holds - set(self.c.assigned))
        if revoked:
            yield from self._drop(revoked, commit=self.auto_commit)
        if added:
            yield from self._add(added)
        if revoked or added:
            self.rebalances += 1
        return bool(revoked)

    def _drop(self, tps: list[TP], commit: bool) -> Generator:
        if commit:
            try:
                yield from self.commit_positions(tps)
            except (FencedMemberEpochError, UnknownMemberIdError) as exc:
                log.warning("group %r: commit at revoke refused: %s", self.group, exc)
        if self.on_revoke is not None:
            self.on_revoke(tps)
        for tp in tps:
            self.c.unassign(*tp)

    def _add(self, tps: list[TP]) -> Generator:
        topics = sorted({t for t, _p in tps})
        committed = yield from self.committed(tps)
        for t in topics:
            r = yield (P.Op.LIST_OFFSETS, t, P.EMPTY_MAP)
            offsets = P.decoder(P.ListOffsetsReply).decode(r.header).partitions
            for tt, p in tps:
                if tt == t:
                    self.c._assign_from(t, offsets, [p], committed[(t, p)] if (t, p) in committed else self.c.group_start)
            yield ("assigned", t)
        if self.on_assign is not None:
            self.on_assign(tps)

    def committed(self, partitions: list[TP] | None = None) -> Generator:
        """The group's committed offsets, of ``partitions`` or of all it has."""
        topics = None if partitions is None else sorted({t for t, _p in partitions})
        r = yield (P.Op.OFFSET_FETCH, self.group, P.encode(P.OffsetFetchRequest(topics)))
        got = {(t, p): o for t, p, o in P.decoder(P.CommittedOffsets).decode(r.header).offsets}
        return got if partitions is None else {tp: got[tp] for tp in partitions if tp in got}

    def commit_positions(self, tps: list[TP] | None) -> Generator:
        """Commit the positions of ``tps`` (None: every held partition whose position moved)."""
        if tps is None:
            offsets = {tp: a.position for tp, a in self.c.assigned.items() if self.committed_at.get(tp) != a.position}
        else:
            offsets = {tp: self.c.assigned[tp].position for tp in tps if tp in self.c.assigned}
        return (yield from self.commit(offsets)) if offsets else {}

    def commit(self, offsets: dict[TP, int]) -> Generator:
        req = P.OffsetCommitRequest([(t, int(p), int(o)) for (t, p), o in sorted(offsets.items())], self.member_id, self.epoch)
        yield (P.Op.OFFSET_COMMIT, self.group, P.encode(req))
        self.committed_at.update(offsets)
        return dict(offsets)

    def leave(self) -> Generator:
        """Commit (with ``auto_commit``) and leave: a static member only for now (epoch -2: its
        partitions wait for it until its session ends)."""
        if not self.member_id:
            return
        try:
            if self.auto_commit:
                yield from self.commit_positions(None)
            req = P.GroupHeartbeatRequest(self.member_id, -2 if self.instance_id else -1, self.instance_id,
                                          owned=[], session_timeout_ms=self.session_ms, heartbeat_interval_ms=self.heartbeat_ms)
            yield (P.Op.GROUP_HEARTBEAT, self.group, P.encode(req))
        except Exception as exc:  # noqa: BLE001 - closing: the session timeout does the rest
            log.warning("group %r: leaving failed (%s); the session timeout removes the member", self.group, exc)
        self.member_id = ""


def run(gen: Generator, request: Callable, assigned: Callable[[str], None]):
    """Drive a ``Membership`` operation with blocking ``request(op, topic, header) -> Reply``
    (raising the reply's error); ``assigned(topic)`` after a topic's partitions are added."""
    try:
        ask = next(gen)
        while True:
            if ask[0] == "assigned":
                assigned(ask[1])
                ask = gen.send(None)
                continue
            try:
                r = request(*ask)
            except Exception as exc:  # noqa: BLE001 - the operation decides (it may catch it)
                ask = gen.throw(exc)
            else:
                ask = gen.send(r)
    except StopIteration as done:
        return done.value


async def run_async(gen: Generator, request: Callable, assigned: Callable):
    """``run`` with ``await request(...)`` and ``await assigned(topic)``."""
    try:
        ask = next(gen)
        while True:
            if ask[0] == "assigned":
                await assigned(ask[1])
                ask = gen.send(None)
                continue
            try:
                r = await request(*ask)
            except Exception as exc:  # noqa: BLE001 - as in run
                ask = gen.throw(exc)
            else:
                ask = gen.send(r)
    except StopIteration as done:
        return done.value


def coordinator_endpoint(exc: NotCoordinatorError) -> str:
    """The coordinator a NOT_COORDINATOR reply named; NotReadyError if it named none (the group's
    broker is not reachable now: asked again shortly)."""
    endpoint = exc.details.get("endpoint") or ""
    if not endpoint:
        raise NotReadyError(str(exc)) from exc
    return endpoint


class CoordinatorLink:
    """Where a blocking consumer's group requests go: the bootstrap broker, or the coordinator a
    NOT_COORDINATOR reply named (a cluster: docs/PROTOCOL.md "Groups in a cluster"); back to the
    bootstrap, which names the group's new coordinator, when that broker is lost."""

    def __init__(self, bootstrap, connect: Callable):
        self.bootstrap = bootstrap  # a connection.Connection
        self.conn = bootstrap
        self._connect = connect  # endpoint -> a new Connection

    def _switch(self, endpoint: str | None) -> None:
        if self.conn is not self.bootstrap:
            self.conn.close()
        self.conn = self.bootstrap if endpoint in (None, self.bootstrap.endpoint) else self._connect(endpoint)

    def request(self, op: int, topic, header: bytes, timeout_ms: int):
        for _ in range(3):
            conn = self.conn
            try:
                return conn.request(op, topic, header=header, timeout_ms=timeout_ms)
            except NotCoordinatorError as exc:
                self._switch(coordinator_endpoint(exc))
            except (ConnectionLostError, TimeoutError_) as exc:
                if conn is self.bootstrap:
                    raise
                self._switch(None)
                raise NotReadyError(f"the group's coordinator at {conn.endpoint} was lost ({exc}): asking again") from exc
        raise NotReadyError("the group's coordinator moved while it was being found: asking again")

    def close(self) -> None:
        if self.conn is not self.bootstrap:
            self.conn.close()
        self.bootstrap.close()
