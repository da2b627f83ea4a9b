"""Where each partition lives now: the routes the router forwards by, and the owner epochs.

A route is ``(topic, partition) -> (worker, assign)``; ``assign`` is the ASSIGN frame (slot and
owner epoch) sent with every forwarded request, so a worker adopts a partition with no other
handshake. Owner epochs are ``generation << 32 | counter``: the generation is bumped and stored
durably at every router start (``next_generation``), so epochs only ever grow.

``Placement`` is the one writer of the routes: topic admin places new partitions here
(router/topics.py), worker liveness moves them (router/liveness.py), the router's loop reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tailrace.broker.catalog import Catalog
from tailrace.broker.datadir import ROUTER_FILE, write_atomic
from tailrace.client import protocol as P

from .scheduler import StickyScheduler


def next_generation(data_dir: str) -> int:
    """Bump and durably store the router generation: owner epochs only ever grow."""
    path = Path(data_dir) / ROUTER_FILE
    try:
        gen = int(json.loads(path.read_text())["generation"]) + 1
    except (FileNotFoundError, ValueError, KeyError):
        gen = 1
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"generation": gen}).encode())
    return gen


class Placement:
    """Routes, owner epochs and the scheduler that picks owners, over the catalog."""

    def __init__(self, catalog: Catalog, scheduler: StickyScheduler, generation: int):
        self.catalog = catalog
        self.scheduler = scheduler
        self.generation = generation
        self._epoch_counter = 0
        self.routes: dict[tuple[bytes, int], tuple[int, bytes]] = {}  # (topic, partition) -> (worker, assign frame)
        # (topic, partition) -> the assignment its owner was last sent (a forwarded request or an
        # ADOPT): equal to the route's means the owner has adopted it, or will with the request
        # already on its way; DESCRIBE says so, and clients then go to the owner from the start.
        self.told: dict[tuple[bytes, int], bytes] = {}
        for name in sorted(catalog.data.topics, key=lambda n: catalog.data.topics[n].topic_id):
            self.place_topic(name)

    def epoch(self) -> int:
        self._epoch_counter += 1
        return (self.generation << 32) | self._epoch_counter

    def place_topic(self, name: str, first: int = 0) -> None:
        """Place the topic's partitions from ``first`` on (the others keep their routes)."""
        t = self.catalog.get(name)
        tb = name.encode()
        for p, slot in enumerate(t.slots[first:], start=first):
            w = self.scheduler.place(slot)
            self.routes[(tb, p)] = (w, P.ASSIGN.pack(slot, self.epoch()))

    def route(self, topic: bytes, partition: int) -> tuple[int, bytes] | None:
        """The partition's (worker, assign), reading the catalog again once if it is not known
        (a topic another router generation made, or one made since)."""
        route = self.routes.get((topic, partition))
        if route is None and self.catalog.reload():
            for name in self.catalog.data.topics:
                if (name.encode(), 0) not in self.routes:
                    self.place_topic(name)
            route = self.routes.get((topic, partition))
        return route

    def move(self, topic: bytes, partition: int, slot: int, worker: int) -> bytes:
        """Route the partition to ``worker`` under a new epoch; the assign frame to send it."""
        assign = P.ASSIGN.pack(slot, self.epoch())
        self.routes[(topic, partition)] = (worker, assign)
        return assign

    def forget_topic(self, topic: bytes, slots) -> None:
        """A deleted topic: no routes, its slots back to the scheduler."""
        for p, slot in enumerate(slots):
            self.routes.pop((topic, p), None)
            self.told.pop((topic, p), None)
            self.scheduler.release(slot)
