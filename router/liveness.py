"""The router's view of its workers: heartbeats, dead workers, retiring and new ones, rebalancing.

Every HEARTBEAT_S the router PINGs each worker over its DEALER; the answer (``PingReply``) says
the worker lives and carries the load it saw (router/load.py). A worker silent for
``worker_timeout_ms`` is declared dead, and its partitions move only after ``reassign_grace_ms``
unless it answers again (Talos' delayed reassignment: a restart does not move anything).
``tailrace workers set`` adds workers (partitions spread onto them once they answer) or retires
them (their partitions move off, idle ones first). Every move is a new owner epoch and an ADOPT
sent to the new owner, which fences the old one before it appends.

The router holds one ``WorkerLiveness`` (router/server.py). It moves partitions through the
placement (router/placement.py), talks to workers through their links (router/links.py) and
feeds the traffic totals (router/traffic.py); it owns the worker count and the state below.
"""

from __future__ import annotations

import logging
import time

from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import store_worker_count
from tailrace.client import protocol as P

from .links import WorkerLinks
from .load import LoadModel
from .placement import Placement
from .scheduler import Rebalancer
from .traffic import Traffic

log = logging.getLogger("tailrace.router")

HEARTBEAT_S = 0.5
MAX_WORKERS = 256
RETIRE_FORCE_S = 5.0  # a retiring worker's partitions with requests in flight move anyway after this

_ping_dec = P.decoder(P.PingReply)


class WorkerLiveness:
    def __init__(self, s: settings_mod.Settings, count: int, placement: Placement, links: WorkerLinks, traffic: Traffic):
        self.s = s
        self.count = count  # workers 0..count-1 take partitions
        self.placement, self.links, self.traffic = placement, links, traffic
        self.scheduler, self.catalog = placement.scheduler, placement.catalog
        now = time.monotonic()
        self.last_pong: dict[int, float] = {w: now for w in range(self.count)}  # worker -> last heartbeat
        self.retiring: dict[int, float] = {}  # worker -> when it was told to retire (workers >= count)
        self.spread_pending = False  # new workers joined: even out partitions once they answer
        self.down_since: dict[int, float] = {}  # worker -> when it stopped answering
        self.seen: set[int] = set()  # workers that answered at least one heartbeat
        self.rebalancer = Rebalancer(interval_s=s.rebalance_interval_ms / 1000, cooldown_s=s.rebalance_cooldown_ms / 1000,
                                     persist_s=s.rebalance_persist_ms / 1000)
        self.load = LoadModel()  # per-slot load from the heartbeats (router/load.py)
        self.moves: list[tuple[int, int, int]] = []  # (slot, from, to), for status and tests

    def on_ping_reply(self, body: bytes) -> P.PingReply:
        info = _ping_dec.decode(body)
        self.on_heartbeat(info)
        return info

    def tick(self) -> None:
        """Once per HEARTBEAT_S: ping, declare the silent dead, drain, spread, rebalance."""
        self.ping_workers()
        self.traffic.sample()
        self.check_workers()
        self.drain_retiring()
        self.maybe_spread()
        self.maybe_rebalance()

    def answering(self, w: int, now: float) -> bool:
        return w in self.seen and w not in self.down_since and now - self.last_pong.get(w, 0.0) < self.s.worker_timeout_ms / 1000

    # --- growing and shrinking the worker set ------------------------------------------------
    def set_workers(self, n: int) -> None:
        """Place partitions on workers 0..n-1 from now on (``tailrace workers set``).

        Growing: new workers get a DEALER now and partitions once they answer a heartbeat (then
        ``spread`` evens partition counts out, moving only idle partitions). Shrinking: workers
        n.. take no new partitions and are drained by ``drain_retiring``; the command stops
        their processes once the status shows them empty. Every move is a new owner epoch plus
        ADOPT, as for rebalancing: the old owner is fenced before the new one appends."""
        now = time.monotonic()
        for w in range(n):
            if w in self.retiring:  # retiring, wanted again
                del self.retiring[w]
                if w in self.seen and w not in self.down_since:
                    self.scheduler.mark_alive(w)
            elif w >= self.count:
                self.links.connect(w)
                self.scheduler.add_worker(w)
                self.last_pong[w] = now
                self.seen.discard(w)
                self.down_since.pop(w, None)
        for w in range(n, self.count):
            self.retiring[w] = now
            self.scheduler.mark_dead(w)  # takes nothing new; its partitions move in drain_retiring
        if n > self.count:
            self.spread_pending = True
        log.info("worker count %d -> %d (retiring %s)", self.count, n, sorted(self.retiring))
        self.count = n
        store_worker_count(self.s.data_dir, n)
        self.drain_retiring()

    def drain_retiring(self) -> None:
        if not self.scheduler.alive:
            return  # nowhere to move to yet (every remaining worker silent): wait
        now = time.monotonic()
        for w, since in list(self.retiring.items()):
            force = now - since > RETIRE_FORCE_S
            for slot in self.scheduler.partitions_of(w):
                if slot in self.load.busy and not force:
                    continue
                to = self.scheduler.least_loaded()
                self.scheduler.move(slot, to)
                self._moved(slot, w, to)
            if not self.scheduler.partitions_of(w):
                del self.retiring[w]
                self.scheduler.forget(w)
                self.traffic.forget(w)
                self.links.disconnect(w)
                self.last_pong.pop(w, None)
                self.down_since.pop(w, None)
                self.seen.discard(w)
                log.info("worker %d retired: it owns no partitions", w)

    def maybe_spread(self) -> None:
        if not self.spread_pending:
            return
        now = time.monotonic()
        if not all(self.answering(w, now) for w in range(self.count)):
            return  # wait for every new worker's first heartbeat
        moves, balanced = self.scheduler.spread(self.load.busy)
        for slot, src, dst in moves:
            self._moved(slot, src, dst)
        self.spread_pending = not balanced

    # --- placement over time: heartbeats, dead workers, rebalancing -------------------------
    def on_heartbeat(self, info: P.PingReply) -> None:
        w, now = info.worker, time.monotonic()
        if w >= self.count and w not in self.retiring:
            return  # a worker outside the set (retired, or left over): it gets nothing
        dt = now - self.last_pong.get(w, now - 1.0)
        self.last_pong[w] = now
        self.traffic.on_heartbeat(w, info.boot_ns, info.totals, info.unflushed)
        self.seen.add(w)
        if self.down_since.pop(w, None) is not None:
            log.info("worker %d answers again", w)
        if w not in self.retiring:
            self.scheduler.mark_alive(w)
        traffic = self.load.beat_owned(self.scheduler.owner, w, dt, info.bytes, info.busy, info.held)
        self.scheduler.set_traffic(w, traffic)

    def check_workers(self) -> None:
        """Declare silent workers dead; move their partitions after the grace (Talos' delay)."""
        now = time.monotonic()
        for w in range(self.count):
            silent = now - self.last_pong.get(w, now)
            if silent > self.s.worker_timeout_ms / 1000 and w not in self.down_since:
                self.down_since[w] = now
                log.warning("worker %d silent for %.1f s: declared dead, reassigning in %.1f s unless it returns",
                            w, silent, self.s.reassign_grace_ms / 1000)
            since = self.down_since.get(w)
            if since is not None and now - since > self.s.reassign_grace_ms / 1000 and w in self.scheduler.alive \
                    and len(self.scheduler.alive) > 1:
                self.scheduler.mark_dead(w)
                for slot, to in self.scheduler.evacuate(w):
                    self._moved(slot, w, to)

    def maybe_rebalance(self) -> None:
        if not self.s.rebalance:
            return
        load = self.load.loads()  # partitions with none are absent: zero
        plan = self.rebalancer.plan(self.scheduler, load, self.load.busy, time.monotonic())
        if plan is not None:
            slot, src, dst = plan
            self.scheduler.move(slot, dst)
            self.rebalancer.moved(slot, time.monotonic())
            self._moved(slot, src, dst)

    def _moved(self, slot: int, src: int, dst: int) -> None:
        """Route ``slot`` to ``dst`` under a new epoch and have it adopt (which fences ``src``)."""
        found = self.catalog.topic_of_slot(slot)
        if found is None:
            return
        topic, p = found
        tb = topic.name.encode()
        assign = self.placement.move(tb, p, slot, dst)
        self.moves.append((slot, src, dst))
        log.info("partition %s/%d (slot %d) moved from worker %d to worker %d", topic.name, p, slot, src, dst)
        self.links.send(dst, [b"", assign, P.pack_routing(P.Op.ADOPT, p, 0, tb), P.EMPTY_MAP])
        self.placement.told[(tb, p)] = assign

    def ping_workers(self) -> None:
        self.links.send_all([b"", b"\0" * P.ASSIGN.size, P.pack_routing(P.Op.PING, -1, 0, b""), P.EMPTY_MAP])


