"""Load generators for Redis Streams (same names and specs as gen_tailrace.py).

A partition is one stream key, ``<topic>:<partition>``; a record is one stream entry with a
single field ``v``. Batched produce is a redis-py pipeline (transaction=False) of XADD, one
pipeline per batch; single-message producers are redis.asyncio clients, one connection each,
awaiting each XADD; consumers page with XRANGE from an exclusive start id. The e2e producer and
consumer are redis-py's blocking clients, or with ``--client async`` (``spec["client"]``)
redis.asyncio ones, as tailrace's own e2e generators are then (gen_aio.py).

What an acknowledgement means depends on the server's ``appendfsync`` (peers.py): with
``always`` Redis writes and fsyncs the AOF before it sends the replies of an event-loop turn,
so an XADD reply is durable; with ``everysec`` it is in memory, fsynced within about a second.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import numpy as np
import redis
import redis.asyncio as aredis

from .payload import STAMP, stamp_of, value_list

FIELD = b"v"


def _key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def _client(endpoint: str) -> redis.Redis:
    host, port = endpoint.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port))


def produce(spec: dict, ctx) -> dict:
    r = _client(spec["endpoint"])
    keys = [_key(spec["topic"], p) for p in spec["partitions"]]
    size, batch, total = spec["size"], spec["batch"], spec["messages"]
    values = value_list(size, batch, seed=ctx.index)
    r.ping()
    by_partition: Counter = Counter()
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    sent = acked = errors = i = 0
    while sent < total and time.monotonic() < deadline:
        n = min(batch, total - sent)
        p = spec["partitions"][i % len(keys)]
        pipe = r.pipeline(transaction=False)
        for v in values[:n]:
            pipe.xadd(keys[i % len(keys)], {FIELD: v})
        replies = pipe.execute(raise_on_error=False)
        ok = sum(1 for x in replies if not isinstance(x, Exception))
        acked += ok
        errors += n - ok
        by_partition[p] += ok
        sent += n
        i += 1
        ctx.add(ok)
    r.close()
    return {"sent": sent, "acked": acked, "errors": errors, "requests": i, "by_partition": dict(by_partition)}


def _run(spec: dict, coro):
    if spec.get("uvloop"):  # --uvloop: the same loop as the asyncio tailrace client's generator
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def single(spec: dict, ctx) -> dict:
    return _run(spec, _single(spec, ctx))


async def _single(spec: dict, ctx) -> dict:
    host, port = spec["endpoint"].rsplit(":", 1)
    k, quota = spec["producers"], spec["messages"]
    clients = [aredis.Redis(host=host, port=int(port), single_connection_client=True) for _ in range(k)]
    for c in clients:
        await c.ping()
    value = bytes(spec["size"])
    lat: list[int] = []
    counts = {"sent": 0, "errors": 0}
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]

    async def one(j: int) -> None:
        key = _key(spec["topic"], (spec["first_producer"] + j) % spec["partitions"])
        c = clients[j]
        while counts["sent"] < quota and time.monotonic() < deadline:
            counts["sent"] += 1
            t = time.perf_counter_ns()
            try:
                await c.xadd(key, {FIELD: value})
            except redis.RedisError:
                counts["errors"] += 1
                continue
            lat.append(time.perf_counter_ns() - t)
            ctx.add(1)

    await asyncio.gather(*(one(j) for j in range(k)))
    for c in clients:
        await c.aclose()
    return {"sent": counts["sent"], "acked": len(lat), "errors": counts["errors"],
            "latency_ns": np.asarray(lat, dtype=np.int64)}


def consume(spec: dict, ctx) -> dict:
    r = _client(spec["endpoint"])
    keys = [_key(spec["topic"], p) for p in spec["partitions"]]
    count = max(100, spec["fetch_bytes"] // 128)
    last = {k: "-" for k in keys}
    r.ping()
    got = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while got < spec["expected"] and time.monotonic() < deadline:
        progressed = 0
        for k in keys:
            entries = r.xrange(k, min=last[k], max="+", count=count)
            if entries:
                last[k] = "(" + entries[-1][0].decode()
                progressed += len(entries)
        got += progressed
        ctx.add(progressed)
        if not progressed:
            time.sleep(0.001)
    r.close()
    return {"consumed": got, "sources": {"memory": got}}


def e2e_produce(spec: dict, ctx) -> dict:
    if spec.get("client") == "async":
        return _run(spec, _e2e_produce_async(spec, ctx))
    r = _client(spec["endpoint"])
    keys = [_key(spec["topic"], p) for p in range(spec["partitions"])]
    rate, total = spec["rate"], spec["messages"]
    buf = bytearray(max(spec["size"], STAMP.size))
    r.ping()
    ctx.ready()
    t0 = time.monotonic()
    sent = errors = 0
    while sent < total and time.monotonic() - t0 < spec["max_seconds"]:
        wait = t0 + sent / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        STAMP.pack_into(buf, 0, time.monotonic_ns())
        try:
            r.xadd(keys[sent % len(keys)], {FIELD: bytes(buf)})
        except redis.RedisError:
            errors += 1
        sent += 1
        ctx.add(1)
    rate_achieved = sent / max(time.monotonic() - t0, 1e-9)
    r.close()
    return {"sent": sent, "acked": sent - errors, "errors": errors, "rate_achieved": rate_achieved}


def e2e_consume(spec: dict, ctx) -> dict:
    if spec.get("client") == "async":
        return _run(spec, _e2e_consume_async(spec, ctx))
    r = _client(spec["endpoint"])
    streams = {_key(spec["topic"], p): "0-0" for p in range(spec["partitions"])}
    r.ping()
    lat: list[int] = []
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while len(lat) < spec["expected"] and time.monotonic() < deadline:
        _take_xread(r.xread(streams, count=1000, block=spec["max_wait_ms"]), streams, lat)
    r.close()
    return {"consumed": len(lat), "latency_ns": np.asarray(lat, dtype=np.int64)}


def _take_xread(reply, streams: dict, lat: list) -> None:
    """An XREAD reply: each entry's latency (now - its stamp) into ``lat``, and each stream's
    last id into ``streams`` (where the next XREAD starts)."""
    now = time.monotonic_ns()
    for key, entries in reply or []:
        for _entry_id, fields in entries:
            lat.append(now - stamp_of(fields[FIELD]))
        streams[key.decode()] = entries[-1][0]


def _aclient(endpoint: str) -> aredis.Redis:
    host, port = endpoint.rsplit(":", 1)
    return aredis.Redis(host=host, port=int(port), single_connection_client=True)


async def _e2e_produce_async(spec: dict, ctx) -> dict:
    """``e2e_produce`` on redis.asyncio: the same pacing, each XADD awaited in turn."""
    r = _aclient(spec["endpoint"])
    keys = [_key(spec["topic"], p) for p in range(spec["partitions"])]
    rate, total = spec["rate"], spec["messages"]
    buf = bytearray(max(spec["size"], STAMP.size))
    await r.ping()
    ctx.ready()
    t0 = time.monotonic()
    sent = errors = 0
    while sent < total and time.monotonic() - t0 < spec["max_seconds"]:
        wait = t0 + sent / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        STAMP.pack_into(buf, 0, time.monotonic_ns())
        try:
            await r.xadd(keys[sent % len(keys)], {FIELD: bytes(buf)})
        except redis.RedisError:
            errors += 1
        sent += 1
        ctx.add(1)
    rate_achieved = sent / max(time.monotonic() - t0, 1e-9)
    await r.aclose()
    return {"sent": sent, "acked": sent - errors, "errors": errors, "rate_achieved": rate_achieved}


async def _e2e_consume_async(spec: dict, ctx) -> dict:
    """``e2e_consume`` on redis.asyncio: XREAD BLOCK over every stream key."""
    r = _aclient(spec["endpoint"])
    streams = {_key(spec["topic"], p): "0-0" for p in range(spec["partitions"])}
    await r.ping()
    lat: list[int] = []
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while len(lat) < spec["expected"] and time.monotonic() < deadline:
        _take_xread(await r.xread(streams, count=1000, block=spec["max_wait_ms"]), streams, lat)
    await r.aclose()
    return {"consumed": len(lat), "latency_ns": np.asarray(lat, dtype=np.int64)}


# --- work queue: workloads.work_queue ---------------------------------------------------------
#
# One stream key (the queue) and one consumer group made at offset 0 before the fill. Fill:
# pipelines of XADD, ``batch`` per pipeline. Each consumer: XREADGROUP ... COUNT batch BLOCK
# poll_ms STREAMS key >, and every entry acknowledged with XACK. ``xack="batch"`` (the default):
# the ids of one read are acknowledged by one XACK with all of them, pipelined with the next
# XREADGROUP (one round trip, as the ShareConsumer's acknowledgements ride on its next poll);
# ``xack="each"``: one XACK round trip per entry. An acknowledgement's time is when the entry was
# acknowledged in the client's own way: its id put on the next XACK, or its own XACK answered.


def queue_setup(spec: dict) -> None:
    r = _client(spec["endpoint"])
    try:
        r.xgroup_create(spec["queue"], spec["group"], id="0", mkstream=True)
    finally:
        r.close()


def queue_fill(spec: dict, ctx) -> dict:
    from .payload import id_values

    r = _client(spec["endpoint"])
    r.ping()
    ctx.ready()
    first, end, batch = spec["first_id"], spec["first_id"] + spec["messages"], spec["batch"]
    sent = acked = 0
    while first < end:
        n = min(batch, end - first)
        pipe = r.pipeline(transaction=False)
        for v in id_values(spec["size"], first, n):
            pipe.xadd(spec["queue"], {FIELD: v})
        ok = sum(1 for x in pipe.execute(raise_on_error=False) if not isinstance(x, Exception))
        acked += ok
        sent += n
        first += n
        ctx.add(ok)
    r.close()
    return {"sent": sent, "acked": acked, "errors": sent - acked}


def queue_work(spec: dict, ctx) -> dict:
    from .payload import ID, ack_summary

    unpack = ID.unpack_from
    r = _client(spec["endpoint"])
    key, group, me = spec["queue"], spec["group"], f"c{ctx.index}"
    each = spec.get("xack", "batch") == "each"
    r.ping()
    ids: list[int] = []
    stamps: list[int] = []
    now = time.monotonic_ns
    pending: list[bytes] = []  # xack="batch": ids acknowledged, sent with the next read
    polls = xacked = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while ctx.total() < spec["expected"] and time.monotonic() < deadline:
        pipe = r.pipeline(transaction=False)
        if pending:
            pipe.xack(key, group, *pending)
        pipe.xreadgroup(group, me, {key: ">"}, count=spec["batch"], block=spec["poll_ms"])
        replies = pipe.execute()
        if pending:
            xacked += replies[0]
            pending = []
        polls += 1
        got = 0
        for _key, entries in replies[-1] or []:
            for entry_id, fields in entries:
                ids.append(unpack(fields[FIELD])[0])
                if each:
                    xacked += r.xack(key, group, entry_id)
                else:
                    pending.append(entry_id)
                stamps.append(now())
            got += len(entries)
        if got:
            ctx.add(got)
    if pending:
        xacked += r.xack(key, group, *pending)
    left = r.xpending(key, group)["pending"]  # entries delivered and not acknowledged, every consumer's
    r.close()
    return ack_summary(ids, stamps, polls=polls, xacked=xacked, xack=spec.get("xack", "batch"), pending_after=left)
