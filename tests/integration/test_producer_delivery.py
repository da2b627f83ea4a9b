"""The producers' delivery contract against a real broker, blocking and asyncio alike: acks="none"
flushes only once the broker has everything, oversized records are refused before they reach the
wire, keys choose partitions by hash by default, and the buffer is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib

import pytest

from tailrace import Admin
from tailrace.client.connection import Pool
from tailrace.client.errors import BatchTooLargeError, TimeoutError_
from tailrace.client.producer import hash_partition
from tests.clients import BLOCKING


@pytest.fixture
def broker(module_broker):
    """One broker for the whole module (tests/conftest.py): each test's topics are named after
    its client and parameters, so no two tests share one."""
    return module_broker


def read_all(client, bootstrap, topic, expect, timeout_s=20.0):
    recs = []
    with client.Consumer(bootstrap, max_wait_ms=100) as cons:
        cons.assign(topic, start="earliest")
        deadline = time.monotonic() + timeout_s
        while len(recs) < expect and time.monotonic() < deadline:
            recs.extend(cons.poll(200))
        recs.extend(cons.poll(300))  # anything past ``expect`` shows up too
    return recs


@pytest.mark.parametrize("same_host", [False, True], ids=["zeromq", "same-host"])
def test_acks_none_flush_then_close_leaves_every_record_stored(broker, client, same_host):
    """Before the fix 0 to 500 of 600 were stored in 3 runs of 5: the socket was closed with its
    queue unsent. Every round here sends, flushes and closes, then counts at once."""
    topic = f"none-{client.name}-{same_host}"
    Admin(broker.bootstrap).create_topic(topic, 2)
    value = b"x" * 2000
    for round_ in range(3):
        prod = client.Producer(broker.bootstrap, acks="none", same_host=same_host)
        for i in range(600):
            prod.send(topic, b"%d-%d-" % (round_, i) + value)
        prod.flush()
        prod.close()
        stored = read_all(client, broker.bootstrap, topic, 600 * (round_ + 1), timeout_s=5)
        assert len(stored) == 600 * (round_ + 1), f"round {round_}: {len(stored)} stored"
    assert len({r.value for r in stored}) == 1800  # once each: the closing round trip stored nothing twice


def test_a_record_over_the_broker_limit_is_refused_at_once_and_the_producer_goes_on(broker, client):
    """A 3 MB record used to hang 120 s (the broker dropped the connection over its frame limit
    and the batch was retried until the delivery timeout); 1.5 MB got BATCH_TOO_LARGE from the
    broker. Both are refused by the client now, without being sent."""
    topic = f"big-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 1)
    with client.Producer(broker.bootstrap, acks="memory") as prod:
        prod.partitions_for(topic)
        assert prod.routes.max_batch_bytes == 1 << 20  # from DESCRIBE_TOPIC
        for size in (3_000_000, 1_500_000, (1 << 20) - 64):
            t0 = time.monotonic()
            with pytest.raises(BatchTooLargeError, match="not sent"):
                prod.send(topic, b"b" * size)
                prod.flush(timeout_ms=10_000)
            assert time.monotonic() - t0 < 2.0, f"{size} bytes: refused after {time.monotonic() - t0:.1f}s"
        # records that fit each make batches under the limit, never one over it
        for i in range(6):
            prod.send(topic, bytes([i]) * 400_000)
        prod.send(topic, b"small")
        prod.flush(timeout_ms=10_000)
    stored = read_all(client, broker.bootstrap, topic, 7)
    assert sorted(len(r.value) for r in stored) == [5] + [400_000] * 6


def test_the_limit_comes_from_the_broker(make_broker, client):
    b = make_broker(workers=1, max_batch_bytes=256 * 1024)
    Admin(b.bootstrap).create_topic("small", 1)
    with client.Producer(b.bootstrap, acks="memory", batch_bytes=4 << 20) as prod:
        prod.partitions_for("small")
        assert prod.routes.max_batch_bytes == 256 * 1024
        with pytest.raises(BatchTooLargeError, match="max_batch_bytes=262144"):
            prod.send("small", b"s" * 300_000)
            prod.flush(timeout_ms=10_000)
        for i in range(10):
            prod.send("small", b"f" * 100_000)  # 10 x 100 KB: batches of two, none refused
        prod.flush(timeout_ms=10_000)
    assert len(read_all(client, b.bootstrap, "small", 10)) == 10


def test_keyed_records_go_by_the_key_hash_by_default_in_send_and_send_batch(broker, client):
    topic = f"keyed-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 4)
    keys = [b"user-%d" % i for i in range(30)]
    with client.Producer(broker.bootstrap, acks="memory") as prod:  # default partitioner
        for k in keys:
            prod.send(topic, b"one-" + k, key=k)
        prod.send_batch(topic, [b"many-" + k for k in keys], keys=keys)
        for i in range(8):
            prod.send(topic, b"unkeyed-%d" % i)
    recs = read_all(client, broker.bootstrap, topic, 68)
    assert len(recs) == 68
    off_hash = [(r.key, r.partition) for r in recs if r.key and r.partition != zlib.crc32(r.key) % 4]
    assert not off_hash, f"{len(off_hash)} of 60 keyed records off their hash partition"
    assert all(hash_partition(r.key, 4) == r.partition for r in recs if r.key)
    assert len({r.partition for r in recs if not r.key}) == 4  # unkeyed: round robin


@pytest.mark.parametrize("how", ["send", "send_buffers"])
def test_send_blocks_when_buffer_memory_is_full_and_raises_after_max_block_ms(broker, client, how):
    """The router is frozen, so nothing is acknowledged: sends fill buffer_memory, then a send
    waits max_block_ms and raises (asyncio: its future does); once the router runs again
    everything that was queued is stored. Before, the buffer grew without bound (the asyncio
    send_buffers too, until it was held back like the others)."""
    import numpy as np

    offsets = np.array([0, 100_000], dtype=np.int32)
    topic = f"bounded-{client.name}-{how}"
    Admin(broker.bootstrap).create_topic(topic, 1)
    router = broker.pids()["router"]
    prod = client.Producer(broker.bootstrap, acks="memory", direct=False, buffer_memory=1 << 20,
                           max_block_ms=500, batch_bytes=128 * 1024, linger_ms=1)
    try:
        prod.partitions_for(topic)
        os.kill(router, signal.SIGSTOP)
        queued, t0 = 0, time.monotonic()
        for _ in range(20):
            try:
                if how == "send":
                    prod.send(topic, b"r" * 100_000)
                else:
                    prod.send_buffers(topic, b"r" * 100_000, offsets, partition=0)
            except TimeoutError_ as exc:
                assert "buffer_memory" in str(exc)
                assert 0.4 < time.monotonic() - t0 < 5
                break
            queued += 1
        if client.name == "async":
            prod.poll(1000)  # the waiting sends' max_block_ms runs out
            failed = [f for f in prod._futures if f.done() and isinstance(f.exception(), TimeoutError_)]
            queued = 20 - len(failed)
        assert 9 <= queued <= 11, queued
        assert prod.buffered_bytes <= (1 << 20) + 100_000
    finally:
        os.kill(router, signal.SIGCONT)
    if client.name == "async":
        with pytest.raises(TimeoutError_, match="buffer_memory"):
            prod.flush(timeout_ms=30_000)
    prod.flush(timeout_ms=30_000)
    prod.close()
    assert len(read_all(client, broker.bootstrap, topic, queued)) == queued


def test_clients_given_no_bootstrap_read_tailrace_bootstrap(broker, client, monkeypatch):
    monkeypatch.setenv("TAILRACE_BOOTSTRAP", broker.bootstrap)
    assert Pool().router.endpoint != "tcp://127.0.0.1:7420" or broker.bootstrap.endswith(":7420")
    topic = f"env-{client.name}"
    admin = client.Admin(None)
    try:
        admin.create_topic(topic, 1)
    finally:
        admin.close()
    with client.Producer(None, acks="memory") as prod:
        prod.send(topic, b"via the environment")
    assert [r.value for r in read_all(client, None, topic, 1)] == [b"via the environment"]


def test_tailrace_produce_with_acks_none_stores_every_line_of_its_stdin(broker, tmp_path):
    """``seq 1 600 | tailrace produce TOPIC --acks none`` as a user runs it: the command exits,
    then a consumer counts. Three runs, each must leave all of its 600 lines stored."""
    Admin(broker.bootstrap).create_topic("cli-none", 2)
    env = {**os.environ, "TAILRACE_BOOTSTRAP": broker.bootstrap}
    lines = b"".join(b"%d\n" % i for i in range(1, 601))
    for round_ in range(3):
        r = subprocess.run([sys.executable, "-m", "tailrace", "produce", "cli-none", "--acks", "none"],
                           input=lines, capture_output=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        stored = read_all(BLOCKING, broker.bootstrap, "cli-none", 600 * (round_ + 1), timeout_s=5)
        assert len(stored) == 600 * (round_ + 1), f"run {round_}: {len(stored) - 600 * round_} of 600 stored"
    values = sorted(int(r.value) for r in stored)
    assert values == sorted(list(range(1, 601)) * 3)


def _socket_of(prod, via):
    """The ZeroMQ socket a producer (blocking or asyncio) sends to ``via`` (None: the router) on."""
    pool = prod.pool
    if hasattr(pool, "conn"):
        return pool.conn(via).sock
    return pool._links[via or pool.router_endpoint].sock


@pytest.mark.parametrize("direct", [False, True], ids=["via-router", "direct-to-worker"])
def test_a_connection_the_broker_drops_fails_over_at_once_not_after_request_timeout(broker, client, direct):
    """A message part over the broker's frame limit (ZMQ_MAXMSGSIZE) makes it close that
    connection without a word, and the reply to the batch in flight on it is never sent. With
    request_timeout_ms=30 s the batch used to wait out the 30 s; now the close is seen (socket
    monitor) and the idempotent producer resends the batch at once: acknowledged once, stored
    once. The workers are held (SIGSTOP) while the batch and the oversized part go out, so the
    reply cannot come before the close."""
    topic = f"dropped-{client.name}-{direct}"
    Admin(broker.bootstrap).create_topic(topic, 1)
    workers = [pid for name, pid in broker.pids().items() if name.startswith("worker")]
    prod = client.Producer(broker.bootstrap, acks="memory", direct=direct, request_timeout_ms=30_000, linger_ms=0)
    try:
        prod.send(topic, b"before")
        prod.flush(timeout_ms=10_000)  # connected, the partition's owner known
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            prod.send(topic, b"in flight")
            assert prod.in_flight == 1
            via = next(iter(prod._inflight.values())).via
            assert (via is not None) == direct
            # the producer would refuse this (BATCH_TOO_LARGE): a raw send past its check
            _socket_of(prod, via).send_multipart([b"\x01" * 16, b"o" * (3 << 20)])
            t0 = time.monotonic()
            prod.poll(300)
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        prod.flush(timeout_ms=10_000)
        took = time.monotonic() - t0
        assert took < 2.0, f"the batch in flight on the dropped connection finished after {took:.1f}s"
        assert prod.retries >= 1
        prod.send(topic, b"after")  # the producer goes on over the new connection
        prod.flush(timeout_ms=10_000)
    finally:
        prod.close()
    stored = read_all(client, broker.bootstrap, topic, 3)
    assert [r.value for r in stored] == [b"before", b"in flight", b"after"]  # once each, in order


def test_a_batch_that_fails_for_good_leaves_no_gap_the_next_batches_are_stored(broker, client):
    """A batch that fails for good has used up its sequence numbers: the partition refuses every
    later batch of that producer id that skips them (OUT_OF_ORDER_SEQUENCE, Kafka's rule). The
    producer then takes a new producer id for the partition and numbers its batches again, those
    already queued included. Here the failure is a send_batch chunk over the broker's limit (its
    size is judged from its first 64 records), refused before it is sent."""
    topic = f"gap-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 1)
    with client.Producer(broker.bootstrap, acks="memory", linger_ms=0) as prod:
        prod.send_batch(topic, [b"first-%d" % i for i in range(5)], partition=0)
        prod.flush(timeout_ms=10_000)
        prod.send_batch(topic, [b"s"] * 64 + [b"B" * 1_100_000], partition=0)  # one chunk: over 1 MiB
        prod.send_batch(topic, [b"after-a-%d" % i for i in range(5)], partition=0)  # queued behind it
        prod.send_batch(topic, [b"after-b-%d" % i for i in range(5)], partition=0)
        with pytest.raises(BatchTooLargeError):
            prod.flush(timeout_ms=10_000)
        prod.send_batch(topic, [b"later-%d" % i for i in range(5)], partition=0)
        prod.flush(timeout_ms=10_000)
    stored = [r.value for r in read_all(client, broker.bootstrap, topic, 20)]
    assert stored == ([b"first-%d" % i for i in range(5)] + [b"after-a-%d" % i for i in range(5)]
                      + [b"after-b-%d" % i for i in range(5)] + [b"later-%d" % i for i in range(5)])


def test_a_look_for_closed_connections_before_the_first_request_keeps_the_handshake_for_it(broker):
    """A Pool polls every connection's monitor (Pool.recv, settle): when the router connection's
    first handshake came while nobody had asked for it yet, that look took the event off the
    monitor, and the first request then waited connect_timeout_ms for a handshake already done
    and raised BrokerUnavailableError, on every later request too (group members starved of
    their heartbeats: test_groups' three members never balanced)."""
    from tailrace.client import protocol as P
    from tailrace.client.connection import Connection

    c = Connection(broker.bootstrap, connect_timeout_ms=1500)
    try:
        c.sock  # connects; the handshake completes in the background
        time.sleep(0.5)
        assert c.dropped() is False  # what Pool.recv and Pool.settle do with every monitor
        t0 = time.monotonic()
        c.request(P.Op.LIST_TOPICS, "", header=P.encode(P.ListTopicsRequest()), timeout_ms=5000)
        assert time.monotonic() - t0 < 1.0
    finally:
        c.close()


def test_acks_none_flush_after_lost_one_way_batches_returns_without_error(broker):
    """One-way batches lost on the way (here the last two are never sent, as when a process dies
    with them in flight) leave a gap before the copy of the last one that closes the flush: the
    broker refuses that copy OUT_OF_ORDER_SEQUENCE. acks="none" promises nothing for lost
    records, so the flush returns at once and raises nothing; before the fix it resent the copy
    until delivery_timeout_ms and raised OUT_OF_ORDER_SEQUENCE (the kill -9 test's acks=none case)."""
    topic = "none-lost"
    Admin(broker.bootstrap).create_topic(topic, 1)
    prod = BLOCKING.Producer(broker.bootstrap, acks="none", linger_ms=0, delivery_timeout_ms=5000)
    send, dropped = prod.pool.send, []

    def lossy(via, op, *args):
        if len(dropped) < 2 and args[0] == topic and prod.acked_records >= 3:
            dropped.append(op)
            return -1  # never sent
        return send(via, op, *args)

    prod.pool.send = lossy
    for i in range(5):
        prod.send(topic, b"r%d" % i, partition=0)
        prod.poll(0)
    assert len(dropped) == 2
    t0 = time.monotonic()
    prod.flush(10_000)
    assert time.monotonic() - t0 < 2
    prod.close()
    stored = [r.value for r in read_all(BLOCKING, broker.bootstrap, topic, 3, timeout_s=5)]
    assert stored == [b"r0", b"r1", b"r2"]
