"""Seek by time with real processes: LIST_OFFSETS by timestamp (Kafka's meaning: the earliest
offset appended at or after T), through the indexed journal and through the ring when the
flusher has not written the newest batches yet; Consumer.offsets_for_times / seek_to_time, the
asyncio consumer, and ``tailrace consume --from-time``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.aio import AsyncConsumer
from tailrace.client.consumer import OffsetAndTimestamp
from tailrace.client.errors import InvalidRequestError

BATCH = 50


def _now_ms() -> int:
    time.sleep(0.003)  # the batch before is appended at least a millisecond before this
    t = int(time.time() * 1000)
    time.sleep(0.003)  # and the batch after at least a millisecond after it
    return t


def test_offsets_for_times_index_and_ring_and_seek(broker):
    with Admin(broker.bootstrap) as a:
        a.create_topic("tt", 2)
    marks = []  # T_i: taken before batch i of each partition (offsets BATCH*i ...)
    with Producer(broker.bootstrap, acks="durable", linger_ms=0, batch_records=BATCH) as p:
        for i in range(5):
            marks.append(_now_ms())
            for part in (0, 1):
                p.send_batch("tt", [b"%d-%d-%d" % (part, i, j) for j in range(BATCH)], partition=part)
            assert p.flush() == (i + 1) * 2 * BATCH
    later = _now_ms()
    with Consumer(broker.bootstrap, max_wait_ms=100) as c:
        got = c.offsets_for_times({("tt", 0): marks[1], ("tt", 1): marks[3]})  # two times: two questions
        assert (got[("tt", 0)].offset, got[("tt", 1)].offset) == (BATCH, 3 * BATCH)
        for i, t in enumerate(marks):
            for part in (0, 1):
                found = c.offsets_for_times({("tt", part): t})[("tt", part)]
                assert isinstance(found, OffsetAndTimestamp)
                assert found.offset == BATCH * i and found.timestamp_ms >= t, (i, part, found)
                if i:
                    assert found.timestamp_ms > marks[i - 1]
        assert c.offsets_for_times({("tt", 0): 0})[("tt", 0)].offset == 0
        assert c.offsets_for_times({("tt", 1): later}) == {("tt", 1): None}  # every record is older
        with pytest.raises(InvalidRequestError):
            c.offsets_for_times({("tt", 0): -1})

        c.assign("tt", start="earliest")
        assert c.seek_to_time("tt", marks[3]) == {0: 3 * BATCH, 1: 3 * BATCH}
        first = {}
        deadline = time.monotonic() + 10
        while len(first) < 2 and time.monotonic() < deadline:
            for r in c.poll(200):
                first.setdefault(r.partition, r)
        assert {p: (r.offset, r.value) for p, r in first.items()} == {p: (3 * BATCH, b"%d-3-0" % p) for p in (0, 1)}
        assert c.seek_to_time("tt", later) == {0: 5 * BATCH, 1: 5 * BATCH}  # nothing that recent: the end

    # The ring: with the flusher stopped, the newest batch is acked in memory and not indexed.
    flusher = broker.pids()["flusher"]
    os.kill(flusher, signal.SIGSTOP)
    try:
        t5 = _now_ms()
        with Producer(broker.bootstrap, acks="memory", linger_ms=0) as p:
            p.send_batch("tt", [b"ring-%d" % j for j in range(BATCH)], partition=1)
            assert p.flush() == BATCH
        with Admin(broker.bootstrap) as a:
            po = a.list_offsets("tt", t5)[1]
            assert po.high_watermark == 6 * BATCH and po.durable_watermark == 5 * BATCH  # not flushed
            assert po.time_offset == 5 * BATCH and po.time_timestamp_ms >= t5
            assert a.list_offsets("tt", t5)[0].time_offset == -1
            assert a.list_offsets("tt", marks[4])[1].time_offset == 4 * BATCH  # the index still answers first
    finally:
        os.kill(flusher, signal.SIGCONT)

    async def from_async():
        async with AsyncConsumer(broker.bootstrap) as ac:
            got = await ac.offsets_for_times({("tt", 0): marks[2], ("tt", 1): t5})
            await ac.assign("tt", start="earliest")
            moved = await ac.seek_to_time("tt", marks[1])
            return got, moved

    got, moved = asyncio.run(from_async())
    assert got[("tt", 0)].offset == 2 * BATCH and got[("tt", 1)].offset == 5 * BATCH
    assert moved == {0: BATCH, 1: BATCH}

    # the command line: ISO 8601 (UTC, with milliseconds) or ms since the epoch
    iso = datetime.fromtimestamp(marks[2] / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for when in (iso, str(marks[2])):
        out = subprocess.run([sys.executable, "-m", "tailrace", "consume", "tt", "--bootstrap", broker.bootstrap,
                              "--partition", "0", "--from-time", when, "--max", "2", "--print-offset", "--timeout-ms", "5000"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [f"Offset:{2 * BATCH}", "0-2-0", f"Offset:{2 * BATCH + 1}", "0-2-1"], out.stdout
    bad = subprocess.run([sys.executable, "-m", "tailrace", "consume", "tt", "--bootstrap", broker.bootstrap,
                          "--from-time", "yesterday"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_a_records_timestamp_is_the_producers_create_time_and_lookups_use_the_running_max(make_broker):
    """What README, DESIGN.md and SPARK.md say: ``Record.timestamp`` (and ``CreateTime:``, the
    Spark column) is the create time the producer put in the batch; ``offsets_for_times`` is
    over the partition's running largest record time (a version 1 batch's: its append time). A
    batch created "in 2001" after one created "in 2010" is not found by a 2005 lookup: the
    2010 batch is (Kafka's answer); a version 1 batch appended now is found by a 2017 lookup."""
    from tailrace.client import protocol as P
    from tailrace.client.connection import Connection
    from tailrace.client.records import encode_batch

    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("stamped", 1)
    y2010, y2001 = 1_262_304_000_000, 1_000_000_000_000
    conn = Connection(b.bootstrap)
    for value, ms, version in ((b"2010 clock", y2010, 2), (b"2001 clock", y2001, 2), (b"v1 batch", y2001, 1)):
        conn.request(P.Op.PRODUCE, "stamped", 0, P.encode(P.ProduceRequest(acks=P.Acks.MEMORY)),
                     encode_batch([value], create_time_us=ms * 1000, version=version))
    conn.close()
    before_append_ms = _now_ms() - 60_000
    with Consumer(b.bootstrap, max_wait_ms=200) as c:
        c.assign("stamped", start="earliest")
        records = c.poll(5000)
        assert [(r.value, r.timestamp) for r in records] == [(b"2010 clock", y2010), (b"2001 clock", y2001),
                                                              (b"v1 batch", y2001)]
        got = c.offsets_for_times({("stamped", 0): 1_100_000_000_000})[("stamped", 0)]  # 2004: the 2010 batch
        assert got is not None and (got.offset, got.timestamp_ms) == (0, y2010), got
        found = c.offsets_for_times({("stamped", 0): 1_500_000_000_000})[("stamped", 0)]  # 2017: the v1 batch
        assert found is not None and found.offset == 2 and found.timestamp_ms >= before_append_ms, found