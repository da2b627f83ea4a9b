"""Which broker leads a partition: pure, no I/O, no clock (the controller feeds it what it read).

Balance is by partition count and measured load. Each broker's cost is its partition count over
the mean count plus its measured load (bytes in and out per second, what each broker publishes,
cluster/metadata.py BrokerLoad) over the mean load, both plus ``LOAD_FLOOR`` (1 MB/s: a trickle
against idle brokers decides nothing); each new partition goes to the broker of
least cost (ties to the lower id), its count bumped, so ``n`` partitions over ``b`` equally busy
empty brokers land ``ceil(n/b)`` or ``floor(n/b)`` on each, and a broker carrying three times the
others' traffic takes fewer until its count outweighs it. A new partition has no load yet: load
only tilts where the counts go. Without loads (none published yet, an idle cluster) it is counts
alone. With a replication factor above 1 (``place_replicas``) each partition takes that many
distinct brokers, the least costly first (every replica counts as one partition held), and leads
on the one of them that leads fewest so far, so leaders spread as evenly as replicas. Racks are
not used yet.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Iterable, Mapping


LOAD_FLOOR = 1_000_000.0  # bytes/s added to every broker's load before comparing: traffic far below it barely counts


def partition_counts(live: Iterable[int], replicas_of: Iterable[list[int]]) -> dict[int, int]:
    """Partitions each live broker holds a replica of (brokers that are not live are left out)."""
    counts = {b: 0 for b in live}
    for replicas in replicas_of:
        for b in replicas:
            if b in counts:
                counts[b] += 1
    return counts


def place(counts: Mapping[int, int], n: int, loads: Mapping[int, float] | None = None) -> list[int]:
    """Leaders for ``n`` new partitions over the brokers of ``counts`` (broker -> partitions it
    holds now), the least costly first; ``loads``: broker -> measured bytes per second (a broker
    without one counts as the mean)."""
    if n and not counts:
        raise ValueError(f"n={n} partitions to place and no broker")
    known = [float(loads[b]) for b in counts if loads and b in loads]
    mean_load = sum(known) / len(known) if known else 0.0
    mean_count = max(1.0, sum(counts.values()) / len(counts)) if counts else 1.0
    # the load term of each broker, fixed for the call (new partitions have no load yet); the floor
    # keeps a trickle (a few KB/s against idle brokers) from deciding: loads well under it weigh little
    tilt = {b: (float(loads.get(b, mean_load)) + LOAD_FLOOR) / (mean_load + LOAD_FLOOR) if loads else 1.0 for b in counts}
    heap = [(c / mean_count + tilt[b], b, c) for b, c in counts.items()]  # (cost, broker id, partitions held)
    heapq.heapify(heap)
    chosen = []
    for _ in range(n):
        _cost, b, c = heapq.heappop(heap)
        chosen.append(b)
        heapq.heappush(heap, ((c + 1) / mean_count + tilt[b], b, c + 1))
    return chosen


def place_replicas(counts: Mapping[int, int], n: int, rf: int, loads: Mapping[int, float] | None = None,
                   leaders: Mapping[int, int] | None = None) -> list[list[int]]:
    """Replica lists for ``n`` new partitions, ``rf`` distinct brokers each, over the brokers of
    ``counts`` (broker -> replicas it holds now); each list's first broker is the partition's
    preferred leader: of the ``rf`` least costly, the one leading fewest (``leaders``: broker ->
    partitions it leads now; then the cheaper). ``rf`` = 1 is ``place``."""
    if n and not 1 <= rf <= len(counts):
        raise ValueError(f"replication factor {rf} needs {rf} live brokers, {len(counts)} are")
    known = [float(loads[b]) for b in counts if loads and b in loads]
    mean_load = sum(known) / len(known) if known else 0.0
    mean_count = max(1.0, sum(counts.values()) / len(counts)) if counts else 1.0
    tilt = {b: (float(loads.get(b, mean_load)) + LOAD_FLOOR) / (mean_load + LOAD_FLOOR) if loads else 1.0 for b in counts}
    held = dict(counts)
    led = {b: int((leaders or {}).get(b, 0)) for b in counts}
    out = []
    for _ in range(n):
        ranked = sorted(held, key=lambda b: (held[b] / mean_count + tilt[b], b))[:rf]
        lead = min(ranked, key=lambda b: (led[b], ranked.index(b)))
        replicas = [lead, *(b for b in ranked if b != lead)]
        for b in replicas:
            held[b] += 1
        led[lead] += 1
        out.append(replicas)
    return out


def rendezvous(key: str, brokers: Iterable[int]) -> list[int]:
    """``brokers`` in the order ``key`` prefers them (highest random weight hashing): every broker
    computes the same order from the same set, and a broker leaving moves only the keys it was
    first for, each to its next one. A group's coordinator is the first live broker of its order."""
    def weight(b: int) -> int:
        return int.from_bytes(hashlib.blake2b(f"{key}\0{int(b)}".encode(), digest_size=8).digest(), "big")
    return sorted(brokers, key=lambda b: (-weight(b), b))
