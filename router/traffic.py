"""The broker's traffic as the router sees it: each worker's running totals (records and bytes in
and out, protocol.TOTALS) arrive with its heartbeat; the router adds them up across workers and
worker restarts and turns them into rates over the last RATE_WINDOW_S. Pure bookkeeping, no
sockets: unit-tested in tests/unit/test_traffic.py.
"""

from __future__ import annotations

import time
from collections import deque

from tailrace.client.protocol import TOTALS

RATE_WINDOW_S = 5.0
N = len(TOTALS)


class Traffic:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.current: dict[int, tuple[int, list[int]]] = {}  # worker -> (boot_ns, its totals)
        self.gone = [0] * N  # totals of worker lives that ended (a restart starts from zero)
        self.unflushed_by: dict[int, int] = {}  # worker -> records not yet durable
        self.samples: deque[tuple[float, list[int]]] = deque()
        self.restarts: dict[int, int] = {}  # worker -> new boot ids seen
        self.retired: dict[int, int] = {}  # worker -> boot id of the life forget() already counted

    def on_heartbeat(self, worker: int, boot_ns: int, totals: list[int], unflushed: int) -> None:
        if len(totals) != N or self.retired.get(worker) == boot_ns:
            return  # a worker of an older version (it reports none), or a retired life counted already
        before = self.current.get(worker)
        if before is not None and before[0] != boot_ns:
            self.gone = [g + t for g, t in zip(self.gone, before[1])]
            self.restarts[worker] = self.restarts.get(worker, 0) + 1
        self.current[worker] = (boot_ns, list(totals))
        self.unflushed_by[worker] = unflushed

    def forget(self, worker: int) -> None:
        """A worker retired: keep what it did, stop counting its unflushed records."""
        before = self.current.pop(worker, None)
        if before is not None:
            self.gone = [g + t for g, t in zip(self.gone, before[1])]
            self.retired[worker] = before[0]
        self.unflushed_by.pop(worker, None)

    def totals(self) -> list[int]:
        out = list(self.gone)
        for _boot, t in self.current.values():
            out = [a + b for a, b in zip(out, t)]
        return out

    def unflushed(self) -> int:
        return sum(self.unflushed_by.values())

    def sample(self) -> None:
        """Once per heartbeat: remember the totals, for the rates."""
        now = self.clock()
        self.samples.append((now, self.totals()))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()

    def rates(self) -> dict[str, float]:
        if len(self.samples) < 2:
            return dict.fromkeys(TOTALS, 0.0)
        (t0, a), (t1, b) = self.samples[0], self.samples[-1]
        dt = max(t1 - t0, 1e-9)
        return {name: round(max(0, y - x) / dt, 1) for name, x, y in zip(TOTALS, a, b)}
