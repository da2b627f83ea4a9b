"""Load generators for NATS JetStream (same names and specs as gen_tailrace.py).

A topic is one stream (file storage) capturing ``<topic>.*``; a partition is the subject
``<topic>.<partition>``. Batched produce uses nats-py's ``publish_async`` (acks collected per
window of ``batch`` messages, like a batch in flight); single-message producers await
``js.publish`` (one PubAck round trip each), each on its own connection; consumers use pull
consumers (AckPolicy none, one per partition, ``fetch`` of up to ``fetch_count`` messages);
the e2e consumer is an ordered push consumer over the whole stream.

What a PubAck means on the Debian 2.9 server: the message is stored by the filestore (written
to the OS), not fsynced; the server syncs its files periodically (2 minutes by default) and
2.9 has no option to sync before acking (``sync_interval: always`` came in 2.10).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import nats
import numpy as np
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from .payload import STAMP, stamp_of, value_list


def subject(topic: str, partition: int) -> str:
    return f"{topic}.{partition}"


def produce(spec: dict, ctx) -> dict:
    return asyncio.run(_produce(spec, ctx))


async def _produce(spec: dict, ctx) -> dict:
    nc = await nats.connect(spec["endpoint"], pending_size=64 << 20)
    window = spec["batch"]
    js = nc.jetstream(publish_async_max_pending=max(window, 1) * 2)
    subjects = [subject(spec["topic"], p) for p in spec["partitions"]]
    size, total = spec["size"], spec["messages"]
    values = value_list(size, window, seed=ctx.index)
    by_partition: Counter = Counter()
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    sent = acked = errors = i = 0
    while sent < total and time.monotonic() < deadline:
        n = min(window, total - sent)
        subj = subjects[i % len(subjects)]
        futs = [await js.publish_async(subj, v) for v in values[:n]]
        results = await asyncio.gather(*futs, return_exceptions=True)
        ok = sum(1 for x in results if not isinstance(x, BaseException))
        acked += ok
        errors += n - ok
        by_partition[spec["partitions"][i % len(subjects)]] += ok
        sent += n
        i += 1
        ctx.add(ok)
    await nc.drain()
    return {"sent": sent, "acked": acked, "errors": errors, "requests": i, "by_partition": dict(by_partition)}


def single(spec: dict, ctx) -> dict:
    return asyncio.run(_single(spec, ctx))


async def _single(spec: dict, ctx) -> dict:
    k, quota = spec["producers"], spec["messages"]
    conns = [await nats.connect(spec["endpoint"]) for _ in range(k)]
    value = bytes(spec["size"])
    lat: list[int] = []
    counts = {"sent": 0, "errors": 0}
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]

    async def one(j: int) -> None:
        js = conns[j].jetstream()
        subj = subject(spec["topic"], (spec["first_producer"] + j) % spec["partitions"])
        while counts["sent"] < quota and time.monotonic() < deadline:
            counts["sent"] += 1
            t = time.perf_counter_ns()
            try:
                await js.publish(subj, value)
            except Exception:
                counts["errors"] += 1
                continue
            lat.append(time.perf_counter_ns() - t)
            ctx.add(1)

    await asyncio.gather(*(one(j) for j in range(k)))
    for c in conns:
        await c.close()
    return {"sent": counts["sent"], "acked": len(lat), "errors": counts["errors"],
            "latency_ns": np.asarray(lat, dtype=np.int64)}


def consume(spec: dict, ctx) -> dict:
    return asyncio.run(_consume(spec, ctx))


async def _consume(spec: dict, ctx) -> dict:
    nc = await nats.connect(spec["endpoint"], pending_size=64 << 20)
    js = nc.jetstream()
    fetch_count = max(100, min(10_000, spec["fetch_bytes"] // 128))
    subs = []
    for p in spec["partitions"]:
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                             max_waiting=16, inactive_threshold=300)
        subs.append(await js.pull_subscribe(subject(spec["topic"], p), stream=spec["topic"], config=cfg))
    got = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while got < spec["expected"] and time.monotonic() < deadline:
        for sub in subs:
            try:
                msgs = await sub.fetch(fetch_count, timeout=0.2)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                continue
            got += len(msgs)
            ctx.add(len(msgs))
    await nc.close()
    return {"consumed": got, "sources": {"filestore": got}}


def e2e_produce(spec: dict, ctx) -> dict:
    return asyncio.run(_e2e_produce(spec, ctx))


async def _e2e_produce(spec: dict, ctx) -> dict:
    nc = await nats.connect(spec["endpoint"])
    js = nc.jetstream(publish_async_max_pending=100_000)
    subjects = [subject(spec["topic"], p) for p in range(spec["partitions"])]
    rate, total = spec["rate"], spec["messages"]
    buf = bytearray(max(spec["size"], STAMP.size))
    futs = []
    ctx.ready()
    t0 = time.monotonic()
    sent = 0
    while sent < total and time.monotonic() - t0 < spec["max_seconds"]:
        wait = t0 + sent / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        STAMP.pack_into(buf, 0, time.monotonic_ns())
        futs.append(await js.publish_async(subjects[sent % len(subjects)], bytes(buf)))
        sent += 1
        ctx.add(1)
    rate_achieved = sent / max(time.monotonic() - t0, 1e-9)
    results = await asyncio.gather(*futs, return_exceptions=True)
    errors = sum(1 for x in results if isinstance(x, BaseException))
    await nc.drain()
    return {"sent": sent, "acked": sent - errors, "errors": errors, "rate_achieved": rate_achieved}


def e2e_consume(spec: dict, ctx) -> dict:
    return asyncio.run(_e2e_consume(spec, ctx))


async def _e2e_consume(spec: dict, ctx) -> dict:
    nc = await nats.connect(spec["endpoint"])
    js = nc.jetstream()
    lat: list[int] = []
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        lat.append(time.monotonic_ns() - stamp_of(msg.data))
        if len(lat) >= spec["expected"]:
            done.set()

    await js.subscribe(f"{spec['topic']}.*", cb=on_msg, ordered_consumer=True, stream=spec["topic"])
    ctx.ready()
    try:
        await asyncio.wait_for(done.wait(), timeout=spec["max_seconds"])
    except asyncio.TimeoutError:
        pass
    await nc.close()
    return {"consumed": len(lat), "latency_ns": np.asarray(lat, dtype=np.int64)}


# --- work queue: workloads.work_queue ---------------------------------------------------------
#
# One stream (file storage) on ``<queue>.*``, the messages on ``<queue>.0``, and one durable pull
# consumer (AckExplicit, every message from the start, max_ack_pending above what the consumers
# can hold together) made before the fill. Fill: publish_async windows of ``batch``. Each
# consumer process binds to the durable consumer and fetches ``batch`` at a time, msg.ack() per
# message (a publish to the message's reply subject, no reply awaited: nats-py's ack, not
# ack_sync); the last ones are flushed (PING/PONG) before it ends.


def queue_setup(spec: dict) -> None:
    asyncio.run(_queue_setup(spec))


async def _queue_setup(spec: dict) -> None:
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(spec["endpoint"])
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=spec["queue"], subjects=[f"{spec['queue']}.*"], storage=StorageType.FILE))
        await js.add_consumer(spec["queue"], ConsumerConfig(
            durable_name=spec["group"], ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=max(1000, 4 * spec["batch"] * spec["consumers"]), max_waiting=512))
    finally:
        await nc.close()


def queue_fill(spec: dict, ctx) -> dict:
    return asyncio.run(_queue_fill(spec, ctx))


async def _queue_fill(spec: dict, ctx) -> dict:
    from .payload import id_values

    nc = await nats.connect(spec["endpoint"], pending_size=64 << 20)
    window = spec["batch"]
    js = nc.jetstream(publish_async_max_pending=max(window, 1) * 2)
    subj = subject(spec["queue"], 0)
    ctx.ready()
    first, end = spec["first_id"], spec["first_id"] + spec["messages"]
    sent = acked = 0
    while first < end:
        n = min(window, end - first)
        futs = [await js.publish_async(subj, v) for v in id_values(spec["size"], first, n)]
        ok = sum(1 for x in await asyncio.gather(*futs, return_exceptions=True) if not isinstance(x, BaseException))
        acked += ok
        sent += n
        first += n
        ctx.add(ok)
    await nc.drain()
    return {"sent": sent, "acked": acked, "errors": sent - acked}


def queue_work(spec: dict, ctx) -> dict:
    return asyncio.run(_queue_work(spec, ctx))


async def _queue_work(spec: dict, ctx) -> dict:
    from .payload import ID, ack_summary

    unpack = ID.unpack_from
    nc = await nats.connect(spec["endpoint"], pending_size=64 << 20)
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(durable=spec["group"], stream=spec["queue"])
    ids: list[int] = []
    stamps: list[int] = []
    now = time.monotonic_ns
    polls = 0
    wait_s = spec["poll_ms"] / 1000
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while ctx.total() < spec["expected"] and time.monotonic() < deadline:
        polls += 1
        try:
            msgs = await sub.fetch(spec["batch"], timeout=wait_s)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            continue
        for m in msgs:
            ids.append(unpack(m.data)[0])
            await m.ack()
            stamps.append(now())
        ctx.add(len(msgs))
    await nc.flush()
    info = await js.consumer_info(spec["queue"], spec["group"])
    await nc.close()
    return ack_summary(ids, stamps, polls=polls, pending_after=info.num_ack_pending)
