"""The group assignor: which member of a consumer group reads which partition.

Sticky and balanced within one, deterministic (the same inputs give the same answer in any
process), the direction of Kafka's KIP-848 server-side ``uniform`` assignor:

1. every member keeps the partitions it has that it still subscribes to and that still exist;
2. each member's quota is ``n // m`` partitions, ``n % m`` of them one more: the members that
   already hold the most get the larger quotas (ties by member id), so fewer partitions move;
3. a member over its quota gives back its last partitions (in (topic, partition) order);
4. the partitions without an owner go, in order, to the subscribed member furthest below its
   quota (ties by member id).

With every member subscribed to the same topics each member ends with exactly its quota, and a
partition moves only if its member left or must give it up for the balance: a join moves about
``n / (m + 1)`` partitions, a leave only the leaver's. With different subscriptions a member
only gets partitions of its topics; the result is then as balanced as the subscriptions allow
without moving more (a partition nobody subscribes to is assigned to nobody).
"""

from __future__ import annotations

from typing import Iterable, Mapping

TP = tuple[str, int]


def assign(subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int],
           current: Mapping[str, Iterable[TP]]) -> dict[str, set[TP]]:
    """``subscriptions``: member -> topics; ``partitions``: topic -> partition count (topics
    missing here do not exist); ``current``: member -> the partitions it is assigned now.
    Returns member -> its new assignment (every member present, perhaps with nothing)."""
    members = sorted(subscriptions)
    if not members:
        return {}
    subs = {m: frozenset(subscriptions[m]) for m in members}
    topics = sorted({t for s in subs.values() for t in s if t in partitions})
    tps = [(t, p) for t in topics for p in range(int(partitions[t]))]
    eligible = {t: [m for m in members if t in subs[m]] for t in topics}
    owner: dict[TP, str] = {}
    held: dict[str, list[TP]] = {m: [] for m in members}
    for m in members:
        for tp in sorted(current.get(m, ())):
            t, p = tp
            if t in subs[m] and t in partitions and 0 <= p < int(partitions[t]) and tp not in owner:
                owner[tp] = m
                held[m].append(tp)
    base, extra = divmod(len(tps), len(members))
    ranked = sorted(members, key=lambda m: (-len(held[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}
    free: list[TP] = []
    for m in members:
        over = len(held[m]) - quota[m]
        if over > 0:
            free += held[m][-over:]
            del held[m][-over:]
    free += [tp for tp in tps if tp not in owner]
    for tp in sorted(free):
        cands = eligible[tp[0]]
        if not cands:
            continue
        best = min(cands, key=lambda m: (len(held[m]) - quota[m], m))
        held[best].append(tp)
    return {m: set(held[m]) for m in members}
