"""Router -> router links in a cluster: the questions one broker asks another.

A DESCRIBE_TOPIC or LIST_OFFSETS that a client asks any broker is answered for the whole topic
(docs/DESIGN.md "Cluster"): the broker answers the partitions it leads from its own workers and
asks each other live leader of the topic for the rest, with ``local=True`` (that broker's own log
only, never asked onwards). ``PeerLinks`` holds one DEALER per other broker's advertised client
endpoint, connected on first use and registered in the router's poller; replies come back as
ordinary client replies (``[routing, body]``), matched by the router's internal request id to
the callback its sender gave (the offsets questions, router/offsets.py; the delayed batches and
dead letters sent to another broker's partition, ``to_leader``). Two patterns built on it are
shared by the group coordinator (router/groups.py) and the share coordinator
(router/share_cluster.py): ``Copies``, one write sent to every other broker and waited for, and
``Pull``, every other broker asked once at start for its copies.

With ``--auth curve`` a broker that has not yet let our router key in (it had not seen our
registration) refuses the CURVE handshake, and libzmq then ends that connection for good: each
link's socket monitor reports the failed handshake (``on_monitor``) and the link is closed, its
questions dropped (their askers time out or ask again), and the next question connects afresh.
"""

from __future__ import annotations

import time
from typing import Callable

import zmq

from zmq.utils.monitor import recv_monitor_message

from tailrace.client import protocol as P

_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH)
HANDSHAKE_FAILED = _FAILURES[0] | _FAILURES[1] | _FAILURES[2]


class PeerLinks:
    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, keys=None):
        self.ctx, self.poller = ctx, poller
        self.keys = keys  # with --auth curve: the router's client keys (the cluster's server key; peers know ours)
        self.socks: dict[str, zmq.Socket] = {}  # endpoint -> DEALER
        # (endpoint, internal request id) -> (on_reply(endpoint, frames), sent): one question may go to several brokers
        self.waiting: dict[tuple[str, int], tuple[Callable, float]] = {}
        self.monitors: dict[str, zmq.Socket] = {}  # endpoint -> its link's monitor (with CURVE: failed handshakes)

    def send(self, endpoint: str, frames: list[bytes], rid: int = 0, on_reply: Callable | None = None) -> bool:
        """Queue ``frames`` to the broker at ``endpoint``; False if they could not be queued.
        Its reply (request id ``rid``) goes to ``on_reply(endpoint, frames)``."""
        sock = self.socks.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            if self.keys is not None:
                self.keys.apply(sock)
                mon = sock.get_monitor_socket(HANDSHAKE_FAILED)
                self.monitors[endpoint] = mon
                self.poller.register(mon, zmq.POLLIN)
            sock.connect(endpoint)
            self.socks[endpoint] = sock
            self.poller.register(sock, zmq.POLLIN)
        try:
            P.send_frames(sock, frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        if on_reply is not None:
            self.waiting[(endpoint, rid)] = (on_reply, time.monotonic())
        return True

    def to_leader(self, agent, topic: bytes, partition: int, frames: list[bytes], rid: int, on_reply: Callable) -> bool:
        """Send a request for a partition another broker leads to that broker's router; its
        reply goes to ``on_reply(code, frames)``. False when the partition has no live leader
        (or the send could not be queued): the caller tries again later."""
        a = agent.assignment(topic, partition)
        endpoint = agent.endpoint_of(a.leader) if a is not None and a.leader in agent.brokers else ""
        return bool(endpoint) and self.send(endpoint, frames, rid, lambda _ep, reply: reply and on_reply(
            P.unpack_routing(reply[0])[2], reply))

    def on_reply(self, endpoint: str, frames: list[bytes]) -> None:
        """A reply from the broker at ``endpoint``: to whoever asked (a late one finds nobody)."""
        if not frames:
            return
        try:
            rid = P.unpack_routing(frames[0])[4]
        except Exception:  # noqa: BLE001 - a broken reply is nobody's
            return
        waiter = self.waiting.pop((endpoint, rid), None)
        if waiter is not None:
            waiter[0](endpoint, frames)

    def on_monitor(self, endpoint: str) -> bool:
        """Events of ``endpoint``'s link monitor: a failed handshake closes the link (libzmq
        will not connect it again) and drops its questions. True if it was closed."""
        mon = self.monitors.get(endpoint)
        failed = False
        while mon is not None:
            try:
                failed |= recv_monitor_message(mon, zmq.NOBLOCK)["event"] in _FAILURES
            except zmq.Again:
                break
        if failed:
            self._close(endpoint)
            for key in [k for k in self.waiting if k[0] == endpoint]:
                del self.waiting[key]
        return failed

    def _close(self, endpoint: str) -> None:
        sock, mon = self.socks.pop(endpoint, None), self.monitors.pop(endpoint, None)
        if mon is not None:
            self.poller.unregister(mon)
            if sock is not None:
                sock.disable_monitor()
            mon.close(0)
        if sock is not None:
            self.poller.unregister(sock)
            sock.close(0)

    def expire(self, older_than_s: float) -> None:
        """Forget questions unanswered this long (their askers time out on their own)."""
        now = time.monotonic()
        for key in [k for k, (_cb, sent) in self.waiting.items() if now - sent > older_than_s]:
            del self.waiting[key]

    def close(self) -> None:
        for endpoint in list(self.socks):
            self._close(endpoint)


def others(agent) -> list[str]:
    """The client endpoints of the cluster's other live brokers."""
    return sorted({agent.endpoint_of(b) for b in agent.brokers if b != agent.me} - {""})


class Copies:
    """One request sent to every other live broker, its sender told once all of them answered or
    after ``wait_s`` (what it copied is durable at the sender either way): the group coordinator's
    copies of committed offsets (router/groups.py) and the share coordinator's of its state
    (router/share_cluster.py). ``tick`` ends the waits that ran out."""

    def __init__(self, peers: PeerLinks, next_id: Callable[[], int], what: str, wait_s: float, log):
        self.peers, self.next_id, self.what, self.wait_s, self.log = peers, next_id, what, wait_s, log
        self.waiting: list = []  # [deadline, endpoints left, done]

    def send(self, endpoints, op: int, name: bytes, header: bytes, done: Callable) -> None:
        """``done(OK, "")`` once every endpoint answered (a refusal is logged), or ``wait_s`` passed."""
        entry = [time.monotonic() + self.wait_s, set(endpoints), done]
        self.waiting.append(entry)

        def answered(endpoint, frames):
            code = P.unpack_routing(frames[0])[2] if frames else -1
            if code != P.ErrorCode.OK:
                self.log.warning("%s was not stored by %s (code %s)", self.what, endpoint, code)
            entry[1].discard(endpoint)
            self._settle(entry)
        for ep in sorted(entry[1]):
            rid = self.next_id()
            if not self.peers.send(ep, [P.pack_routing(op, -1, rid, name), header], rid, answered):
                entry[1].discard(ep)
        self._settle(entry)

    def _settle(self, entry: list) -> None:
        if not entry[1] and entry in self.waiting:
            self.waiting.remove(entry)
            entry[2](P.ErrorCode.OK, "")

    def tick(self, now: float) -> None:
        for entry in [e for e in self.waiting if e[0] <= now]:
            self.log.warning("%s not confirmed by %s within %.0f s (stored here)", self.what, sorted(entry[1]), self.wait_s)
            entry[1].clear()
            self._settle(entry)


class Pull:
    """At a start: one question to every other live broker (its copies of what this one keeps),
    asked again every ``again_s`` of those not yet answered (one that has not seen this broker's
    registration, or with --auth curve not let its key in, misses the first) and of those that
    answered NOT_READY (still reading their own back), until all answered or ``wait_s`` passed.
    Each answer's frames go to ``on_answer(endpoint, frames)``."""

    def __init__(self, peers: PeerLinks, next_id: Callable[[], int], op: int, header: bytes, on_answer: Callable,
                 what: str, wait_s: float, again_s: float, log):
        self.peers, self.next_id, self.op, self.header, self.on_answer = peers, next_id, op, header, on_answer
        self.what, self.wait_s, self.again_s, self.log = what, wait_s, again_s, log
        self.waiting: set[str] | None = None  # None: not asked yet
        self.deadline = self.again = 0.0
        self.done = False

    def step(self, now: float, endpoints) -> bool:
        """Ask (again) where due; True once done."""
        if self.done:
            return True
        if self.waiting is None:
            self.waiting, self.deadline = set(endpoints), now + self.wait_s
        if self.waiting and now < self.deadline:
            if now >= self.again:
                self.again = now + self.again_s
                for ep in sorted(self.waiting):
                    rid = self.next_id()
                    self.peers.send(ep, [P.pack_routing(self.op, -1, rid, b""), self.header], rid, self._answered)
            return False
        if self.waiting:
            self.log.warning("%s not received from %s within %.0f s", self.what, sorted(self.waiting), self.wait_s)
        self.waiting, self.done = set(), True
        return True

    def _answered(self, endpoint: str, frames: list[bytes]) -> None:
        if self.done or endpoint not in self.waiting:
            return
        code = P.unpack_routing(frames[0])[2]
        if code == P.ErrorCode.NOT_READY:
            return  # still reading its own back: asked again
        self.waiting.discard(endpoint)
        if code != P.ErrorCode.OK or len(frames) < 2:
            self.log.warning("%s from %s refused: %s", self.what, endpoint, code)
            return
        self.on_answer(endpoint, frames)
