"""Load generators for RabbitMQ (pika's BlockingConnection): the work-queue workload only.

The queue is a durable classic queue on the default exchange; every message is persistent
(delivery_mode 2). Fill: one basic_publish per message (AMQP has no batch publish; pika writes
each frame as it is called) without publisher confirms, then the parent waits until the queue
holds every message (``queue_depth``): the fill is not timed. Each consumer: basic_qos
prefetch ``batch`` (per consumer), basic_consume with manual acknowledgements, and basic_ack of
each delivery tag on its own (multiple=False); an acknowledgement's time is when basic_ack
returned (the frame written; AMQP acks have no reply). Before it ends a consumer makes one
synchronous call on its channel (a passive queue.declare), which the broker answers only after
every ack sent before it on that channel.
"""

from __future__ import annotations

import time

import pika

from .payload import ID, ack_summary, id_values

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _connect(endpoint: str) -> pika.BlockingConnection:
    host, port = endpoint.rsplit(":", 1)
    return pika.BlockingConnection(pika.ConnectionParameters(host=host, port=int(port), heartbeat=0))


def queue_setup(spec: dict) -> None:
    conn = _connect(spec["endpoint"])
    try:
        conn.channel().queue_declare(spec["queue"], durable=True)
    finally:
        conn.close()


def queue_depth(spec: dict) -> int:
    """Messages ready in the queue now."""
    conn = _connect(spec["endpoint"])
    try:
        return conn.channel().queue_declare(spec["queue"], durable=True, passive=True).method.message_count
    finally:
        conn.close()


def queue_fill(spec: dict, ctx) -> dict:
    conn = _connect(spec["endpoint"])
    ch = conn.channel()
    ctx.ready()
    first, end, batch = spec["first_id"], spec["first_id"] + spec["messages"], spec["batch"]
    sent = 0
    while first < end:
        n = min(batch, end - first)
        for v in id_values(spec["size"], first, n):
            ch.basic_publish("", spec["queue"], v, PERSISTENT)
        sent += n
        first += n
        ctx.add(n)
    conn.close()
    return {"sent": sent, "acked": sent, "errors": 0}  # no confirms: the parent counts the queue


def queue_work(spec: dict, ctx) -> dict:
    unpack = ID.unpack_from
    conn = _connect(spec["endpoint"])
    ch = conn.channel()
    ch.basic_qos(prefetch_count=spec["batch"])
    ids: list[int] = []
    stamps: list[int] = []
    now = time.monotonic_ns
    ack = ch.basic_ack
    expected = spec["expected"]
    idle = 0
    ctx.ready()
    deadline = ctx.t_start + spec["max_seconds"]
    for method, _props, body in ch.consume(spec["queue"], auto_ack=False, inactivity_timeout=spec["poll_ms"] / 1000):
        if method is None:  # nothing for poll_ms
            idle += 1
        else:
            ids.append(unpack(body)[0])
            ack(method.delivery_tag)
            stamps.append(now())
            ctx.add(1)
        if ctx.total() >= expected or time.monotonic() >= deadline:
            break
    left = ch.queue_declare(spec["queue"], durable=True, passive=True).method.message_count  # after every ack above
    ch.cancel()
    conn.close()
    return ack_summary(ids, stamps, idle_polls=idle, ready_after=left)
