"""Router -> router links in a cluster: the questions one broker asks another.

A DESCRIBE_TOPIC or LIST_OFFSETS that a client asks any broker is answered for the whole topic
(docs/DESIGN.md "Cluster"): the broker answers the partitions it leads from its own workers and
asks each other live leader of the topic for the rest, with ``local=True`` (that broker's own log
only, never asked onwards). ``PeerLinks`` holds one DEALER per other broker's advertised client
endpoint, connected on first use and registered in the router's poller; replies come back as
ordinary client replies (``[routing, body]``), matched by the router's internal request id to
the callback its sender gave (the offsets questions, router/offsets.py; the group coordinator's
copies of committed offsets, router/groups.py).
"""

from __future__ import annotations

import time
from typing import Callable

import zmq

from tailrace.client import protocol as P


class PeerLinks:
    def __init__(self, ctx: zmq.Context, poller: zmq.Poller):
        self.ctx, self.poller = ctx, poller
        self.socks: dict[str, zmq.Socket] = {}  # endpoint -> DEALER
        # (endpoint, internal request id) -> (on_reply(endpoint, frames), sent): one question may go to several brokers
        self.waiting: dict[tuple[str, int], tuple[Callable, float]] = {}

    def send(self, endpoint: str, frames: list[bytes], rid: int = 0, on_reply: Callable | None = None) -> bool:
        """Queue ``frames`` to the broker at ``endpoint``; False if they could not be queued.
        Its reply (request id ``rid``) goes to ``on_reply(endpoint, frames)``."""
        sock = self.socks.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
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

    def expire(self, older_than_s: float) -> None:
        """Forget questions unanswered this long (their askers time out on their own)."""
        now = time.monotonic()
        for key in [k for k, (_cb, sent) in self.waiting.items() if now - sent > older_than_s]:
            del self.waiting[key]

    def close(self) -> None:
        for sock in self.socks.values():
            self.poller.unregister(sock)
            sock.close(0)
        self.socks.clear()
