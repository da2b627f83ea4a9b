"""Client-side addressing: which worker endpoint serves each partition, and when to use it.

The router tells (DESCRIBE_TOPIC) which worker owns each partition and that worker's endpoint.
A partition is sent to directly once the owner has adopted it: DESCRIBE says so (``adopted``,
when the router has already forwarded a request for it to that owner or told it to ADOPT), or one
request of this client's went through the router and was answered OK (the router's forwarded
request is what makes a worker adopt a partition). A
``NOT_OWNER`` reply, or a direct request lost with a worker, sends the partition back to the
router path and schedules a fresh DESCRIBE: the router path always works, for any client.

``Routes`` holds that state and decides; it does no I/O. Whoever owns it makes the DESCRIBE
requests it asks for (``due``) and hands the answers in (``learn``): ``BlockingRoutes`` below
does it inline, the asyncio client (aio.py) in a task of its own.
"""

from __future__ import annotations

import os
import time

from . import protocol as P
from . import unixwire

REFRESH_S = 1.0
METADATA_MAX_AGE_S = 30.0  # a topic is described again this long after (a grown topic's new partitions: Kafka's metadata.max.age.ms)


class Routes:
    def __init__(self, router_endpoint: str, direct: bool = True, same_host: bool = False):
        self.router_endpoint = router_endpoint
        self.direct = direct
        self.same_host = same_host  # address owners at their Unix sockets (client/unixwire.py)
        self.partitions_of: dict[str, int] = {}  # topic -> partition count
        self.endpoints: dict[tuple[str, int], str] = {}  # (topic, p) -> worker endpoint
        self.confirmed: set[tuple[str, int]] = set()  # answered OK via the router at least once
        self.refresh_at: dict[str, float] = {}  # topic -> when to DESCRIBE again
        self.learned_at: dict[str, float] = {}  # topic -> when its DESCRIBE was last taken in
        self.max_batch_bytes = 0  # the broker's batch limit, from DESCRIBE (0: not heard yet)
        # a cluster (DESCRIBE said broker_id, or a reply said NOT_LEADER_OR_FOLLOWER): partitions
        # another broker leads go through that broker's endpoint, not the bootstrap router
        self.cluster = False
        self.leaders: dict[tuple[str, int], str] = {}  # (topic, p) -> its leader's client endpoint
        # partitions the last DESCRIBE said another broker leads: their worker endpoint is that broker's, never
        # addressed directly, even once a request through the bootstrap router succeeded (the leader moved here
        # since: until the next DESCRIBE the endpoint known is the old leader's worker, which would take it)
        self.remote: set[tuple[str, int]] = set()
        # bumped whenever what ``route`` or ``group_of`` answers may have changed: the consumer's
        # lanes (client/fetches.py) made before are grouped afresh
        self.epoch = 0

    def learn(self, topic: str, d: P.DescribeReply) -> int:
        """Take in a DESCRIBE_TOPIC answer; returns the topic's partition count."""
        self.partitions_of[topic] = d.topic.partitions
        if d.max_batch_bytes > 0:
            self.max_batch_bytes = d.max_batch_bytes
        if d.broker_id >= 0:
            self.cluster = True
        before = self._known(topic, d.partitions)
        for pi in d.partitions:
            if pi.leader_endpoint:
                self.leaders[(topic, pi.partition)] = pi.leader_endpoint
                self.remote.add((topic, pi.partition))
            else:
                self.leaders.pop((topic, pi.partition), None)
                self.remote.discard((topic, pi.partition))
            old = self.endpoints.get((topic, pi.partition))
            if old is not None and old not in (pi.endpoint, pi.local_endpoint):
                self.confirmed.discard((topic, pi.partition))
            if pi.adopted:
                self.confirmed.add((topic, pi.partition))
            local = self.same_host and pi.local_endpoint and os.path.exists(unixwire.path_of(pi.local_endpoint))
            self.endpoints[(topic, pi.partition)] = pi.local_endpoint if local else pi.endpoint
        if self._known(topic, d.partitions) != before:
            self.epoch += 1
        self.refresh_at.pop(topic, None)
        self.learned_at[topic] = time.monotonic()
        return d.topic.partitions

    def _known(self, topic: str, partitions) -> list:
        """What routing knows of these partitions (to tell whether a DESCRIBE changed any)."""
        return [(self.endpoints.get(tp), self.leaders.get(tp), tp in self.confirmed, tp in self.remote)
                for tp in ((topic, pi.partition) for pi in partitions)]

    def stale(self, topic: str) -> bool:
        """Whether what is known of ``topic`` is older than METADATA_MAX_AGE_S."""
        t = self.learned_at.get(topic)
        return t is not None and time.monotonic() - t >= METADATA_MAX_AGE_S

    def due(self, topic: str) -> bool:
        """Whether a DESCRIBE of ``topic`` is wanted before addressing it (never unknown to a
        client that goes through the router only: it does not need one)."""
        if topic not in self.partitions_of:
            return self.direct or self.cluster
        if self.stale(topic):
            return True  # any client: the partition count may have grown
        if not self.direct and not self.cluster:
            return False
        t = self.refresh_at.get(topic)
        return t is not None and time.monotonic() >= t

    def failed(self, topic: str) -> None:
        """A DESCRIBE of ``topic`` failed: a known topic is asked about again in REFRESH_S (an
        unknown one at its next use: the router's reply to the request itself will say why)."""
        if topic in self.partitions_of:
            self.refresh_at[topic] = time.monotonic() + REFRESH_S

    def route(self, topic: str, partition: int) -> str | None:
        """Where to send a request for this partition now, from what is known (None: through
        the router)."""
        tp = (topic, partition)
        if not self.direct or tp not in self.confirmed or tp in self.remote:
            return self.leaders.get(tp)  # None: the bootstrap router
        return self.endpoints.get((topic, partition))

    def group_of(self, topic: str, partition: int, via: str | None) -> str | None:
        """The worker a request for this partition reaches over ``via`` (what a many-partition
        request groups by): ``via`` itself when it is a worker, else the owner the router path
        leads to, as DESCRIBE named it (None: not known)."""
        if via is not None and via != self.leaders.get((topic, partition)):
            return via
        return self.endpoints.get((topic, partition))

    def answered(self, topic: str, partition: int, via: str, code: int) -> None:
        tp = (topic, partition)
        if code == P.ErrorCode.OK and via == self.router_endpoint:
            if tp not in self.confirmed:
                self.confirmed.add(tp)
                self.epoch += 1
        elif code == P.ErrorCode.NOT_OWNER:
            self.demote(topic, partition)
        elif code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER:  # the leader moved or is gone: ask again now
            self.epoch += 1
            self.cluster = True
            self.confirmed.discard(tp)
            self.leaders.pop(tp, None)
            self.refresh_at[topic] = min(self.refresh_at.get(topic, float("inf")), time.monotonic() + REFRESH_S / 10)

    def demote(self, topic: str, partition: int) -> None:
        """A request to the partition's owner was lost with its connection or never answered: go
        through the router, and describe the topic again. In a cluster the leader's broker may be
        the one gone: its endpoint is forgotten too, so requests go to the bootstrap broker, which
        answers NOT_LEADER_OR_FOLLOWER (describe again in REFRESH_S / 10) until the controller
        has elected a new leader, and then names it, instead of queueing for a dead endpoint."""
        self.epoch += 1
        self.confirmed.discard((topic, partition))
        if self.leaders.pop((topic, partition), None) is not None:
            self.refresh_at[topic] = min(self.refresh_at.get(topic, float("inf")), time.monotonic() + REFRESH_S / 10)
        else:
            self.refresh_at.setdefault(topic, time.monotonic() + REFRESH_S)


class BlockingRoutes(Routes):
    """``Routes`` that make their DESCRIBE requests inline, on the pool's router connection."""

    def __init__(self, pool, direct: bool = True, same_host: bool = False):
        super().__init__(pool.router.endpoint, direct, same_host)
        self.pool = pool

    def describe(self, topic: str) -> int:
        r = self.pool.router.request(P.Op.DESCRIBE_TOPIC, topic)
        return self.learn(topic, P.decoder(P.DescribeReply).decode(r.header))

    def partitions(self, topic: str) -> int:
        n = self.partitions_of.get(topic)
        if n is None:
            return self.describe(topic)
        if self.stale(topic):
            try:
                return self.describe(topic)
            except Exception:  # noqa: BLE001 - the count known goes on serving
                self.failed(topic)
                self.learned_at[topic] = time.monotonic()
        return n

    def endpoint(self, topic: str, partition: int) -> str | None:
        """Where to send a request for this partition now (None: through the router)."""
        if self.due(topic):
            try:
                self.describe(topic)
            except Exception:
                self.failed(topic)
        return self.route(topic, partition)
