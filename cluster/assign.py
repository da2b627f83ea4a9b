"""Which broker leads a partition: pure, no I/O, no clock (the controller feeds it what it read).

Balance is by partition count: each partition goes to the live broker that holds the fewest now
(ties to the lower id), counting the ones placed in the same call, so ``n`` partitions over ``b``
empty brokers land ``ceil(n/b)`` or ``floor(n/b)`` on each. Measured load (the bytes and requests
a single host's scheduler already weighs, router/load.py) and racks come later; the counts are
what the controller knows without asking a broker.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Iterable, Mapping


def partition_counts(live: Iterable[int], replicas_of: Iterable[list[int]]) -> dict[int, int]:
    """Partitions each live broker holds a replica of (brokers that are not live are left out)."""
    counts = {b: 0 for b in live}
    for replicas in replicas_of:
        for b in replicas:
            if b in counts:
                counts[b] += 1
    return counts


def place(counts: Mapping[int, int], n: int) -> list[int]:
    """Leaders for ``n`` new partitions over the brokers of ``counts`` (broker -> partitions it
    holds now), the least loaded first."""
    if n and not counts:
        raise ValueError(f"n={n} partitions to place and no broker")
    heap = [(c, b) for b, c in counts.items()]  # heap of (partitions held, broker id)
    heapq.heapify(heap)
    chosen = []
    for _ in range(n):
        c, b = heapq.heappop(heap)
        chosen.append(b)
        heapq.heappush(heap, (c + 1, b))
    return chosen


def rendezvous(key: str, brokers: Iterable[int]) -> list[int]:
    """``brokers`` in the order ``key`` prefers them (highest random weight hashing): every broker
    computes the same order from the same set, and a broker leaving moves only the keys it was
    first for, each to its next one. A group's coordinator is the first live broker of its order."""
    def weight(b: int) -> int:
        return int.from_bytes(hashlib.blake2b(f"{key}\0{int(b)}".encode(), digest_size=8).digest(), "big")
    return sorted(brokers, key=lambda b: (-weight(b), b))
