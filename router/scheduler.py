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

A worker's heap key is ``total(w) = load[w] + traffic[w]``: ``load`` is the number of
partitions it owns, weighted (``weight`` per partition, default 1); ``traffic`` is what its last
heartbeat reported (requests it holds plus its decayed append rate in MiB/s, fed in by the
router through ``set_traffic``), so a new partition goes to the worker that is least busy, not
merely the one with the fewest partitions.
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
        self.load: dict[int, int] = {w: 0 for w in range(workers)}  # worker -> owned weight
        self.traffic: dict[int, float] = {}  # worker -> held requests + MiB/s, from heartbeats
        self.alive: set[int] = set(range(workers))
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, int]] = []  # heap of (total, worker, seq)
        for w in range(workers):
            self._push(w)

    def total(self, worker: int) -> float:
        """The heap key: owned partition weight plus the traffic last reported."""
        return self.load[worker] + self.traffic.get(worker, 0.0)

    def set_traffic(self, worker: int, traffic: float) -> None:
        """Requests held + MiB/s appended, as of the worker's last heartbeat."""
        if worker not in self.load or self.traffic.get(worker, 0.0) == traffic:
            return
        self.traffic[worker] = traffic
        if worker in self.alive:
            self._push(worker)

    def _push(self, worker: int) -> None:
        heapq.heappush(self._heap, (self.total(worker), worker, next(self._seq)))
        if len(self._heap) > 4 * max(len(self.alive), 1) + 16:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(self.total(w), w, next(self._seq)) for w in self.alive]
        heapq.heapify(self._heap)

    def _least_loaded(self) -> int:
        while self._heap:
            total, worker, _ = self._heap[0]
            if worker in self.alive and self.total(worker) == total:
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

    def move(self, slot: int, to: int) -> None:
        """Hand ``slot`` to worker ``to`` (a live one), keeping its weight."""
        if to not in self.alive:
            raise ValueError(f"cannot move slot={slot} to worker={to}: not alive")
        weight = self.weight.get(slot, 1)
        self.release(slot)
        self.owner[slot] = to
        self.weight[slot] = weight
        self.load[to] += weight
        self._push(to)

    def mark_dead(self, worker: int) -> None:
        self.alive.discard(worker)  # its heap entries become stale and are dropped lazily

    def mark_alive(self, worker: int) -> None:
        if worker not in self.alive:
            self.alive.add(worker)
            self._push(worker)

    # --- growing and shrinking the worker set ---------------------------------------------
    def add_worker(self, worker: int, alive: bool = False) -> None:
        """A new worker id; it takes partitions once ``mark_alive`` (its first heartbeat)."""
        self.load.setdefault(worker, 0)
        if alive:
            self.mark_alive(worker)

    def forget(self, worker: int) -> None:
        """Drop a retired worker that owns nothing any more."""
        if self.partitions_of(worker):
            raise ValueError(f"worker {worker} still owns {self.partitions_of(worker)}")
        self.alive.discard(worker)
        self.load.pop(worker, None)
        self.traffic.pop(worker, None)

    def least_loaded(self) -> int:
        return self._least_loaded()

    def spread(self, busy: set[int] = frozenset()) -> tuple[list[tuple[int, int, int]], bool]:
        """Even out partition counts over live workers, moving only partitions not in ``busy``.

        Returns ([(slot, from, to)], balanced): moves until no live worker carries more than one
        partition's weight above another, or until the most loaded one has nothing idle left."""
        moves = []
        while len(self.alive) > 1:
            src = max(self.alive, key=lambda w: (self.load[w], -w))
            dst = min(self.alive, key=lambda w: (self.load[w], w))
            idle = [slot for slot in self.partitions_of(src) if slot not in busy]
            if not idle or self.load[src] - self.load[dst] <= self.weight.get(idle[-1], 1):
                return moves, self.load[src] - self.load[dst] <= 1
            self.move(idle[-1], dst)
            moves.append((idle[-1], src, dst))
        return moves, True

    def evacuate(self, worker: int) -> list[tuple[int, int]]:
        """Place every partition of a worker declared dead on live workers: [(slot, new owner)]."""
        moved = []
        for slot in self.partitions_of(worker):
            weight = self.weight.get(slot, 1)
            self.release(slot)
            moved.append((slot, self.place(slot, weight)))
        return moved


class Rebalancer:
    """When and what to move off an overloaded worker. Pure: the router feeds it loads and time.

    Load of a partition comes from the load model (router/load.py: requests the worker holds
    for it, such as parked fetches and durable waiters, plus its decayed append rate in MiB/s);
    a worker's load is the sum over its partitions. A move is proposed only when

    - the most loaded live worker carries more than ``ratio`` x the least loaded one's load and
      at least ``min_gap`` more (the hysteresis band: inside it nothing moves, so a balanced
      cluster does not flap on noise);
    - the partition is idle (nothing in flight: a partition with requests in flight never moves),
      did not move in the last ``cooldown_s``, and carries at most half the gap (moving it narrows
      the imbalance without reversing it);
    - no move happened in the last ``interval_s`` (one move at a time, so loads settle);
    - the imbalance has lasted ``persist_s`` without a break (hysteresis in time: the loads are
      decayed averages of heartbeat snapshots, and an evenly loaded broker's averages cross the
      band now and then for a beat or two; a real hot spot stays).
    """

    def __init__(self, ratio: float = 1.5, min_gap: float = 1.0, cooldown_s: float = 30.0, interval_s: float = 2.0,
                 persist_s: float = 0.0):
        self.ratio, self.min_gap, self.cooldown_s, self.interval_s = ratio, min_gap, cooldown_s, interval_s
        self.persist_s = persist_s
        self.imbalanced_since: float | None = None  # when the current imbalance began
        self.last_moved: dict[int, float] = {}  # slot -> when it last moved
        self.last_move_at = float("-inf")

    def plan(self, sched: StickyScheduler, load: dict[int, float], busy: set[int], now: float):
        """(slot, from_worker, to_worker) to move now, or None."""
        if len(sched.alive) < 2:
            self.imbalanced_since = None
            return None
        per = {w: 0.0 for w in sched.alive}
        owner = sched.owner
        for slot, lo in load.items():  # (a partition absent from ``load`` carries none)
            w = owner.get(slot)
            if w in per:
                per[w] += lo
        src = max(per, key=lambda w: (per[w], -w))
        dst = min(per, key=lambda w: (per[w], w))
        gap = per[src] - per[dst]
        if gap < self.min_gap or per[src] <= self.ratio * per[dst]:
            self.imbalanced_since = None
            return None
        if self.imbalanced_since is None:
            self.imbalanced_since = now
        if now - self.imbalanced_since < self.persist_s or now - self.last_move_at < self.interval_s:
            return None  # the imbalance is tracked during the interval too: a break resets it
        best = None
        for slot in sorted(slot for slot, lo in load.items() if lo > 0 and owner.get(slot) == src):
            lo = load[slot]
            if slot in busy or now - self.last_moved.get(slot, float("-inf")) < self.cooldown_s:
                continue
            if 0 < lo <= gap / 2 and (best is None or lo > best[1]):
                best = (slot, lo)
        if best is None:
            return None
        return best[0], src, dst

    def moved(self, slot: int, now: float) -> None:
        self.last_moved[slot] = now
        self.last_move_at = now
