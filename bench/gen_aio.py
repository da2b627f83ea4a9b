"""Load generators for tailrace through the asyncio client (tailrace.client.aio).

The same function names and return dicts as gen_tailrace.py (``single``, ``e2e_produce``,
``e2e_consume``; every other workload is gen_tailrace's own), so ``--client async`` only swaps
the module (systems.py ``TailraceSystem(client="async")``). Each process runs one event loop
with one AsyncProducer shared by all of its coroutines, as an asyncio service would: the shape
of gen_redis.py's redis.asyncio generator, which keeps one connection per coroutine because
redis-py cannot share one between concurrent commands. The loop is asyncio's own unless
``--uvloop`` (``spec["uvloop"]``), which gen_redis.py follows too, so both asyncio generators
always run on the same kind of loop.

With ``same_host`` the producer sends over the workers' Unix sockets and the e2e consumer reads
the rings, woken by its doorbell (WATCH, client/aio.py) where the blocking one sleeps on the futex.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque

import numpy as np

from tailrace.client.aio import AsyncConsumer, AsyncProducer
from tailrace.client.errors import TailraceError

from .gen_tailrace import *  # noqa: F401,F403 - every workload this module does not redefine
from .gen_tailrace import FLUSH_TIMEOUT_MS
from .payload import STAMP, value_stamps


SETTLE_EVERY = 256  # sends between two sweeps of the e2e producer's settled futures


def _run(spec: dict, coro):
    """``asyncio.run``, or ``uvloop.run`` when the spec asks for it (``--uvloop``). A missing
    uvloop then fails the run, as in gen_redis.py, rather than quietly measuring another loop."""
    if spec.get("uvloop"):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def single(spec: dict, ctx) -> dict:
    """``producers`` coroutines sharing one AsyncProducer, each: send one message, await its
    ack, repeat (acks per spec, linger 0: what waits while a partition's batch is in flight
    goes in its next batch)."""
    return _run(spec, _single(spec, ctx))


async def _single(spec: dict, ctx) -> dict:
    topic, partitions, k, quota = spec["topic"], spec["partitions"], spec["producers"], spec["messages"]
    value = bytes(spec["size"])
    lat = np.zeros(quota, dtype=np.int64)
    counts = Counter()
    placed = spec.get("partitioner", "pinned")  # pinned: coroutine j to its own partition; else unkeyed sends
    async with AsyncProducer(spec["endpoint"], acks=spec["acks"], linger_ms=0, direct=spec.get("direct", True),
                             same_host=spec.get("same_host", False), request_timeout_ms=5000,
                             partitioner="round_robin" if placed == "pinned" else placed) as p:
        await p.partitions_for(topic)
        ctx.ready()
        deadline = ctx.t_start + spec["max_seconds"]

        async def one(j: int) -> None:
            part = (spec["first_producer"] + j) % partitions if placed == "pinned" else None
            while counts["sent"] < quota and time.monotonic() < deadline:
                counts["sent"] += 1
                t = time.perf_counter_ns()
                try:
                    await p.send(topic, value, partition=part)
                except TailraceError:
                    counts["errors"] += 1
                    continue
                lat[counts["acked"]] = time.perf_counter_ns() - t
                counts["acked"] += 1
                ctx.add(1)

        await asyncio.gather(*(one(j) for j in range(k)))
    return {"sent": counts["sent"], "acked": counts["acked"], "errors": counts["errors"], "redirected": p.retries,
            "latency_ns": lat[: counts["acked"]]}


def e2e_produce(spec: dict, ctx) -> dict:
    """One message at a time at a fixed rate, round robin over the partitions, each stamped
    with CLOCK_MONOTONIC at send; acks are not awaited one by one (the futures are kept)."""
    return _run(spec, _e2e_produce(spec, ctx))


async def _e2e_produce(spec: dict, ctx) -> dict:
    topic, partitions, rate, total = spec["topic"], spec["partitions"], spec["rate"], spec["messages"]
    buf = bytearray(max(spec["size"], STAMP.size))
    counts = Counter()
    # Futures in send order, settled ones counted and dropped from the front every SETTLE_EVERY
    # sends (acks come back nearly in order): an app does not keep 50k settled futures either,
    # and a growing list of them made the collector's full passes ever longer. No callback per
    # future: each would cost the loop one more turn per message.
    pending: deque = deque()

    def settle(f: asyncio.Future) -> None:
        counts["errors" if f.cancelled() or f.exception() is not None else "acked"] += 1

    async with AsyncProducer(spec["endpoint"], acks=spec["acks"], linger_ms=0, direct=spec.get("direct", True),
                             same_host=spec.get("same_host", False)) as p:
        await p.partitions_for(topic)
        ctx.ready()
        sent = 0
        t0 = time.monotonic()
        while sent < total and time.monotonic() - t0 < spec["max_seconds"]:
            wait = t0 + sent / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            STAMP.pack_into(buf, 0, time.monotonic_ns())
            pending.append(p.send(topic, bytes(buf), partition=sent % partitions))
            sent += 1
            ctx.add(1)
            if sent % SETTLE_EVERY == 0:
                while pending and pending[0].done():
                    settle(pending.popleft())
        rate_achieved = sent / max(time.monotonic() - t0, 1e-9)
        if pending:
            # acks still owed are waited for (as gen_tailrace's e2e_produce does), at most the flush
            # timeout; one that never came counts as an error instead of losing the run's figures
            _done, late = await asyncio.wait(pending, timeout=FLUSH_TIMEOUT_MS / 1000)
            for f in late:
                f.cancel()
            for f in pending:
                settle(f)
    return {**counts, "sent": sent, "acked": counts["acked"], "errors": counts["errors"], "redirected": p.retries,
            "rate_achieved": rate_achieved}


def e2e_consume(spec: dict, ctx) -> dict:
    """Tail every partition with long polls through AsyncConsumer.poll_columns; latency =
    receive time - the value's stamp."""
    return _run(spec, _e2e_consume(spec, ctx))


async def _e2e_consume(spec: dict, ctx) -> dict:
    expected = spec["expected"]
    lat = []
    got = 0
    async with AsyncConsumer(spec["endpoint"], max_wait_ms=spec["max_wait_ms"], direct=spec.get("direct", True),
                             same_host=spec.get("same_host", False)) as cons:
        await cons.assign(spec["topic"], None, start="latest")
        ctx.ready()
        deadline = ctx.t_start + spec["max_seconds"]
        while got < expected and time.monotonic() < deadline:
            for _t, _p, cols in await cons.poll_columns(200):
                now = time.monotonic_ns()
                lat.append(now - value_stamps(cols.values, cols.value_offsets))
                got += len(cols)
    lat_ns = np.concatenate(lat) if lat else np.zeros(0, np.int64)
    return {"consumed": got, "latency_ns": lat_ns}
