"""Replies out of the broker's ROUTER sockets (router front door, worker sockets): never blocking
the loop, never queueing without bound. Broker-side: a client never needs it (client/protocol.py
keeps the frames and the raw send and receive both sides share)."""

from __future__ import annotations

from collections import deque
from time import monotonic as _monotonic

import zmq

from tailrace.client.protocol import NOBLOCK, send_frames

PEER_SNDHWM = 64  # replies queued inside ZeroMQ per ROUTER peer; past it, ReplyPort's own queue
PEER_BACKLOG_BYTES = 16 << 20  # ... holds up to this many bytes per peer (a burst), then drops
BACKLOG_BYTES = 128 << 20  # ... and this many over all peers
BACKLOG_STALL_S = 5.0  # a backlog that has not moved for this long is dropped


class ReplyPort:
    """Replies out of a ROUTER socket that never block the loop and never queue without bound.

    The socket is set up with ROUTER_MANDATORY and a per-peer send HWM of ``PEER_SNDHWM``
    messages (``configure``); sends never block. A peer's ZeroMQ queue fills when its own
    receive queue and the kernel buffers are full (it does not read) or, briefly, when a burst of
    replies outruns the I/O thread. Either way further replies to it wait, in order, in a
    per-peer backlog here that counts bytes: at most ``PEER_BACKLOG_BYTES`` per peer and
    ``BACKLOG_BYTES`` in all; ``flush`` (each loop turn while a backlog exists) moves them on as
    the peer's queue drains. A reply that does not fit, or whose peer is gone, is dropped and
    counted, with a log line at most every 5 s. So a client that pipelines requests and never
    reads costs the broker at most 64 replies plus 16 MiB, not every reply (400 unread 1 MiB
    fetches would be 400 MiB). A dropped reply loses no data: produce is idempotent and a fetch
    is a read; the client times out and retries.
    """

    def __init__(self, sock, log, what: str):
        self.sock, self.log, self.what = sock, log, what
        self.dropped = 0
        self.backlog: dict[bytes, deque] = {}  # peer -> replies waiting for room, in order
        self.backlog_bytes: dict[bytes, int] = {}
        self.total_backlog = 0
        self.moved_at: dict[bytes, float] = {}  # peer -> when its backlog last moved
        self._logged_at = float("-inf")
        self._logged_count = 0
        self.touched = False  # sent on the socket since the owner last looked (its loop's ZMQ_FD rule)

    @staticmethod
    def configure(sock) -> None:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, PEER_SNDHWM)

    def send(self, frames) -> bool:
        """Send or queue a reply; False if it was dropped."""
        peer = bytes(frames[0])
        self.touched = True
        if peer not in self.backlog:
            try:
                send_frames(self.sock, frames, NOBLOCK)  # MANDATORY fails on the first frame or not at all
                return True
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                return self._drop(peer, "gone")
        size = sum(len(f) for f in frames)
        held = self.backlog_bytes.get(peer, 0)
        if held + size > PEER_BACKLOG_BYTES or self.total_backlog + size > BACKLOG_BYTES:
            return self._drop(peer, "not reading")
        if peer not in self.backlog:
            self.backlog[peer] = deque()
            self.moved_at[peer] = _monotonic()
        self.backlog[peer].append(frames)
        self.backlog_bytes[peer] = held + size
        self.total_backlog += size
        return True

    def flush(self) -> None:
        """Move backlogged replies on as their peers' queues drain (call once per loop turn)."""
        now = _monotonic()
        self.touched = True
        for peer in list(self.backlog):
            q = self.backlog[peer]
            if now - self.moved_at[peer] > BACKLOG_STALL_S:  # not reading at all: let it go
                self.dropped += len(q) - 1
                self._drop(peer, f"not reading for {BACKLOG_STALL_S:.0f} s")
                q.clear()
            while q:
                frames = q[0]
                try:
                    send_frames(self.sock, frames, NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    self.dropped += len(q) - 1
                    self._drop(peer, "gone")
                    q.clear()
                    break
                q.popleft()
                self.moved_at[peer] = now
                size = sum(len(f) for f in frames)
                self.backlog_bytes[peer] -= size
                self.total_backlog -= size
            if not q:
                self.total_backlog -= self.backlog_bytes.pop(peer, 0)
                del self.backlog[peer]
                del self.moved_at[peer]

    def _drop(self, peer: bytes, why: str) -> bool:
        self.dropped += 1
        now = _monotonic()
        if now - self._logged_at >= 5.0:
            self.log.warning("%s: dropped %d replies to peers that are gone or not reading (latest: peer %r, %s)",
                             self.what, self.dropped - self._logged_count, peer[:16], why)
            self._logged_at, self._logged_count = now, self.dropped
        return False
