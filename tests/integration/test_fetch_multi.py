"""FETCH_MULTI (docs/PROTOCOL.md 4.2a) against a real broker, in raw frames: many partitions of one
worker read in one request, one long poll over all of them, the journal path for a partition past
its ring, per-partition errors beside partitions served, and fetch sessions that carry only the
positions that moved.
"""

from __future__ import annotations

import threading
import time

import pytest

from tailrace.client import protocol as P
from tailrace.client.records import encode_batch, iter_batches
from tests.integration.test_produce_multi import broker, owners, router  # noqa: F401 - fixtures
from tests.integration.test_protocol_conformance import Wire, create_topic, error, ok, routing

E = P.ErrorCode


def fetch_multi(wire: Wire, topic: str, positions: dict[int, int], partition: int = -1, **fields):
    """(reply, {partition: (outcome, values)}) of one FETCH_MULTI."""
    head = P.encode(P.FetchMultiRequest(list(positions), list(positions.values()), **fields))
    rep, frames = ok(wire, [routing(P.Op.FETCH_MULTI, topic, partition), head], P.FetchMultiReply)
    with_data = [r for r in rep.results if r.body_bytes]
    assert len(frames) == 2 + len(with_data), "routing, header and one body frame per partition with data"
    bodies, out = iter(frames[2:]), {}
    for r in rep.results:
        chunk = next(bodies) if r.body_bytes else b""
        assert len(chunk) == r.body_bytes
        out[r.partition] = (r, [b.value(i) for b in iter_batches(chunk) for i in range(b.record_count)])
    return rep, out


def produce(wire: Wire, topic: str, partition: int, values: list[bytes], acks: int = P.Acks.MEMORY) -> None:
    ok(wire, [routing(P.Op.PRODUCE, topic, partition), P.encode(P.ProduceRequest(acks=acks)), encode_batch(values)])


def test_one_request_reads_many_partitions_and_refuses_only_the_ones_it_cannot_serve(router):
    topic = "fm-basic"
    create_topic(router, topic, 6)
    by = owners(router, topic)  # each partition holds b"warm" at offset 0
    mine, other = list(by.values())
    for p in mine:
        produce(router, topic, p, [f"{p}-{i}".encode() for i in range(3)])
    positions = {p: 0 for p in mine} | {other[0]: 0, 99: 0}
    rep, out = fetch_multi(router, topic, positions)
    assert rep.session_id == -1 and [r.partition for r in rep.results] == list(positions), "one outcome per partition, in order"
    for p in mine:
        r, values = out[p]
        assert r.code == E.OK and values == [b"warm"] + [f"{p}-{i}".encode() for i in range(3)]
        assert r.next_offset == 4 and r.high_watermark == 4 and r.log_start_offset == 0
    assert out[other[0]][0].code == E.NOT_OWNER and out[99][0].code == E.UNKNOWN_PARTITION
    # past the end of one partition: OFFSET_OUT_OF_RANGE for it, data for the rest
    rep, out = fetch_multi(router, topic, {mine[0]: 50, mine[1]: 1})
    assert out[mine[0]][0].code == E.OFFSET_OUT_OF_RANGE and out[mine[0]][0].high_watermark == 4
    assert out[mine[1]][1] == [f"{mine[1]}-{i}".encode() for i in range(3)]
    # straight to the worker (its partitions only)
    d = ok(router, [routing(P.Op.DESCRIBE_TOPIC, topic), P.EMPTY_MAP], P.DescribeReply)[0]
    worker = Wire(next(pi.endpoint for pi in d.partitions if pi.partition == mine[0]))
    try:
        rep, out = fetch_multi(worker, topic, {p: 1 for p in mine} | {other[0]: 0})
        assert [out[p][1] for p in mine] == [[f"{p}-{i}".encode() for i in range(3)] for p in mine]
        assert out[other[0]][0].code == E.NOT_OWNER
    finally:
        worker.close()


def test_a_long_poll_over_many_partitions_returns_when_any_gets_data_or_when_the_wait_ends(router):
    topic = "fm-poll"
    create_topic(router, topic, 6)
    mine = next(iter(owners(router, topic).values()))
    positions = {p: 1 for p in mine}
    t = time.monotonic()
    rep, out = fetch_multi(router, topic, positions, max_wait_ms=400)
    waited = time.monotonic() - t
    assert 0.35 <= waited < 5, f"an empty long poll returned after {waited:.2f}s, max_wait_ms=400"
    assert all(r.code == E.OK and r.body_bytes == 0 for r in rep.results)
    timer = threading.Timer(0.3, lambda: produce(Wire(_bootstrap), topic, mine[-1], [b"late"]))
    t = time.monotonic()
    timer.start()
    try:
        rep, out = fetch_multi(router, topic, positions, max_wait_ms=10_000)
    finally:
        timer.join()
    waited = time.monotonic() - t
    assert 0.25 <= waited < 5, f"woke after {waited:.2f}s"
    assert out[mine[-1]][1] == [b"late"]
    assert all(out[p][1] == [] for p in mine[:-1])


_bootstrap = ""


@pytest.fixture(autouse=True)
def _remember_bootstrap(broker):
    global _bootstrap
    _bootstrap = broker.bootstrap


def test_a_partition_past_its_ring_is_read_from_the_journal_in_the_same_request(router):
    topic = "fm-disk"
    create_topic(router, topic, 4, ring_bytes=64 * 1024)
    mine = next(iter(owners(router, topic).values()))
    want = {}
    for p in mine[:2]:
        want[p] = [b"warm"]
        for i in range(40):  # 40 x 4 KiB: the 64 KiB ring wraps, the start is on disk only
            vals = [f"{p}-{i}-{j}".encode() * 100 for j in range(4)]
            produce(router, topic, p, vals, P.Acks.DURABLE)  # (the flusher keeps up: no BACKPRESSURE)
            want[p] += vals
    got = {p: [] for p in want}
    positions = {p: 0 for p in want}
    for _ in range(200):
        rep, out = fetch_multi(router, topic, positions, max_bytes=32 * 1024, isolation="durable", max_wait_ms=200)
        for p, (r, values) in out.items():
            assert r.code == E.OK, r
            got[p] += values
            positions[p] = r.next_offset
        if all(len(got[p]) == len(want[p]) for p in want):
            break
    assert got == want


def test_a_session_sends_only_what_moved_and_answers_only_what_changed(router):
    topic = "fm-session"
    create_topic(router, topic, 6)
    mine = next(iter(owners(router, topic).values()))
    rep, out = fetch_multi(router, topic, {p: 0 for p in mine}, session_id=0)
    sid = rep.session_id
    assert sid > 0 and set(out) == set(mine) and all(v == [b"warm"] for _r, v in out.values())
    # the positions moved: say so; nothing new, so only the named partitions are in the reply
    rep, out = fetch_multi(router, topic, {p: 1 for p in mine}, session_id=sid)
    assert rep.session_id == sid and set(out) == set(mine) and all(v == [] for _r, v in out.values())
    # nothing moved: an empty request in the session long-polls all of them, answers the one with data
    timer = threading.Timer(0.3, lambda: produce(Wire(_bootstrap), topic, mine[1], [b"news"]))
    t = time.monotonic()
    timer.start()
    try:
        rep, out = fetch_multi(router, topic, {}, partition=mine[0], session_id=sid, max_wait_ms=10_000)
    finally:
        timer.join()
    assert time.monotonic() - t < 5 and list(out) == [mine[1]] and out[mine[1]][1] == [b"news"]
    # forget a partition: its data is no longer read in the session
    produce(router, topic, mine[0], [b"unseen"])
    rep, out = fetch_multi(router, topic, {mine[1]: 2}, partition=mine[0], session_id=sid, forget=[mine[0]], max_wait_ms=300)
    assert mine[0] not in out and out[mine[1]][1] == []
    code, message = error(router, [routing(P.Op.FETCH_MULTI, topic, mine[0]),
                                   P.encode(P.FetchMultiRequest(session_id=sid + 1000))])
    assert code == E.FETCH_SESSION_NOT_FOUND and "open a new one" in message
    # a session is its connection's own: another connection naming its id is not served from it
    other = Wire(_bootstrap)
    try:
        code, message = error(other, [routing(P.Op.FETCH_MULTI, topic, mine[0]),
                                      P.encode(P.FetchMultiRequest(session_id=sid))])
        assert code == E.FETCH_SESSION_NOT_FOUND, E(code).name
    finally:
        other.close()
    # nothing to wait on (no partition, no session): answered at once, not parked
    t = time.monotonic()
    rep, out = fetch_multi(router, topic, {}, partition=mine[0], max_wait_ms=5_000)
    assert rep.results == [] and time.monotonic() - t < 2


@pytest.mark.parametrize("fields", [dict(partitions=[0, 1], offsets=[0]), dict(partitions=[0, 0], offsets=[0, 0]),
                                    dict(partitions=[0], offsets=[-1]), dict(partitions=[0], offsets=[0], isolation="x")])
def test_bad_fields_are_invalid_request(router, fields):
    topic = "fm-invalid"
    if "fm-invalid" not in {t.name for t in ok(router, [routing(P.Op.LIST_TOPICS), P.EMPTY_MAP], P.ListTopicsReply)[0].topics}:
        create_topic(router, topic, 2)
    code, message = error(router, [routing(P.Op.FETCH_MULTI, topic, 0), P.encode(P.FetchMultiRequest(**fields))])
    assert code == E.INVALID_REQUEST, (E(code).name, message)


# --- the Python consumers fetch each worker's partitions with one request ------------------------


def _fill(bootstrap: str, topic: str, partitions: int, n: int) -> dict[int, list[bytes]]:
    from tailrace.client.producer import Producer
    want = {p: [f"{p}:{i}".encode() for i in range(n)] for p in range(partitions)}
    with Producer(bootstrap, acks="memory") as prod:
        for p, values in want.items():
            prod.send_batch(topic, values, partition=p)
        prod.flush()
    return want


@pytest.mark.parametrize("multi", [True, False])
def test_the_blocking_consumer_reads_many_partitions_with_one_fetch_per_worker(broker, router, multi):
    from tailrace.client.consumer import Consumer
    from tests.integration.test_produce_multi import _CountOps
    topic = f"fm-consumer-{multi}"
    create_topic(router, topic, 16, ring_bytes=1 << 20)
    want = _fill(broker.bootstrap, topic, 16, 50)
    got = {p: [] for p in range(16)}
    with Consumer(broker.bootstrap, max_wait_ms=200, multi_partition=multi) as c:
        counted = _CountOps(c.pool)
        c.assign(topic)
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 800 and time.monotonic() < deadline:
            for rec in c.poll(500):
                got[rec.partition].append(rec.value)
        heads = []
        send = c.pool.send
        c.pool.send = lambda endpoint, op, topic, partition, header=P.EMPTY_MAP, body=None: (
            heads.append(header) if op == P.Op.FETCH_MULTI else None, send(endpoint, op, topic, partition, header, body))[1]
        for _ in range(3):  # caught up: the next polls long-poll every partition at once
            assert c.poll(300) == []
    assert got == want
    if multi:
        assert counted.ops.get(P.Op.FETCH_MULTI, 0) >= 2 and counted.ops.get(P.Op.FETCH, 0) <= 16, counted.ops
        # in its fetch sessions, a caught-up consumer sends no positions at all (nothing moved)
        quiet = [P.decoder(P.FetchMultiRequest).decode(h) for h in heads]
        assert quiet and all(q.session_id > 0 and q.partitions == [] for q in quiet), quiet
    else:
        assert P.Op.FETCH_MULTI not in counted.ops


def test_a_caught_up_consumer_of_many_lanes_lists_nothing_and_is_answered_nothing(broker, router):
    # more partitions than one request carries (multi_partition_max): each worker's are fetched in
    # several lanes, whose membership must hold from poll to poll, or the sessions re-list every
    # quiet partition and the workers answer each of them every wait (10,000 quiet partitions
    # took a core of each worker and of the consumer)
    from tailrace.client.consumer import Consumer
    topic = "fm-lanes"
    create_topic(router, topic, 300, ring_bytes=64 << 10)
    want = _fill(broker.bootstrap, topic, 300, 2)
    got = {p: [] for p in range(300)}
    with Consumer(broker.bootstrap, max_wait_ms=100, multi_partition_max=40) as c:
        c.assign(topic)
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 600 and time.monotonic() < deadline:
            for rec in c.poll(500):
                got[rec.partition].append(rec.value)
        assert got == want
        for _ in range(3):  # each lane's first request after its data lists the positions that moved
            assert c.poll(200) == []
        heads, answered = [], []
        send, take = c.pool.send, c._answered
        c.pool.send = lambda endpoint, op, topic, partition, header=P.EMPTY_MAP, body=None: (
            heads.append(header) if op == P.Op.FETCH_MULTI else None, send(endpoint, op, topic, partition, header, body))[1]
        c._answered = lambda a, *rest: (answered.append(a.partition), take(a, *rest))[1]
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            assert c.poll(300) == []
        lanes = list(c._lanes)
    quiet = [P.decoder(P.FetchMultiRequest).decode(h) for h in heads]
    assert len(lanes) >= 8 and {p for lane in lanes for p in lane.members} == set(range(300))
    assert len(quiet) >= 2 * len(lanes), "every lane long-polls again after each wait"
    assert all(q.session_id > 0 and q.partitions == [] and q.forget == [] for q in quiet), quiet[:3]
    assert answered == []


def test_the_asyncio_consumer_reads_many_partitions_with_fetch_multi(broker, router):
    import asyncio

    from tailrace.client.aio import AsyncConsumer
    from tests.integration.test_produce_multi import _CountOps
    topic = "fm-aio-consumer"
    create_topic(router, topic, 16, ring_bytes=1 << 20)
    want = _fill(broker.bootstrap, topic, 16, 40)

    async def run():
        got = {p: [] for p in range(16)}
        async with AsyncConsumer(broker.bootstrap, max_wait_ms=200) as c:
            counted = _CountOps(c.pool)
            await c.assign(topic)
            deadline = time.monotonic() + 30
            while sum(map(len, got.values())) < 640 and time.monotonic() < deadline:
                for rec in await c.poll(500):
                    got[rec.partition].append(rec.value)
        return got, counted.ops

    got, ops = asyncio.run(run())
    assert got == want
    assert ops.get(P.Op.FETCH_MULTI, 0) >= 1, ops
