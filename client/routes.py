"""Client-side addressing: which worker endpoint serves each partition, and when to use it.

The router tells (DESCRIBE_TOPIC) which worker owns each partition and that worker's endpoint.
A partition is sent to directly once the owner has adopted it: DESCRIBE says so (``adopted``,
when the router has already forwarded a request for it to that owner or told it to ADOPT), or one
request of this client's went through the router and was answered OK (the router's forwarded
request is what makes a worker adopt a partition). A
``NOT_OWNER`` reply, or a direct request lost with a worker, sends the partition back to the
router path and schedules a fresh DESCRIBE: the router path always works, for any client.
"""

from __future__ import annotations

import os
import time

from . import protocol as P
from . import unixwire
from .connection import Pool

REFRESH_S = 1.0


class Routes:
    def __init__(self, pool: Pool, direct: bool = True, same_host: bool = False):
        self.pool = pool
        self.direct = direct
        self.same_host = same_host  # address owners at their Unix sockets (client/unixwire.py)
        self.partitions_of: dict[str, int] = {}  # topic -> partition count
        self.endpoints: dict[tuple[str, int], str] = {}  # (topic, p) -> worker endpoint
        self.confirmed: set[tuple[str, int]] = set()  # answered OK via the router at least once
        self.refresh_at: dict[str, float] = {}  # topic -> when to DESCRIBE again

    def describe(self, topic: str) -> int:
        r = self.pool.router.request(P.Op.DESCRIBE_TOPIC, topic)
        d = P.decoder(P.DescribeReply).decode(r.header)
        self.partitions_of[topic] = d.topic.partitions
        for pi in d.partitions:
            old = self.endpoints.get((topic, pi.partition))
            if old is not None and old not in (pi.endpoint, pi.local_endpoint):
                self.confirmed.discard((topic, pi.partition))
            if pi.adopted:
                self.confirmed.add((topic, pi.partition))
            local = self.same_host and pi.local_endpoint and os.path.exists(unixwire.path_of(pi.local_endpoint))
            self.endpoints[(topic, pi.partition)] = pi.local_endpoint if local else pi.endpoint
        self.refresh_at.pop(topic, None)
        return d.topic.partitions

    def partitions(self, topic: str) -> int:
        n = self.partitions_of.get(topic)
        return self.describe(topic) if n is None else n

    def endpoint(self, topic: str, partition: int) -> str | None:
        """Where to send a request for this partition now (None: through the router)."""
        if not self.direct:
            return None
        if topic not in self.partitions_of:
            try:
                self.describe(topic)
            except Exception:
                return None  # unknown topic and the like: the router's reply will say so
        t = self.refresh_at.get(topic)
        if t is not None and time.monotonic() >= t:
            try:
                self.describe(topic)
            except Exception:
                self.refresh_at[topic] = time.monotonic() + REFRESH_S
        if (topic, partition) not in self.confirmed:
            return None
        return self.endpoints.get((topic, partition))

    def answered(self, topic: str, partition: int, via: str, code: int) -> None:
        tp = (topic, partition)
        if code == P.ErrorCode.OK and via == self.pool.router.endpoint:
            self.confirmed.add(tp)
        elif code == P.ErrorCode.NOT_OWNER:
            self.demote(topic, partition)

    def demote(self, topic: str, partition: int) -> None:
        self.confirmed.discard((topic, partition))
        self.refresh_at.setdefault(topic, time.monotonic() + REFRESH_S)
