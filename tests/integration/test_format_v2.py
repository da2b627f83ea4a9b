"""Record format v2 through real router, worker and flusher processes: every codec with and
without keys and headers, 0 B to 1 MiB, read from the ring, from the journal (after a restart)
and by a same-host ring reader; the topic settings (compression.type, message.timestamp.type,
the timestamp bounds); hostile batches refused with the neighbours' batches stored; and what a
client of protocol version 1 gets."""

from __future__ import annotations

import time

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client import codecs
from tailrace.client import protocol as P
from tailrace.client.errors import InvalidTimestampError
from tailrace.client.records import LOG_APPEND_TIME, encode_batch, iter_batches
from tests.integration.test_protocol_conformance import Wire, error, ok, routing

E = P.ErrorCode
CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
SIZES = [0, 100, 10_000, 1 << 20]


@pytest.fixture
def broker(module_broker):
    """One broker for the module's tests that take ``broker`` (tests/conftest.py): each makes
    topics of its own names."""
    return module_broker


def _records(n_each: int = 2):
    """(value, key, headers) per record: each size, keyed or not, with headers or not."""
    out = []
    for size in SIZES:
        for keyed in (False, True):
            for headed in (False, True):
                for j in range(n_each):
                    value = (b"%d-%d-" % (size, j) * (size // 4 + 1))[:size]
                    out.append((value, b"k%d" % j if keyed else None,
                                [("h", b"%d" % size), ("h", None), ("utf-\u00e9", b"")] if headed else None))
    return out


def _drain(consumer, want: int, timeout_s: float = 30) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll(200)
    return got


def _check(got, sent, topic) -> None:
    by_topic = {}
    for r in got:
        by_topic.setdefault(r.topic, []).append(r)
    for name, recs in sorted(by_topic.items()):
        recs.sort(key=lambda r: r.offset)
        # (a keyed batch gives unkeyed records an empty key: FORMAT.md 1.2, keys are per batch)
        assert [(r.value, r.key or None, r.headers) for r in recs] == [
            (v, k, tuple(h) if h else ()) for v, k, h in sent], name


def test_every_codec_round_trips_through_ring_journal_and_same_host(make_broker):
    b = make_broker(max_batch_bytes=2 << 20, segment_bytes=16 << 20)
    sent = _records()
    topics = [f"c-{c or 'none'}" for c in CODECS]
    with Admin(b.bootstrap) as a:
        for t in topics:
            a.create_topic(t, 1)
    for codec, t in zip(CODECS, topics):
        with Producer(b.bootstrap, compression=codec, acks="durable", linger_ms=2) as p:
            for v, k, h in sent:
                p.send(t, v, key=k, headers=h)
            assert p.flush() == len(sent)
    want = len(sent) * len(topics)
    for same_host in (False, True):  # fetch (ring) and the same-host ring reader
        with Consumer(b.bootstrap, same_host=same_host, max_wait_ms=100) as c:
            for t in topics:
                c.assign(t, start="earliest")
            got = _drain(c, want)
        assert len(got) == want, same_host
        _check(got, sent, topics)
    with Consumer(b.bootstrap, max_wait_ms=100) as c:  # the batches are stored compressed, as sent
        for codec, t in zip(CODECS, topics):
            c.assign(t, start="earliest")
        seen = {}
        deadline = time.monotonic() + 20
        while sum(seen.values()) < want and time.monotonic() < deadline:
            for a_, _s, _info, body in c.poll_raw(200):
                for v in iter_batches(body.buffer if hasattr(body, "buffer") else body):
                    assert v.codec == codecs.codec_id(a_.topic[2:]), a_.topic
                    seen[a_.topic] = seen.get(a_.topic, 0) + v.record_count
    b.stop()
    b.cleanup_shm()
    b.start()  # the rings start empty: every read is the journal's
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        for t in topics:
            c.assign(t, start="earliest")
        sources = set()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            raw = c.poll_raw(200)
            sources |= {info.source for _a, _s, info, _b in raw}
            got += c._to_records(c._to_columns(raw))
    assert "disk" in sources and len(got) == want
    _check(got, sent, topics)


def test_topic_settings_recompress_stamp_append_time_and_bound_the_producer_clock(broker):
    with Admin(broker.bootstrap) as a:
        a.create_topic("zt", 1, config={"compression.type": "zstd"})
        a.create_topic("lat", 1, config={"message.timestamp.type": "LogAppendTime"})
        a.create_topic("ct", 1, config={"message.timestamp.after.max.ms": "60000",
                                        "message.timestamp.before.max.ms": "3600000"})
        info = a.describe_topic("zt").topic.config
        assert info["compression.type"] == "zstd" and info["message.timestamp.type"] == "CreateTime"
        with pytest.raises(Exception, match="one of"):
            a.create_topic("bad", 1, config={"compression.type": "brotli"})
    text = [b"2026-11-27T04:00:%02d INFO request served path=/api/v1/items status=200" % (i % 60) for i in range(2000)]
    with Producer(broker.bootstrap, acks="durable") as p:  # uncompressed v2, and v1 batches, into a zstd topic
        p.send_batch("zt", text, partition=0)
        p.send("lat", b"x", timestamp_ms=5)  # LogAppendTime: the producer's time is not the record's
        now = int(time.time() * 1000)
        p.send("ct", b"ok", timestamp_ms=now - 1000)
        assert p.flush() == 2002
    wire = Wire(broker.bootstrap)
    try:
        ok(wire, [routing(P.Op.PRODUCE, "zt", 0), P.encode(P.ProduceRequest()), encode_batch([b"old"] * 3, version=1)])
    finally:
        wire.close()
    with Consumer(broker.bootstrap, max_wait_ms=100) as c:
        c.assign("zt", start="earliest")
        views = []
        deadline = time.monotonic() + 20
        while sum(v.record_count for v in views) < 2003 and time.monotonic() < deadline:
            for _a, _s, _i, body in c.poll_raw(200):
                views += iter_batches(body.buffer if hasattr(body, "buffer") else body)
        assert {(v.version, v.codec) for v in views} == {(2, codecs.ZSTD)}  # recompressed, the v1 batch converted
        assert sum(len(v.values) for v in views) == sum(map(len, text)) + 9
        c.assign("lat", start="earliest")
        (r,) = [r for r in _drain(c, 1) if r.topic == "lat"]
        assert r.timestamp_type == LOG_APPEND_TIME and abs(r.timestamp - time.time() * 1000) < 60_000
    for ts in (int(time.time() * 1000) + 3_600_000, int(time.time() * 1000) - 7_200_000):  # beyond either bound
        with Producer(broker.bootstrap, acks="memory", retry_backoff_ms=1) as p:
            p.send("ct", b"late-or-early", timestamp_ms=ts)
            with pytest.raises(InvalidTimestampError, match="max.ms"):
                p.flush()


def _bomb() -> bytes:
    """A zstd batch declaring 1,000 bytes whose section inflates to 8 MiB."""
    buf = bytearray(encode_batch([b"x"] * 3, compression=codecs.ZSTD))
    packed = codecs.compress(codecs.ZSTD, bytes(8 << 20))
    body = bytes(packed)
    out = bytearray(buf[:80]) + body
    out += bytes((-len(out)) % 8)
    import struct
    struct.pack_into("<i", out, 0, 80 + len(body))
    struct.pack_into("<i", out, 64, 1000)
    from tailrace.client.records import batch_crc
    struct.pack_into("<I", out, 32, batch_crc(out, 0, 80 + len(body), 2))
    return bytes(out)


def test_hostile_batches_are_refused_and_their_neighbours_stored(broker):
    import struct

    from tailrace.client.records import batch_crc
    wire = Wire(broker.bootstrap)
    try:
        ok(wire, [routing(P.Op.CREATE_TOPIC, "host"), P.encode(P.CreateTopicRequest(3, 0))])
        wrong_codec = bytearray(encode_batch([b"a", b"b"]))
        struct.pack_into("<H", wrong_codec, 54, 6)
        struct.pack_into("<I", wrong_codec, 32, batch_crc(wrong_codec, 0, struct.unpack_from("<i", wrong_codec)[0], 2))
        good = encode_batch([b"fine"] * 2, compression=codecs.LZ4)
        hostile = [(_bomb(), E.MALFORMED), (bytes(wrong_codec), E.MALFORMED), (good[:-8], E.MALFORMED)]
        for frame, code in hostile:
            got, msg = error(wire, [routing(P.Op.PRODUCE, "host", 0), P.encode(P.ProduceRequest()), frame])
            assert got == code, msg
        # In one PRODUCE_MULTI (two partitions of one worker) the bad batch fails alone: its
        # neighbour is stored.
        with Admin(broker.bootstrap) as a:
            owners = {p.partition: p.worker for p in a.describe_topic("host").partitions}
        pa, pb = next((x, y) for x in owners for y in owners if x < y and owners[x] == owners[y])
        req = P.ProduceMultiRequest(partitions=[pa, pb])
        code, reply = wire.ask([routing(P.Op.PRODUCE_MULTI, "host"), P.encode(req), good, _bomb()])
        assert code == E.OK
        outcomes = P.decoder(P.ProduceMultiReply).decode(reply[1]).results
        assert [o.code for o in outcomes] == [E.OK, E.MALFORMED]
    finally:
        wire.close()
    with Consumer(broker.bootstrap, max_wait_ms=100) as c:
        c.assign("host", start="earliest")
        got = _drain(c, 2)
        assert sorted((r.partition, r.value) for r in got) == [(pa, b"fine"), (pa, b"fine")]


def test_a_protocol_version_1_client_reads_v1_batches_and_is_refused_v2_ones(broker):
    wire = Wire(broker.bootstrap)
    try:
        ok(wire, [routing(P.Op.CREATE_TOPIC, "mixed"), P.encode(P.CreateTopicRequest(1, 0))])
        ok(wire, [routing(P.Op.PRODUCE, "mixed", 0), P.encode(P.ProduceRequest()), encode_batch([b"one"], version=1)])
        ok(wire, [routing(P.Op.PRODUCE, "mixed", 0), P.encode(P.ProduceRequest()), encode_batch([b"two"])])

        def fetch(offset: int, version: int, max_records: int = 10):
            head = P.ROUTING.pack(version, P.Op.FETCH, 0, 0, 777 + offset + 10 * version) + b"mixed"
            return wire.ask([head, P.encode(P.FetchRequest(offset=offset, max_records=max_records, max_wait_ms=0))])

        code, reply = fetch(0, 1, max_records=1)  # the v1 batch only: served
        assert code == E.OK and [v.version for v in iter_batches(reply[2])] == [1]
        code, reply = fetch(1, 1)  # the v2 batch: refused, not sent as bytes it cannot read
        assert code == E.UNSUPPORTED_VERSION and b"upgrade the client" in reply[1]
        code, reply = fetch(0, 2)  # this client: both
        assert code == E.OK and [v.version for v in iter_batches(reply[2])] == [1, 2]
        code, _reply = wire.ask([P.ROUTING.pack(3, P.Op.FETCH, 0, 0, 5) + b"mixed", P.encode(P.FetchRequest(offset=0))])
        assert code == E.UNSUPPORTED_VERSION
    finally:
        wire.close()


def test_a_send_written_before_headers_keeps_its_positional_partition(broker):
    """``send(topic, value, key, partition)`` from before headers took the fourth place still
    goes to that partition (blocking and asyncio producers alike)."""
    import asyncio

    from tailrace.aio import AsyncProducer
    with Admin(broker.bootstrap) as a:
        a.create_topic("pos", 3)
    with Producer(broker.bootstrap) as p:
        p.send("pos", b"blocking", None, 2)
        p.flush()

    async def aio():
        async with AsyncProducer(broker.bootstrap) as p:
            await p.send("pos", b"async", None, 1)

    asyncio.run(aio())
    with Consumer(broker.bootstrap, max_wait_ms=100) as c:
        c.assign("pos", start="earliest")
        got = _drain(c, 2)
    assert sorted((r.partition, r.value, r.headers) for r in got) == [(1, b"async", ()), (2, b"blocking", ())]
