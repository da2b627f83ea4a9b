"""Broker admin at the router: STATUS, SET_WORKERS, and the router's part of the metrics.

Handlers are ``handler(ctx, req)`` over a ``StatusContext``: the settings, the catalog, the
placement, the worker liveness view (router/liveness.py, which SET_WORKERS changes), the traffic
totals, and two counters the router's loop keeps (read through callables: they change between
requests). Nothing here touches a socket.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.broker.datadir import journal_usage
from tailrace.broker.stats import flusher_disk
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.shm import region
from tailrace.shm.layout import ring_region_bytes

from .liveness import MAX_WORKERS, WorkerLiveness
from .placement import Placement
from .request import Request
from .traffic import Traffic

_set_workers_dec = ops.DECODERS[P.Op.SET_WORKERS]


@dataclass
class StatusContext:
    s: settings_mod.Settings
    catalog: Catalog
    placement: Placement
    liveness: WorkerLiveness
    traffic: Traffic
    started: float  # time.time() at the router's start
    forwarded: Callable[[], int]  # produce and fetch requests forwarded to workers so far
    clients: Callable[[], int]  # client connections to the front socket now
    cluster: object | None = None  # --cluster: the ClusterAgent (router/cluster_agent.py)
    replicas: object | None = None  # --cluster: the ReplicaFetcher (router/replicas.py)


def status(ctx: StatusContext, req: Request) -> None:
    req.reply(P.ErrorCode.OK, status_reply(ctx))


def set_workers(ctx: StatusContext, req: Request) -> None:
    n = _set_workers_dec.decode(req.header).workers
    if not 1 <= n <= MAX_WORKERS:
        return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"workers={n} must be 1..{MAX_WORKERS}"))
    ctx.liveness.set_workers(n)
    req.reply(P.ErrorCode.OK, status_reply(ctx))


def _workers(live: WorkerLiveness) -> list[int]:
    return sorted(set(range(live.count)) | set(live.retiring))


def status_reply(ctx: StatusContext) -> P.StatusReply:
    now, s, live, catalog = time.monotonic(), ctx.s, ctx.liveness, ctx.catalog
    scheduler = ctx.placement.scheduler
    return P.StatusReply(
        pid=os.getpid(),
        uptime_s=round(time.time() - ctx.started, 3),
        bind=s.bind,
        data_dir=os.path.realpath(s.data_dir),
        generation=ctx.placement.generation,
        forwarded=ctx.forwarded(),
        moves=[list(m) for m in live.moves],
        topics=len(catalog.data.topics),
        partitions=sum(t.partitions for t in catalog.data.topics.values()),
        worker_count=live.count,
        spread_pending=live.spread_pending,
        workers=[P.WorkerStatus(w, s.worker_endpoint(w), len(scheduler.partitions_of(w)), live.answering(w, now),
                                w in live.retiring)
                 for w in _workers(live)],
        **dict(zip(P.TOTALS, ctx.traffic.totals())),
        rates=ctx.traffic.rates(),
        unflushed_records=ctx.traffic.unflushed(),
        journal_bytes=journal_usage(s.data_dir)[1],
        shm_used_bytes=catalog.shm_bytes(ring_region_bytes),
        shm_resident_bytes=region.resident_bytes(s.instance),
        shm_budget_bytes=s.shm_budget_bytes,
        disk_max_used_ratio=s.disk_max_used_ratio,
        **flusher_disk(s.ipc_path()),  # storage full, as the flusher's disk guard last said
        cluster=ctx.cluster.status() if ctx.cluster is not None else None,
    )


def stats_parts(ctx: StatusContext) -> tuple[dict, dict, dict]:
    """The router's view of the workers and the partitions, for the metrics exporter."""
    now, live, scheduler = time.monotonic(), ctx.liveness, ctx.placement.scheduler
    workers = _workers(live)
    gauges = {
        "worker_heartbeat_age_seconds": {str(w): round(now - live.last_pong[w], 3) for w in workers
                                         if w in live.seen and w in live.last_pong},  # never answered: no age
        "worker_partitions": {str(w): len(scheduler.partitions_of(w)) for w in workers},
        "worker_load": {str(w): round(scheduler.total(w), 3) for w in workers if w in scheduler.load},
        "worker_up": {str(w): int(live.answering(w, now)) for w in workers},
        "partition_owner_worker": {str(slot): w for slot, w in scheduler.owner.items()},
        "clients_connected": {"": ctx.clients()},
    }
    counters = {"worker_restarts": {str(w): n for w, n in ctx.traffic.restarts.items()}}
    if ctx.replicas is not None:  # a cluster: router/replicas.py
        g, c = ctx.replicas.stats(ctx.catalog)
        gauges.update(g)
        counters.update(c)
    return counters, gauges, {}


# op -> handler(ctx, req): the broker admin rows of client/ops.py SPEC served by the router
HANDLERS = {P.Op.STATUS: status, P.Op.SET_WORKERS: set_workers}
