"""PRODUCE_MULTI (docs/PROTOCOL.md 4.1a) against a real broker, in raw frames: one request carries
a batch for each of many partitions of one worker, one reply holds each partition's outcome, and
one partition's refusal never fails its neighbours (an unknown partition, one another worker owns,
a full ring, a corrupt batch, a sequence gap, a topic deleted under a durable wait).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tailrace.client import protocol as P
from tailrace.client.records import encode_batch, iter_batches
from tests.integration.test_protocol_conformance import broker  # noqa: F401 - a fixture: a broker of this module's own
from tests.integration.test_protocol_conformance import Wire, create_topic, error, ok, routing

E = P.ErrorCode


@pytest.fixture
def router(broker):
    w = Wire(broker.bootstrap)
    yield w
    w.close()


def multi(wire: Wire, topic: str, batches: dict[int, bytes], acks: int = P.Acks.MEMORY) -> dict[int, P.PartitionOutcome]:
    parts = list(batches)
    head = P.encode(P.ProduceMultiRequest(parts, acks=acks))
    rep, frames = ok(wire, [routing(P.Op.PRODUCE_MULTI, topic), head, *batches.values()], P.ProduceMultiReply)
    assert len(frames) == 2 and [r.partition for r in rep.results] == parts, "one outcome per partition, in request order"
    return {r.partition: r for r in rep.results}


def owners(wire: Wire, topic: str) -> dict[str, list[int]]:
    """worker endpoint -> its partitions (each adopted first by a produce through the router)."""
    d = ok(wire, [routing(P.Op.DESCRIBE_TOPIC, topic), P.EMPTY_MAP], P.DescribeReply)[0]
    for pi in d.partitions:
        if not pi.adopted:
            ok(wire, [routing(P.Op.PRODUCE, topic, pi.partition), P.encode(P.ProduceRequest()), encode_batch([b"warm"])])
    d = ok(wire, [routing(P.Op.DESCRIBE_TOPIC, topic), P.EMPTY_MAP], P.DescribeReply)[0]
    by: dict[str, list[int]] = {}
    for pi in d.partitions:
        by.setdefault(pi.endpoint, []).append(pi.partition)
    return by


def values_at(wire: Wire, topic: str, partition: int, offset: int = 0) -> list[bytes]:
    info, reply = ok(wire, [routing(P.Op.FETCH, topic, partition), P.encode(P.FetchRequest(offset))], P.FetchReply)
    return [b.value(i) for b in iter_batches(reply[2]) for i in range(b.record_count)]


def hwm(wire: Wire, topic: str) -> list[int]:
    rep = ok(wire, [routing(P.Op.LIST_OFFSETS, topic), P.EMPTY_MAP], P.ListOffsetsReply)[0]
    return [p.high_watermark for p in rep.partitions]


@pytest.mark.parametrize("acks", [P.Acks.MEMORY, P.Acks.DURABLE])
def test_one_request_through_the_router_stores_each_partitions_batch_and_answers_each_partition(router, acks):
    topic = f"multi-router-{acks}"
    create_topic(router, topic, 6)
    by = owners(router, topic)
    assert len(by) == 2, f"6 partitions over 2 workers: {by}"
    mine, other = list(by.values())
    batches = {p: encode_batch([f"{p}-a".encode(), f"{p}-b".encode()]) for p in mine}
    batches[other[0]] = encode_batch([b"elsewhere"])  # another worker's: NOT_OWNER, stored nowhere
    batches[99] = encode_batch([b"nowhere"])  # no such partition
    before = hwm(router, topic)
    out = multi(router, topic, batches, acks)
    for p in mine:
        assert out[p].code == E.OK and out[p].base_offset == before[p] and out[p].record_count == 2, out[p]
        assert out[p].append_time_us > 0
        assert values_at(router, topic, p, before[p]) == [f"{p}-a".encode(), f"{p}-b".encode()]
    assert out[other[0]].code == E.NOT_OWNER and "another worker" in out[other[0]].message
    assert out[99].code == E.UNKNOWN_PARTITION
    after = hwm(router, topic)
    assert after[other[0]] == before[other[0]], "a refused partition's batch was stored"
    if acks == P.Acks.DURABLE:
        offsets = ok(router, [routing(P.Op.LIST_OFFSETS, topic), P.EMPTY_MAP], P.ListOffsetsReply)[0].partitions
        for p in mine:
            assert offsets[p].durable_watermark >= out[p].base_offset + 2, "answered before the fsync covered it"


@pytest.mark.parametrize("transport", ["zeromq", "unix"])
def test_straight_to_a_worker_its_own_partitions_are_stored_and_the_others_refused(broker, router, transport):
    topic = f"multi-direct-{transport}"
    create_topic(router, topic, 4)
    by = owners(router, topic)
    endpoint, mine = next(iter(by.items()))
    d = ok(router, [routing(P.Op.DESCRIBE_TOPIC, topic), P.EMPTY_MAP], P.DescribeReply)[0]
    local = {pi.endpoint: pi.local_endpoint for pi in d.partitions}[endpoint]
    others = [p for p in range(4) if p not in mine]
    worker = Wire(endpoint if transport == "zeromq" else local)
    try:
        before = hwm(router, topic)
        batches = {p: encode_batch([b"x" * 100] * 3) for p in mine + others}
        out = multi(worker, topic, batches, P.Acks.DURABLE)
        for p in mine:
            assert out[p].code == E.OK and out[p].base_offset == before[p] and out[p].record_count == 3
        for p in others:
            assert out[p].code == E.NOT_OWNER, out[p]
        assert hwm(router, topic) == [before[p] + (3 if p in mine else 0) for p in range(4)]
    finally:
        worker.close()


def test_a_corrupt_batch_and_a_sequence_gap_fail_their_partitions_only(router):
    topic = "multi-bad"
    create_topic(router, topic, 6)
    mine = next(iter(owners(router, topic).values()))
    assert len(mine) >= 3
    a, b, c = mine[:3]
    corrupt = bytearray(encode_batch([b"good", b"bytes"]))
    corrupt[-9] ^= 0xFF  # a value byte: the CRC no longer matches
    pid = 7_000_001
    ok(router, [routing(P.Op.PRODUCE, topic, c), P.encode(P.ProduceRequest()),
                encode_batch([b"s0"], producer_id=pid, base_sequence=0)])
    gap = encode_batch([b"s5"], producer_id=pid, base_sequence=5)  # sequence 1 expected
    before = hwm(router, topic)
    out = multi(router, topic, {a: encode_batch([b"fine"]), b: bytes(corrupt), c: gap})
    assert out[a].code == E.OK and values_at(router, topic, a, before[a]) == [b"fine"]
    assert out[b].code == E.CORRUPT_BATCH, out[b]
    assert out[c].code == E.OUT_OF_ORDER_SEQUENCE, out[c]
    after = hwm(router, topic)
    assert (after[b], after[c]) == (before[b], before[c])


def test_a_full_ring_refuses_its_partition_and_the_neighbours_are_stored(broker, router):
    topic = "multi-full"
    create_topic(router, topic, 4, ring_bytes=64 * 1024)
    mine = next(iter(owners(router, topic).values()))
    full, free = mine[0], mine[1]
    flusher = broker.pids()["flusher"]
    os.kill(flusher, signal.SIGSTOP)  # nothing drains: the ring of ``full`` fills
    try:
        chunk = encode_batch([b"f" * 1000] * 8)
        for _ in range(200):
            code, _msg = error(router, [routing(P.Op.PRODUCE, topic, full), P.encode(P.ProduceRequest()), chunk])
            if code == E.BACKPRESSURE:
                break
            assert code == E.OK, E(code).name
        else:
            pytest.fail("the ring never filled with the flusher stopped")
        before = hwm(router, topic)
        out = multi(router, topic, {full: chunk, free: encode_batch([b"room"])})
        assert out[full].code == E.BACKPRESSURE, out[full]
        assert out[free].code == E.OK and out[free].base_offset == before[free]
        assert hwm(router, topic)[full] == before[full]
    finally:
        os.kill(flusher, signal.SIGCONT)
    assert values_at(router, topic, free, before[free]) == [b"room"]


def test_a_topic_deleted_under_a_durable_wait_answers_unknown_topic_for_its_batches(broker, router):
    topic = "multi-deleted"
    create_topic(router, topic, 4)
    mine = next(iter(owners(router, topic).values()))
    flusher = broker.pids()["flusher"]
    os.kill(flusher, signal.SIGSTOP)  # no sync: the durable request waits
    try:
        head = P.encode(P.ProduceMultiRequest(mine, acks=P.Acks.DURABLE))
        frames = [routing(P.Op.PRODUCE_MULTI, topic), head, *[encode_batch([b"d"]) for _ in mine]]
        router.sock.send_multipart(frames)
        time.sleep(0.3)
        assert not router.sock.poll(200), "a durable multi-produce answered with the flusher stopped"
        ok(router, [routing(P.Op.DELETE_TOPIC, topic), P.EMPTY_MAP])
        rid = P.unpack_routing(frames[0])[4]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert router.sock.poll(int((deadline - time.monotonic()) * 1000) + 1), "no answer after the delete"
            reply = router.sock.recv_multipart()
            if P.unpack_routing(reply[0])[4] == rid:
                break
        rep = P.decoder(P.ProduceMultiReply).decode(reply[1])
        assert [r.code for r in rep.results] == [E.UNKNOWN_TOPIC] * len(mine), rep
        assert all("not durable" in r.message for r in rep.results)
    finally:
        os.kill(flusher, signal.SIGCONT)


@pytest.mark.parametrize("case", ["count", "twice", "acks"])
def test_a_bad_header_is_invalid_request_and_nothing_is_stored(router, case):
    topic = f"multi-invalid-{case}"
    create_topic(router, topic, 2)
    batch = encode_batch([b"never"])
    heads = {"count": P.ProduceMultiRequest([0, 1]), "twice": P.ProduceMultiRequest([0, 0]),
             "acks": P.ProduceMultiRequest([0], acks=7)}
    n = {"count": 1, "twice": 2, "acks": 1}[case]
    code, message = error(router, [routing(P.Op.PRODUCE_MULTI, topic), P.encode(heads[case]), *[batch] * n])
    assert code == E.INVALID_REQUEST, (E(code).name, message)
    assert hwm(router, topic) == [0, 0]
    code, message = error(router, [routing(P.Op.PRODUCE_MULTI, topic), P.encode(P.ProduceMultiRequest([]))])
    assert code == E.MALFORMED and "one record batch per partition" in message


# --- the Python clients send each worker's ready batches as one request -------------------------


class _CountOps:
    """Counts the ops a producer's pool sends (the real pool sends them: this only looks)."""

    def __init__(self, pool):
        self.ops: dict[int, int] = {}
        self._send = pool.send
        pool.send = self

    def __call__(self, endpoint, op, *args, **kw):
        self.ops[op] = self.ops.get(op, 0) + 1
        return self._send(endpoint, op, *args, **kw)


def _stored(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    w = Wire(bootstrap)
    try:
        return {p: values_at(w, topic, p) for p in range(partitions)}
    finally:
        w.close()


@pytest.mark.parametrize("acks", ["memory", "durable"])
def test_the_blocking_producer_sends_one_request_per_worker_and_every_record_lands_in_order(broker, router, acks):
    from tailrace.client.producer import Producer
    topic = f"multi-client-{acks}"
    create_topic(router, topic, 8, ring_bytes=1 << 20)
    with Producer(broker.bootstrap, acks=acks, linger_ms=50) as prod:
        counted = _CountOps(prod.pool)
        for rnd in range(20):
            for p in range(8):
                prod.send(topic, f"{p}:{rnd}".encode(), partition=p)
            prod.flush()
    stored = _stored(broker.bootstrap, topic, 8)
    assert stored == {p: [f"{p}:{rnd}".encode() for rnd in range(20)] for p in range(8)}
    multi_requests = counted.ops.get(P.Op.PRODUCE_MULTI, 0)
    assert multi_requests >= 10, f"8 partitions on 2 workers, 20 flushes: few multi-partition requests {counted.ops}"
    assert sum(counted.ops.values()) < 20 * 8 / 2, f"not fewer requests than partitions x rounds / 2: {counted.ops}"


def test_the_asyncio_producer_groups_its_ready_batches_per_worker(broker, router):
    import asyncio

    from tailrace.client.aio import AsyncProducer
    topic = "multi-aio"
    create_topic(router, topic, 8, ring_bytes=1 << 20)

    async def run():
        async with AsyncProducer(broker.bootstrap, acks="durable", linger_ms=0) as prod:
            counted = _CountOps(prod.pool)

            async def sender(p: int):
                for i in range(30):
                    await prod.send(topic, f"{p}:{i}".encode(), partition=p)
            await asyncio.gather(*(sender(p) for p in range(8)))
            return counted.ops

    ops = asyncio.run(run())
    stored = _stored(broker.bootstrap, topic, 8)
    assert stored == {p: [f"{p}:{i}".encode() for i in range(30)] for p in range(8)}
    assert ops.get(P.Op.PRODUCE_MULTI, 0) > 0, ops
    assert sum(ops.values()) < 8 * 30, f"one request per record and partition: {ops}"


def test_without_multi_partition_the_producer_sends_one_request_per_partition(broker, router):
    from tailrace.client.producer import Producer
    topic = "multi-off"
    create_topic(router, topic, 4, ring_bytes=1 << 20)
    with Producer(broker.bootstrap, acks="memory", linger_ms=50, multi_partition=False) as prod:
        counted = _CountOps(prod.pool)
        for p in range(4):
            prod.send(topic, b"v", partition=p)
        prod.flush()
    assert counted.ops == {P.Op.PRODUCE: 4}


def test_with_several_batches_in_flight_per_partition_each_request_lists_a_partition_once(broker, router):
    """max_in_flight_per_partition > 1: a partition's next batches go in the next requests (a
    PRODUCE_MULTI that listed it twice would be refused whole), and every record lands in order."""
    from tailrace.client.producer import Producer
    topic = "multi-window"
    create_topic(router, topic, 8, ring_bytes=4 << 20)
    heads = []
    with Producer(broker.bootstrap, acks="memory", linger_ms=20, batch_records=50,
                  max_in_flight_per_partition=4) as prod:
        send = prod.pool.send

        def spy(endpoint, op, topic_, partition, header=P.EMPTY_MAP, body=None):
            if op == P.Op.PRODUCE_MULTI:
                heads.append(P.decoder(P.ProduceMultiRequest).decode(header).partitions)
            return send(endpoint, op, topic_, partition, header, body)
        prod.pool.send = spy
        for p in range(8):
            prod.send_batch(topic, [f"{p}:{i}".encode() for i in range(1000)], partition=p)
        prod.flush()
    assert heads and any(len(h) > 1 for h in heads)
    assert all(len(set(h)) == len(h) for h in heads), "a request listed a partition twice"
    stored = _stored(broker.bootstrap, topic, 8)
    assert stored == {p: [f"{p}:{i}".encode() for i in range(1000)] for p in range(8)}
