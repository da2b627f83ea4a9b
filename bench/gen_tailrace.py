"""Load generators for tailrace (each runs in its own spawned process; see loadgen.py).

Every function takes ``(spec, ctx)``, builds its client inside the process, calls
``ctx.ready()`` once prepared, and returns a dict of counts. The specs are plain dicts built by
workloads.py; the same function names exist for every peer (gen_redis.py, gen_nats.py), so a
workload is written once.

Clients used: batched produce goes through ``Producer.send_buffers`` (one pre-joined buffer per
batch, no Python per message); consumers through ``Consumer.poll_raw`` decoded to columns
exactly as ``poll_columns`` does; the durable single-message producers send one pre-encoded
one-record batch each over their own ``Connection`` (the client's transport), so that client
CPU is spent on the round trip, not on re-encoding an identical record.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import zmq

from tailrace.client import protocol as P
from tailrace.client.connection import Connection, Pool
from tailrace.client.consumer import Consumer
from tailrace.client.errors import TailraceError
from tailrace.client.producer import Producer
from tailrace.client.records import (CRC, CRC_AT, VERSION_AT, HEADER_BYTES, HEADER_DTYPE, batch_crc, LENGTH, LENGTH_AT, OFFSETS_DTYPE,
                                     batches_to_columns, encode_batch, iter_batches)

from .payload import STAMP, batch_buffers, value_stamps

FLUSH_TIMEOUT_MS = 120_000
RETRY_S = 0.005  # pause before resending after NOT_READY (a partition between owners)
_CREATE_TIME_AT = HEADER_DTYPE.fields["create_time_us"][1]


def produce(spec: dict, ctx) -> dict:
    """Batched produce of ``messages`` records, round robin over ``partitions``."""
    topic, parts = spec["topic"], spec["partitions"]
    size, batch, total = spec["size"], spec["batch"], spec["messages"]
    by_partition = Counter()

    def on_ack(_topic, partition, _base, count):
        by_partition[partition] += count

    prod = Producer(spec["endpoint"], acks=spec["acks"], direct=spec.get("direct", True), max_in_flight_per_partition=spec["in_flight"],
                    request_timeout_ms=FLUSH_TIMEOUT_MS, on_ack=on_ack)
    values, offsets = batch_buffers(size, batch, seed=ctx.index)
    cap = min(spec["in_flight"] * len(parts), spec["max_outstanding"])
    prod.partitions_for(topic)
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    sent = reported = i = 0
    errors = 0
    try:
        while sent < total and time.monotonic() < deadline:
            n = min(batch, total - sent)
            while prod.in_flight >= cap:
                prod.poll(5)
            if n == batch:
                prod.send_buffers(topic, values, offsets, partition=parts[i % len(parts)])
            else:
                prod.send_buffers(topic, values[: n * size], offsets[: n + 1], partition=parts[i % len(parts)])
            i += 1
            sent += n
            if prod.acked_records != reported:
                ctx.add(prod.acked_records - reported)
                reported = prod.acked_records
        prod.flush(FLUSH_TIMEOUT_MS)
    except TailraceError:
        errors += 1
    errors += len(prod.errors)
    ctx.add(prod.acked_records - reported)
    prod.conn.close()
    return {"sent": sent, "acked": prod.acked_records, "errors": errors, "requests": i,
            "by_partition": dict(by_partition)}


def owner_endpoints(spec: dict, partitions) -> dict[int, str]:
    """Client-side addressing for raw-frame generators: have every owner adopt its partition
    (one fetch through the router each), then map partition -> its worker's endpoint. Empty
    when the spec says to go through the router."""
    if not spec.get("direct", True):
        return {}
    c = Connection(spec["endpoint"])
    try:
        for p in sorted(set(partitions)):
            c.request(P.Op.FETCH, spec["topic"], p, P.encode(P.FetchRequest(0, max_bytes=1)))
        r = c.request(P.Op.DESCRIBE_TOPIC, spec["topic"])
        local = spec.get("same_host", False)
        return {pi.partition: pi.local_endpoint if local and pi.local_endpoint else pi.endpoint
                for pi in P.decoder(P.DescribeReply).decode(r.header).partitions}
    finally:
        c.close()


def current_owner(spec: dict, partition: int) -> str:
    """The endpoint that owns ``partition`` now (after a NOT_OWNER: the partition moved), or the
    router's endpoint when going through the router."""
    if not spec.get("direct", True):
        return spec["endpoint"]
    return owner_endpoints(spec, [partition]).get(partition, spec["endpoint"])


def single(spec: dict, ctx) -> dict:
    """``producers`` independent producers, each one message then wait for its ack, repeat."""
    topic, partitions, k = spec["topic"], spec["partitions"], spec["producers"]
    quota = spec["messages"]
    header = P.encode(P.ProduceRequest(acks=P.ACKS_BY_NAME[spec["acks"]]))
    frame = encode_batch([bytes(spec["size"])])
    parts = [(spec["first_producer"] + j) % partitions for j in range(k)]
    eps = owner_endpoints(spec, parts)
    conns = [Connection(eps.get(parts[j], spec["endpoint"])) for j in range(k)]
    poller = zmq.Poller()
    by_sock = {}
    for j, c in enumerate(conns):
        poller.register(c.poll_key, zmq.POLLIN)
        by_sock[c.poll_key] = j
    sent_at = [0] * k
    lat_ns = np.zeros(quota, dtype=np.int64)
    done = sent = errors = redirected = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    for j in range(min(k, quota)):
        sent_at[j] = time.perf_counter_ns()
        conns[j].send(P.Op.PRODUCE, topic, parts[j], header, frame)
        sent += 1
    outstanding = min(k, quota)
    retry: list[tuple[float, int]] = []  # (when, producer) to resend after NOT_READY
    # Sends stop at the deadline; replies still owed are waited for, so sent == acked + errors.
    while outstanding and time.monotonic() < deadline + FLUSH_TIMEOUT_MS / 1000:
        now_s = time.monotonic()
        while retry and retry[0][0] <= now_s:
            j = retry.pop(0)[1]
            conns[j].send(P.Op.PRODUCE, topic, parts[j], header, frame)
        for sock, _ev in poller.poll(int(RETRY_S * 1000) if retry else 1000):
            j = by_sock[sock]
            r = conns[j].recv(0)
            if r is None:
                continue
            now = time.perf_counter_ns()
            if r.code == P.ErrorCode.NOT_OWNER:
                # The partition moved (a rebalance): nothing was stored, so send the same message
                # to the new owner; its latency keeps counting from the first send.
                poller.unregister(sock)
                del by_sock[sock]
                conns[j].close()
                conns[j] = Connection(current_owner(spec, parts[j]))
                poller.register(conns[j].poll_key, zmq.POLLIN)
                by_sock[conns[j].poll_key] = j
                conns[j].send(P.Op.PRODUCE, topic, parts[j], header, frame)
                redirected += 1
                continue
            if r.code == P.ErrorCode.NOT_READY:  # the old owner is letting go: same message, soon
                retry.append((time.monotonic() + RETRY_S, j))
                redirected += 1
                continue
            outstanding -= 1
            if r.code == P.ErrorCode.OK:
                lat_ns[done] = now - sent_at[j]
                done += 1
                ctx.add(1)
            else:
                errors += 1
            if sent < quota and time.monotonic() < deadline:
                sent_at[j] = time.perf_counter_ns()
                conns[j].send(P.Op.PRODUCE, topic, parts[j], header, frame)
                sent += 1
                outstanding += 1
    for c in conns:
        c.close()
    return {"sent": sent, "acked": done, "errors": errors, "redirected": redirected, "latency_ns": lat_ns[:done]}


def consume(spec: dict, ctx) -> dict:
    """Read ``expected`` records from the start of ``partitions``; count by source (ring/disk)."""
    topic, parts, expected = spec["topic"], spec["partitions"], spec["expected"]
    cons = Consumer(spec["endpoint"], max_bytes=spec["fetch_bytes"], max_wait_ms=200, direct=spec.get("direct", True))
    cons.assign(topic, parts, start="earliest")
    sources: Counter = Counter()
    got = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while got < expected and time.monotonic() < deadline:
        for _a, start, info, body in cons.poll_raw(500):
            buf = body.buffer if hasattr(body, "buffer") else body
            n = len(batches_to_columns(iter_batches(buf), start))
            got += n
            sources[info.source] += n
            ctx.add(n)
    cons.close()
    return {"consumed": got, "sources": dict(sources)}


class OneRecordFrame:
    """A one-record batch re-stamped in place for each send: the value's first 8 bytes get
    CLOCK_MONOTONIC ns, the header's create_time_us the wall clock, and the CRC is recomputed
    over its ~100 bytes, in its two ranges (about 1 us in all, against ~50 us for
    encode_batch_buffers)."""

    def __init__(self, size: int):
        self.buf = bytearray(encode_batch([bytes(max(size, STAMP.size))]))
        self.length = LENGTH.unpack_from(self.buf, LENGTH_AT)[0]
        self.value_at = HEADER_BYTES + 2 * OFFSETS_DTYPE.itemsize

    def stamp(self) -> bytes:
        buf = self.buf
        STAMP.pack_into(buf, self.value_at, time.monotonic_ns())
        STAMP.pack_into(buf, _CREATE_TIME_AT, time.time_ns() // 1000)
        CRC.pack_into(buf, CRC_AT, batch_crc(buf, 0, self.length, buf[VERSION_AT]))
        return bytes(buf)


def resend_due(pool: Pool, retry: list, pending: dict, eps: dict, topic: str, header: bytes) -> None:
    now = time.monotonic()
    while retry and retry[0][0] <= now:
        _t, p, body = retry.pop(0)
        pending[pool.send(eps.get(p), P.Op.PRODUCE, topic, p, header, body)] = (p, body)


def e2e_produce(spec: dict, ctx) -> dict:
    """One message at a time at a fixed rate, each stamped with CLOCK_MONOTONIC at send.

    Sent as raw one-record produce requests (acks per spec) over one Connection, replies drained
    between sends: the Producer class costs ~100-300 us per single-record send here (see
    docs/BENCHMARKS.md), which at 5,000 msg/s would make the client the bottleneck."""
    topic, partitions, rate, total = spec["topic"], spec["partitions"], spec["rate"], spec["messages"]
    pool = Pool(spec["endpoint"])
    eps = owner_endpoints(spec, range(partitions))
    header = P.encode(P.ProduceRequest(acks=P.ACKS_BY_NAME[spec["acks"]]))
    frame = OneRecordFrame(spec["size"])
    pending: dict[int, tuple[int, bytes]] = {}  # request id -> (partition, frame), for NOT_OWNER
    counts = Counter()

    retry: list[tuple[float, int, bytes]] = []  # (when, partition, frame) after NOT_READY

    def take(r) -> None:
        p, body = pending.pop(r.request_id, (None, None))
        if r.code == P.ErrorCode.NOT_OWNER and p is not None:
            # The partition moved (a rebalance): nothing was stored; resend to the new owner.
            eps[p] = current_owner(spec, p) if spec.get("direct", True) else None
            pending[pool.send(eps[p], P.Op.PRODUCE, topic, p, header, body)] = (p, body)
            counts["redirected"] += 1
        elif r.code == P.ErrorCode.NOT_READY and p is not None:
            retry.append((time.monotonic() + RETRY_S, p, body))  # the old owner is letting go
            counts["retried"] += 1
        else:
            counts["acked" if r.code == P.ErrorCode.OK else "errors"] += 1
            if r.code != P.ErrorCode.OK:
                counts[f"error_{P.ErrorCode(r.code).name}"] += 1

    ctx.ready()
    sent = 0
    t0 = time.monotonic()
    while sent < total and time.monotonic() - t0 < spec["max_seconds"]:
        wait = t0 + sent / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        p, body = sent % partitions, frame.stamp()
        pending[pool.send(eps.get(p), P.Op.PRODUCE, topic, p, header, body)] = (p, body)
        sent += 1
        ctx.add(1)
        while (r := pool.recv(0)) is not None:
            take(r)
        resend_due(pool, retry, pending, eps, topic, header)
    rate_achieved = sent / max(time.monotonic() - t0, 1e-9)
    deadline = time.monotonic() + FLUSH_TIMEOUT_MS / 1000
    while (pending or retry) and time.monotonic() < deadline:
        r = pool.recv(int(RETRY_S * 1000) if retry else 1000)
        if r is not None:
            take(r)
        resend_due(pool, retry, pending, eps, topic, header)
    pool.close()
    return {**counts, "sent": sent, "acked": counts["acked"], "errors": counts["errors"], "redirected": counts["redirected"],
            "rate_achieved": rate_achieved}


def e2e_consume(spec: dict, ctx) -> dict:
    """Tail every partition with long polls (``same_host``: straight from the rings); latency =
    receive time - the value's stamp."""
    cons = Consumer(spec["endpoint"], max_wait_ms=spec["max_wait_ms"], direct=spec.get("direct", True), same_host=spec.get("same_host", False))
    cons.assign(spec["topic"], None, start="latest")
    expected = spec["expected"]
    lat = []
    got = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    while got < expected and time.monotonic() < deadline:
        for _a, start, _info, body in cons.poll_raw(200):
            now = time.monotonic_ns()
            buf = body.buffer if hasattr(body, "buffer") else body
            cols = batches_to_columns(iter_batches(buf), start)  # what poll_columns does
            lat.append(now - value_stamps(cols.values, cols.value_offsets))
            got += len(cols)
    cons.close()
    lat_ns = np.concatenate(lat) if lat else np.zeros(0, np.int64)
    return {"consumed": got, "latency_ns": lat_ns}



def paced(spec: dict, ctx) -> dict:
    """One message at a time at ``rate`` per second, round robin over ``partitions``, each
    waited for (acks ``spec["acks"]``); per-message latency. Uses the Producer, so it follows
    partitions that move (NOT_OWNER -> metadata refresh -> the new owner)."""
    topic, parts, rate = spec["topic"], spec["partitions"], spec["rate"]
    prod = Producer(spec["endpoint"], acks=spec["acks"], direct=spec.get("direct", True), request_timeout_ms=5000)
    value = bytes(spec["size"])
    prod.partitions_for(topic)
    ctx.ready()
    deadline = ctx.t_start + spec["seconds"]
    lat_ns, at, sent_to = [], [], []
    errors = i = 0
    period = 1.0 / rate
    next_t = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        if now < next_t:
            time.sleep(next_t - now)
        next_t += period
        t0 = time.perf_counter_ns()
        try:
            prod.send(topic, value, partition=parts[i % len(parts)])
            prod.flush(10_000)
            lat_ns.append(time.perf_counter_ns() - t0)
            at.append(time.monotonic() - ctx.t_start)
            sent_to.append(parts[i % len(parts)])
            ctx.add(1)
        except TailraceError:
            errors += 1
        i += 1
    errors += len(prod.errors)
    prod.conn.close()
    return {"sent": i, "acked": len(lat_ns), "errors": errors, "latency_ns": np.asarray(lat_ns, dtype=np.int64),
            "at_s": np.asarray(at), "partition": np.asarray(sent_to, dtype=np.int64)}


# --- work queue (share groups): workloads.work_queue ------------------------------------------
#
# queue_setup (in the parent): the topic and the share group, reset to earliest (the default is
# latest: a group made after the fill would skip it). queue_fill: batched produce of ids
# first_id.. (acks=durable), batches round robin over the partitions. queue_work: one
# ShareConsumer member, acknowledge() per record (ACCEPT; sent in ranges with the next poll, the
# last ones by commit_sync), until every consumer together acknowledged ``expected``.


def queue_setup(spec: dict) -> None:
    from tailrace.client.admin import Admin
    from tailrace.client import share_protocol as S

    with Admin(spec["endpoint"], timeout_ms=60_000) as admin:
        admin.create_topic(spec["queue"], spec["partitions"], spec.get("ring_bytes", 0))
        # until Admin has a method for it: the op itself
        admin.conn.request(P.Op.ALTER_SHARE_GROUP, spec["group"], -1,
                           P.encode(S.AlterShareGroupRequest({"share.auto.offset.reset": "earliest"})))


def queue_fill(spec: dict, ctx) -> dict:
    from .payload import id_batch

    topic, parts, batch = spec["queue"], list(range(spec["partitions"])), spec["batch"]
    prod = Producer(spec["endpoint"], acks="durable", max_in_flight_per_partition=4, request_timeout_ms=FLUSH_TIMEOUT_MS)
    prod.partitions_for(topic)
    ctx.ready()
    first, end = spec["first_id"], spec["first_id"] + spec["messages"]
    sent = i = reported = 0
    while first < end:
        n = min(batch, end - first)
        while prod.in_flight >= 4 * len(parts):
            prod.poll(5)
        values, offsets = id_batch(spec["size"], first, n)
        prod.send_buffers(topic, values, offsets, partition=parts[i % len(parts)])
        first += n
        sent += n
        i += 1
        if prod.acked_records != reported:
            ctx.add(prod.acked_records - reported)
            reported = prod.acked_records
    prod.flush(FLUSH_TIMEOUT_MS)
    ctx.add(prod.acked_records - reported)
    prod.close()
    return {"sent": sent, "acked": prod.acked_records, "errors": len(prod.errors)}


def queue_work(spec: dict, ctx) -> dict:
    from tailrace.client.share import ShareConsumer

    from .payload import ID, ack_summary

    unpack = ID.unpack_from
    c = ShareConsumer(spec["endpoint"], group=spec["group"], topics=[spec["queue"]], max_records=spec["batch"])
    ids: list[int] = []
    stamps: list[int] = []
    now = time.monotonic_ns
    polls = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    try:
        while ctx.total() < spec["expected"] and time.monotonic() < deadline:
            records = c.poll(spec["poll_ms"])
            polls += 1
            for r in records:
                ids.append(unpack(r.value)[0])
                c.acknowledge(r)
                stamps.append(now())
            if records:
                ctx.add(len(records))
        c.commit_sync()
    finally:
        c.close()
    return ack_summary(ids, stamps, polls=polls, refused_ranges=len(c.failed))
