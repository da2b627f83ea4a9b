"""PING (internal, router -> worker): the worker's heartbeat and its load for the router's
scheduler (router/load.py): bytes appended per slot since the last PING, the requests held
(parked fetches, durable waiters), totals since start, and records not yet flushed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tailrace.client import protocol as P
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable

from .adopt import Owned
from .context import Traffic

_NEXT, _DURABLE = COL["next_offset"], COL["durable_offset"]


@dataclass(slots=True)
class PingContext:
    worker_id: int
    boot_ns: int
    owned: Owned  # read: the actors and what they hold
    table: ControlTable  # read: the actors' rows
    traffic: Traffic  # appended_bytes is reset by each PING


def ping(ctx: PingContext, ident, assign, topic, partition, rest, who, reply) -> None:
    actors, traffic = ctx.owned.actors, ctx.traffic
    held = {slot: len(a.parked) + len(a.durable_waiters) + len(a.hw_waiters) for slot, a in actors.items()
            if a.parked or a.durable_waiters or a.hw_waiters}
    rows = ctx.table.rows
    slots = list(actors)
    unflushed = int((rows[slots, _NEXT] - rows[slots, _DURABLE]).sum()) if slots else 0
    now = time.monotonic_ns()
    isr = {}  # the replicated partitions led here whose ISR should change (actors/replication.py)
    for slot, a in actors.items():
        if a.repl is not None:
            want = a.repl.wanted_isr(now)
            if want is not None:
                isr[slot] = want
    reply(P.ErrorCode.OK, P.PingReply(ctx.worker_id, os.getpid(), ctx.boot_ns, len(actors),
                                      traffic.appended_bytes, list(held), held, traffic.totals, unflushed, isr))
    traffic.appended_bytes = {}
