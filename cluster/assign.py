"""Which broker leads a partition: pure, no I/O, no clock (the controller feeds it what it read).

Balance is by partition count: each partition goes to the live broker that holds the fewest now
(ties to the lower id), counting the ones placed in the same call, so ``n`` partitions over ``b``
empty brokers land ``ceil(n/b)`` or ``floor(n/b)`` on each. Measured load (the bytes and requests
a single host's scheduler already weighs, router/load.py) and racks come later; the counts are
what the controller knows without asking a broker.
"""

from __future__ import annotations

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
