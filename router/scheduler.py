"""The sticky min-heap scheduler (Xiaomi Talos): which worker owns which partition.

Pure: no I/O, no clock of its own; the router feeds it and asks it. Rules:

- sticky: a partition that has an owner keeps it; ``place`` of a known partition returns its
  owner without touching the heap;
- least loaded: a new partition goes to the worker with the lowest load, taken from a min-heap
  of ``(load, worker, seq)``; ties go to the lower worker id, so the same catalog always
  yields the same placement (``seq`` only keeps entries distinct);
- lazy deletion (as trio's deadline heap): changing a worker's load pushes a fresh entry and
  leaves the old one in the heap; an entry whose load no longer matches the worker's current
  load, or whose worker is not alive, is stale and dropped when it reaches the top. The heap is
  rebuilt when stale entries outnumber live ones, so it stays O(workers).

Load here is the number of partitions owned, weighted (``weight`` per partition, default 1).
"""

from __future__ import annotations

import heapq
import itertools


class StickyScheduler:
    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.owner: dict[int, int] = {}  # slot -> worker
        self.weight: dict[int, int] = {}  # slot -> weight counted in its owner's load
        self.load: dict[int, int] = {w: 0 for w in range(workers)}  # worker -> load
        self.alive: set[int] = set(range(workers))
        self._seq = itertools.count()
        self._heap: list[tuple[int, int, int]] = []  # heap of (load, worker, seq)
        for w in range(workers):
            self._push(w)

    def _push(self, worker: int) -> None:
        heapq.heappush(self._heap, (self.load[worker], worker, next(self._seq)))
        if len(self._heap) > 4 * max(len(self.alive), 1) + 16:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(self.load[w], w, next(self._seq)) for w in self.alive]
        heapq.heapify(self._heap)

    def _least_loaded(self) -> int:
        while self._heap:
            load, worker, _ = self._heap[0]
            if worker in self.alive and self.load[worker] == load:
                return worker
            heapq.heappop(self._heap)  # stale: load changed or worker gone
        raise RuntimeError("no live worker to place a partition on")

    def place(self, slot: int, weight: int = 1) -> int:
        """Owner of ``slot``, choosing the least-loaded live worker the first time."""
        w = self.owner.get(slot)
        if w is not None:
            return w
        w = self._least_loaded()
        self.owner[slot] = w
        self.weight[slot] = weight
        self.load[w] += weight
        self._push(w)
        return w

    def release(self, slot: int) -> None:
        w = self.owner.pop(slot, None)
        if w is None:
            return
        self.load[w] -= self.weight.pop(slot)
        if w in self.alive:
            self._push(w)

    def partitions_of(self, worker: int) -> list[int]:
        return sorted(s for s, w in self.owner.items() if w == worker)
