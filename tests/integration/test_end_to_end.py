"""The broker end to end, with real router, worker and flusher processes."""

from __future__ import annotations

import threading
import time
import zlib

import numpy as np
import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.client.producer import STICKY_RECORDS
from tailrace.client.connection import Connection
from tailrace.client.records import encode_batch, iter_batches
from tests.clients import BLOCKING
from tests.helpers import MSG_BYTES, PROGRAMS, partition_payload


@pytest.fixture
def broker(module_broker):
    """One broker for the module's tests that take ``broker`` (tests/conftest.py): each test's
    topics are named after its client, so no two tests share one. A test that needs a broker of
    its own settings, or one that nothing else used, takes ``make_broker``."""
    return module_broker


def produce_partitions(bootstrap, topic, partitions, per_partition, acks, batch=4000, start=0, client=BLOCKING):
    acked = []
    with client.Producer(bootstrap, acks=acks, on_ack=lambda t, p, base, n: acked.append((p, base, n))) as prod:
        for first in range(start, start + per_partition, batch):
            n = min(batch, start + per_partition - first)
            for p in range(partitions):
                values, offsets = partition_payload(p, first, n)
                prod.send_buffers(topic, values, offsets, partition=p)
        prod.flush()
    return acked


def consume_all(bootstrap, topic, expect_per_partition: dict[int, int], timeout_s=120, isolation="memory",
                client=BLOCKING):
    got: dict[int, list] = {p: [] for p in expect_per_partition}
    counts = dict.fromkeys(expect_per_partition, 0)
    deadline = time.monotonic() + timeout_s
    with client.Consumer(bootstrap, max_wait_ms=200, isolation=isolation) as cons:
        cons.assign(topic, list(expect_per_partition), start="earliest")
        while any(counts[p] < expect_per_partition[p] for p in counts) and time.monotonic() < deadline:
            for _t, p, cols in cons.poll_columns(500):
                got[p].append(cols)
                counts[p] += len(cols)
    return got


def test_million_durable_messages_come_back_complete_in_order_byte_identical(broker):
    partitions, per_partition = 8, 125_000
    Admin(broker.bootstrap).create_topic("million", partitions)
    t0 = time.monotonic()
    acked = produce_partitions(broker.bootstrap, "million", partitions, per_partition, "durable")
    produce_s = time.monotonic() - t0
    assert sum(n for _p, _b, n in acked) == partitions * per_partition
    t0 = time.monotonic()
    got = consume_all(broker.bootstrap, "million", dict.fromkeys(range(partitions), per_partition))
    consume_s = time.monotonic() - t0
    for p in range(partitions):
        offsets = np.concatenate([c.offsets for c in got[p]])
        values = np.concatenate([c.values for c in got[p]])
        assert np.array_equal(offsets, np.arange(per_partition)), f"partition {p}: offsets not dense/in order"
        expected, _ = partition_payload(p, 0, per_partition)
        assert np.array_equal(values, expected), f"partition {p}: bytes differ"
    total = partitions * per_partition
    print(f"\n1M durable: produce {total / produce_s:,.0f} msg/s, consume {total / consume_s:,.0f} msg/s")


def test_restart_keeps_messages_and_offsets_and_producing_continues(make_broker, client):
    b = make_broker()
    Admin(b.bootstrap).create_topic("keep", 3)
    produce_partitions(b.bootstrap, "keep", 3, 5000, "durable", batch=700, client=client)
    before = consume_all(b.bootstrap, "keep", dict.fromkeys(range(3), 5000), client=client)
    assert b.stop() == 0
    assert not b.shm_regions(), "clean stop must unlink shared memory"
    b.start()
    after = consume_all(b.bootstrap, "keep", dict.fromkeys(range(3), 5000), client=client)
    for p in range(3):
        assert np.array_equal(np.concatenate([c.offsets for c in before[p]]), np.concatenate([c.offsets for c in after[p]]))
        assert np.array_equal(np.concatenate([c.values for c in before[p]]), np.concatenate([c.values for c in after[p]]))
    acked = produce_partitions(b.bootstrap, "keep", 3, 10, "memory", start=5000, client=client)
    assert sorted(base for _p, base, _n in acked) == [5000, 5000, 5000]
    offs = Admin(b.bootstrap).list_offsets("keep")
    assert [(o.log_start_offset, o.high_watermark) for o in offs] == [(0, 5010)] * 3


def _fetch(conn, topic, partition, offset, max_bytes=1 << 20, max_wait_ms=0):
    r = conn.request(P.Op.FETCH, topic, partition, P.encode(P.FetchRequest(offset, max_bytes, 1 << 20, max_wait_ms)))
    return P.decoder(P.FetchReply).decode(r.header), (r.body if isinstance(r.body, bytes) else bytes(r.body.buffer))


def test_fetch_from_ring_and_from_disk_after_wrap_return_same_bytes(make_broker):
    b = make_broker(ring_bytes=64 * 1024, max_batch_bytes=16 * 1024)
    Admin(b.bootstrap).create_topic("wrap", 1)
    conn = Connection(b.bootstrap)
    first = encode_batch([b"first-%03d" % i for i in range(50)])
    conn.request(P.Op.PRODUCE, "wrap", 0, P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)), first)
    info_ring, body_ring = _fetch(conn, "wrap", 0, 0, max_bytes=1)
    assert info_ring.source == "ring"
    filler = encode_batch([bytes(90)] * 100)  # ~10 KiB per batch: 20 batches wrap a 64 KiB ring 3 times
    for _ in range(20):
        conn.request(P.Op.PRODUCE, "wrap", 0, P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)), filler)
    info_disk, body_disk = _fetch(conn, "wrap", 0, 0, max_bytes=1)
    assert info_disk.source == "disk"
    assert body_ring == body_disk
    assert [v.value(i) for v in iter_batches(body_disk) for i in range(v.record_count)] == [b"first-%03d" % i for i in range(50)]
    # a fetch from the middle of a disk batch returns the whole batch; the next offset is right
    info_mid, body_mid = _fetch(conn, "wrap", 0, 25, max_bytes=1)
    assert body_mid == body_disk and info_mid.next_offset == 50
    conn.close()


def test_fetch_at_high_watermark_returns_soon_after_a_produce(broker):
    Admin(broker.bootstrap).create_topic("poll", 1)
    conn = Connection(broker.bootstrap)
    result = {}

    def fetcher():
        c = Connection(broker.bootstrap)
        t0 = time.monotonic()
        info, body = _fetch(c, "poll", 0, 0, max_wait_ms=2000)
        result["t"] = time.monotonic()
        result["waited"] = result["t"] - t0
        result["body"] = body
        c.close()

    th = threading.Thread(target=fetcher)
    th.start()
    time.sleep(0.3)
    conn.request(P.Op.PRODUCE, "poll", 0, P.encode(P.ProduceRequest(acks=P.Acks.MEMORY)), encode_batch([b"wake"]))
    acked = time.monotonic()
    th.join(5)
    conn.close()
    assert result["body"], "long poll returned without data"
    delay_ms = (result["t"] - acked) * 1000
    print(f"\nlong poll answered {delay_ms:.2f} ms after the produce ack (waited {result['waited'] * 1000:.0f} ms)")
    assert result["waited"] < 1.9, "the fetch waited out max_wait_ms instead of waking on the produce"


def test_bad_input_gets_named_errors_and_broker_keeps_serving(make_broker):
    b = make_broker(shm_budget_bytes=64 << 20, max_batch_bytes=64 * 1024, ring_bytes=1 << 20)
    admin = Admin(b.bootstrap)
    admin.create_topic("ok", 2)
    conn = Connection(b.bootstrap)
    sock = conn.sock
    E = P.ErrorCode
    hdr = P.encode(P.ProduceRequest(acks=P.Acks.MEMORY))

    def raw(frames):
        sock.send_multipart(frames)
        assert sock.poll(5000), "no reply"
        rep = sock.recv_multipart()
        return P.unpack_routing(rep[0])[2], rep

    good = encode_batch([b"x"] * 3)
    bad_crc = bytearray(good)
    bad_crc[-8] ^= 0xFF
    liar = bytearray(good)
    liar[36:40] = (10**6).to_bytes(4, "little")  # record_count lies
    cases = {
        "garbage single frame": ([b"\x01\x02"], E.MALFORMED),
        "wrong protocol version": ([b"\x09" + P.pack_routing(P.Op.LIST_TOPICS, -1, 1, b"")[1:], P.EMPTY_MAP], E.UNSUPPORTED_VERSION),
        "unknown op": ([P.pack_routing(99, -1, 2, b""), P.EMPTY_MAP], E.UNKNOWN_OP),
        "fetch without header": ([P.pack_routing(P.Op.FETCH, 0, 3, b"ok")], E.MALFORMED),
        "undecodable header": ([P.pack_routing(P.Op.FETCH, 0, 4, b"ok"), b"\xc1\xc1garbage"], E.MALFORMED),
        "bad CRC": ([P.pack_routing(P.Op.PRODUCE, 0, 5, b"ok"), hdr, bytes(bad_crc)], E.CORRUPT_BATCH),
        "lying count": ([P.pack_routing(P.Op.PRODUCE, 0, 6, b"ok"), hdr, bytes(liar)], E.MALFORMED),
        "truncated batch": ([P.pack_routing(P.Op.PRODUCE, 0, 7, b"ok"), hdr, good[:40]], E.MALFORMED),
        "unknown topic": ([P.pack_routing(P.Op.PRODUCE, 0, 8, b"nope"), hdr, good], E.UNKNOWN_TOPIC),
        "unknown partition": ([P.pack_routing(P.Op.PRODUCE, 7, 9, b"ok"), hdr, good], E.UNKNOWN_PARTITION),
        "batch over the size limit": ([P.pack_routing(P.Op.PRODUCE, 0, 10, b"ok"), hdr, encode_batch([bytes(70_000)])], E.BATCH_TOO_LARGE),
        "negative fetch offset": ([P.pack_routing(P.Op.FETCH, 0, 11, b"ok"), P.encode(P.FetchRequest(-5))], E.INVALID_REQUEST),
        "fetch past the end": ([P.pack_routing(P.Op.FETCH, 0, 12, b"ok"), P.encode(P.FetchRequest(10**9))], E.OFFSET_OUT_OF_RANGE),
        "ring over a worker's share of the memory budget": ([P.pack_routing(P.Op.CREATE_TOPIC, -1, 13, b"huge"), P.encode(P.CreateTopicRequest(1, 32 << 20))], E.SHM_BUDGET_EXCEEDED),
        "bad topic name": ([P.pack_routing(P.Op.CREATE_TOPIC, -1, 14, b"a b/c"), P.encode(P.CreateTopicRequest(1))], E.INVALID_REQUEST),
        "duplicate topic": ([P.pack_routing(P.Op.CREATE_TOPIC, -1, 15, b"ok"), P.encode(P.CreateTopicRequest(1))], E.TOPIC_EXISTS),
    }
    for name, (frames, want) in cases.items():
        code, rep = raw(frames)
        assert code == want, f"{name}: got {E(code).name}, want {want.name}"
        assert P.decoder(P.ErrorReply).decode(rep[1]).message, f"{name}: error reply without a message"
    code, rep = raw([P.pack_routing(P.Op.FETCH, 0, 16, b"ok"), P.encode(P.FetchRequest(10**9))])
    assert P.decoder(P.ErrorReply).decode(rep[1]).log_start_offset == 0
    # still serving: a good produce and fetch work, nothing bad was stored
    r = conn.request(P.Op.PRODUCE, "ok", 0, hdr, good)
    assert P.decoder(P.ProduceReply).decode(r.header).base_offset == 0
    info, body = _fetch(conn, "ok", 0, 0)
    assert info.high_watermark == 3 and [v.record_count for v in iter_batches(body)] == [3]
    assert b.proc.poll() is None and len(b.pids()) == PROGRAMS, "a broker process died"
    conn.close()
    admin.close()


def test_cli_produce_and_consume_round_trip(make_broker):
    import subprocess
    import sys

    broker = make_broker()  # of its own: ``status`` says it holds the one topic made here

    def cli(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "tailrace", *args, "--bootstrap", broker.bootstrap],
                              input=stdin, capture_output=True, timeout=60, check=True)

    out = cli("topic", "create", "cli", "--partitions", "2").stdout.decode()
    assert "created topic cli" in out
    assert ["cli", "2"] in [line.split()[:2] for line in cli("topic", "list").stdout.decode().splitlines()]
    cli("produce", "cli", "--acks", "durable", stdin=b"".join(b"line-%d\n" % i for i in range(100)))
    cli("produce", "cli", "--key", "k1", stdin=b"keyed\n")
    values = cli("consume", "cli", "--from", "earliest", "--timeout-ms", "500").stdout.split(b"\n")[:-1]
    assert sorted(values) == sorted([b"line-%d" % i for i in range(100)] + [b"keyed"])
    assert len(cli("consume", "cli", "--max", "7").stdout.split(b"\n")[:-1]) == 7
    desc = cli("topic", "describe", "cli").stdout.decode()
    assert "high" in desc and "watermark" in desc
    assert '"topics": 1' in cli("status", "--json").stdout.decode()


def test_producer_partitioners_and_consumer_records(broker, client):
    topic = f"keys-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 4)
    with client.Producer(broker.bootstrap, partitioner="key_hash", acks="memory", linger_ms=1) as prod:
        for i in range(200):
            prod.send(topic, b"v%d" % i, key=b"user-%d" % (i % 5))
    with client.Consumer(broker.bootstrap, max_wait_ms=100) as cons:
        cons.assign(topic, start="earliest")
        recs = []
        deadline = time.monotonic() + 10
        while len(recs) < 200 and time.monotonic() < deadline:
            recs.extend(cons.poll(200))
    assert len(recs) == 200
    by_key = {}
    for r in recs:
        by_key.setdefault(r.key, set()).add(r.partition)
        assert r.timestamp > 1_600_000_000_000
    assert all(len(ps) == 1 for ps in by_key.values()), "a key landed on two partitions"
    per_key_order = {}
    for r in sorted(recs, key=lambda r: (r.partition, r.offset)):
        per_key_order.setdefault(r.key, []).append(int(r.value[1:]))
    assert all(v == sorted(v) for v in per_key_order.values())


def test_the_sticky_partitioner_sends_unkeyed_records_in_runs_and_keyed_ones_by_hash(broker, client):
    """Kafka's default partitioner: 128 unkeyed records in a row to one partition, then the next
    (as even as round robin over time); a keyed record where key_hash puts it."""
    topic = f"sticky-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 4)
    n = 4 * STICKY_RECORDS * 2
    with client.Producer(broker.bootstrap, partitioner="sticky", acks="memory", linger_ms=1) as prod:
        for i in range(n):
            prod.send(topic, b"%d" % i)
        for i in range(40):
            prod.send(topic, b"k%d" % i, key=b"user-%d" % i)
    with client.Consumer(broker.bootstrap, max_wait_ms=100) as cons:
        cons.assign(topic, start="earliest")
        recs, deadline = [], time.monotonic() + 10
        while len(recs) < n + 40 and time.monotonic() < deadline:
            recs.extend(cons.poll(200))
    assert len(recs) == n + 40
    unkeyed = sorted((int(r.value), r.partition) for r in recs if not r.key)
    runs = [p for i, p in unkeyed[::STICKY_RECORDS]]
    assert all(p == runs[i // STICKY_RECORDS] for i, p in unkeyed), "an unkeyed record left its run"
    assert sorted(runs) == [0, 0, 1, 1, 2, 2, 3, 3]  # every partition took its share
    assert all(r.partition == zlib.crc32(r.key) % 4 for r in recs if r.key)


def test_clients_address_the_owning_worker_directly_and_fall_back_to_the_router(broker, client):
    topic = f"direct-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 2)

    def forwarded():
        with Admin(broker.bootstrap) as a:
            return a.status()["forwarded"]

    with client.Producer(broker.bootstrap, acks="memory") as prod:
        prod.send_batch(topic, [b"warm"] * 10, partition=0)
        prod.send_batch(topic, [b"warm"] * 10, partition=1)
        prod.flush()
        before = forwarded()
        for i in range(50):
            prod.send_batch(topic, [b"m%d" % i] * 20, partition=i % 2)
        prod.flush()
        assert forwarded() == before, "produce went through the router instead of the owner"
        with Admin(broker.bootstrap) as a:  # the module's broker places by load: both may be on one worker
            owners = {broker.settings.worker_endpoint(p.worker) for p in a.describe_topic(topic).partitions}
        assert set(prod.pool.direct) == owners and owners
    with client.Consumer(broker.bootstrap, max_wait_ms=100) as cons:
        cons.assign(topic, start="earliest")
        got = 0
        deadline = time.monotonic() + 10
        while got < 1020 and time.monotonic() < deadline:
            got += sum(len(c) for _t, _p, c in cons.poll_columns(200))
        assert got == 1020
    # A simple client without client-side addressing still works through the router.
    with client.Producer(broker.bootstrap, acks="memory", direct=False) as prod:
        prod.send(topic, b"via-router", partition=0)
        before = forwarded()
        prod.flush()
        assert forwarded() == before + 1 and not prod.pool.direct


def test_describe_says_which_partitions_are_adopted_and_new_clients_go_direct_from_the_first_request(broker, client):
    topic = f"adopt-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 2)

    def forwarded():
        with Admin(broker.bootstrap) as a:
            return a.status()["forwarded"]

    with Admin(broker.bootstrap) as a:
        assert [p.adopted for p in a.describe_topic(topic).partitions] == [False, False]
    with client.Producer(broker.bootstrap, acks="memory") as prod:  # first use: through the router
        prod.send(topic, b"warm", partition=0)
        prod.flush()
    with Admin(broker.bootstrap) as a:
        assert [p.adopted for p in a.describe_topic(topic).partitions] == [True, False]
    before = forwarded()
    with client.Producer(broker.bootstrap, acks="memory") as prod:  # a new client: straight to the owner
        prod.send(topic, b"direct", partition=0)
        prod.flush()
        assert forwarded() == before, "a new client's first request for an adopted partition went through the router"
        prod.send(topic, b"first use", partition=1)  # not adopted yet: the router makes the owner adopt it
        prod.flush()
        assert forwarded() == before + 1
    with client.Consumer(broker.bootstrap, max_wait_ms=100) as cons:
        cons.assign(topic, [0], start="earliest")
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for r in cons.poll(200)]
        assert got == [b"warm", b"direct"]
