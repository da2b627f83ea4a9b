"""The worker's shared state that handlers are handed pieces of (never the process object).

Each handler module (produce, fetch, offsets, watch, adopt, ping) declares the narrow context it
takes, built once by ``Worker`` from the pieces here; a piece is shared by reference, so what a
handler stores the loop sees in the same turn. Everything here belongs to the worker's one loop
thread (the disk-reader thread gets callbacks run on the loop, never these objects).
"""

from __future__ import annotations

import heapq
import time


class Outbox:
    """Where replies go: the reply port (ZeroMQ and the Unix socket, actors/unix_server.py
    ``PortMux``), the count of replies by (op, code), and the replies a quota holds back."""

    def __init__(self, port=None):
        self.port = port
        self.replies: dict[tuple[int, int], int] = {}  # (op, code) -> replies
        self.held: list = []  # heap of (due ns, seq, reply frames): replies held back by a quota
        self._seq = 0

    def count(self, op: int, code: int) -> None:
        """One reply to a client (the router's heartbeat PINGs are not counted: ``Worker``)."""
        key = (op, code)
        self.replies[key] = self.replies.get(key, 0) + 1

    def send_after(self, frames: list, hold_ms: int) -> None:
        """Send a reply now, or ``hold_ms`` from now (a quota's throttle: ``release_held``)."""
        if hold_ms <= 0:
            self.port.send(frames)
            return
        self.hold_until(time.monotonic_ns() + hold_ms * 1_000_000, frames)

    def hold_until(self, due_ns: int, frames: list) -> None:
        self._seq += 1
        heapq.heappush(self.held, (due_ns, self._seq, frames))

    def release_held(self, now_ns: int) -> int:
        """Send the held replies that are due; ms until the next one (-1: none held)."""
        held = self.held
        while held and held[0][0] <= now_ns:
            self.port.send(heapq.heappop(held)[2])
        return max(1, (held[0][0] - now_ns) // 1_000_000) if held else -1


class Traffic:
    """What this worker moved, for PING (the router's load model) and the metrics exporter
    (broker/stats.py): one add per request, never per record."""

    __slots__ = ("totals", "appended_bytes", "fetched")

    def __init__(self):
        self.totals = [0, 0, 0, 0]  # P.TOTALS since this worker started
        self.appended_bytes: dict[int, int] = {}  # slot -> bytes appended since the last PING
        self.fetched: dict[int, list[int]] = {}  # slot -> [records, bytes] returned by fetches


class Turn:
    """What one loop turn did, for the work after it (waking readers, kicking the flusher,
    releasing durable acks, answering parked fetches), and who waits across turns."""

    __slots__ = ("appended", "late", "durable_added", "unkicked_bytes", "parked_slots", "waiting_slots")

    def __init__(self):
        self.appended: set[int] = set()  # slots appended to in this loop turn
        self.late: set[int] = set()  # slots appended to in this loop turn after its first append
        self.durable_added = False  # a durable waiter was added this turn: kick the flusher now
        self.unkicked_bytes = 0  # appended since the last kick of the flusher
        self.parked_slots: set[int] = set()  # slots with parked fetches
        self.waiting_slots: set[int] = set()  # slots with durable waiters
