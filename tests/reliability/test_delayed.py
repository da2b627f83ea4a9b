"""Delayed delivery with real processes (router/timer.py, client/delayed.py): never early,
within a second of due, across a broker killed -9 and restarted; bad requests refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from tailrace.broker import datadir
from tailrace.client import Admin, Consumer, Producer
from tailrace.client.errors import InvalidRequestError, UnknownTopicError


def drain(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[tuple[int, bytes]]:
    """(arrival ms, value) of records read until ``want`` came or the time is up."""
    got = []
    with Consumer(bootstrap) as c:
        c.assign(topic)
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            for r in c.poll(50):
                got.append((int(time.time() * 1000), r.value))
    return got


def check_on_time(got: list[tuple[int, bytes]]) -> list[int]:
    """Each delayed value is b"due:<ms>": how late each came (ms); never early."""
    late = []
    for arrived, value in got:
        if value.startswith(b"due:"):
            due = int(value[4:].split(b":")[0])
            assert arrived >= due, f"a record due at {due} came {due - arrived} ms early"
            late.append(arrived - due)
    return late


def test_delayed_records_come_at_their_time_never_early_and_others_at_once_and_bad_ones_are_refused(make_broker):
    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("t", 2)
    now = int(time.time() * 1000)
    with Producer(b.bootstrap) as p:
        for i in range(300):
            due = now + 1500 + (i % 3) * 700
            p.send("t", b"due:%d:%d" % (due, i), key=b"k%d" % i, headers=[("h", b"%d" % i)], deliver_at_ms=due)
        for i in range(50):
            p.send("t", b"now:%d" % i)
        p.flush()
    got = drain(b.bootstrap, "t", 350, 10)
    assert len(got) == 350
    assert {v for _t, v in got[:50]} == {b"now:%d" % i for i in range(50)}, "records without a delay are not held back"
    late = check_on_time(got)
    assert len(late) == 300
    assert max(late) < 1000, f"delivered up to {max(late)} ms after due"
    with Consumer(b.bootstrap) as c:
        c.assign("t")
        recs = [r for r in c.poll(500) + c.poll(500) + c.poll(500) if r.value.startswith(b"due:")]
    assert recs and all(dict(r.headers)["h"] == r.value.split(b":")[2] and r.key == b"k" + r.value.split(b":")[2]
                        for r in recs), "key and headers kept"
    with Admin(b.bootstrap) as a:
        a.create_topic("cli", 1)
    sent = int(time.time() * 1000)
    subprocess.run([sys.executable, "-m", "tailrace", "produce", "cli", "--delay", "1.5s", "--bootstrap", b.bootstrap],
                   input=b"one\ntwo\n", capture_output=True, timeout=60, check=True)
    with Producer(b.bootstrap) as p:
        at = (sent // 100 + 16) * 100  # a multiple of the timer's 100 ms (a time between is rounded up)
        reply = p.send_delayed("cli", [b"three", b"four"], partition=0, keys=[b"a", b"b"], deliver_at_ms=at)
    assert (reply.record_count, reply.deliver_at_ms) == (2, at)

    async def send_async():
        from tailrace.aio import AsyncProducer
        async with AsyncProducer(b.bootstrap) as ap:
            return await ap.send_delayed("cli", [b"five"], partition=0, deliver_after_ms=1500)
    assert asyncio.run(send_async()).record_count == 1
    got = drain(b.bootstrap, "cli", 5, 10)
    assert sorted(v for _t, v in got) == [b"five", b"four", b"one", b"three", b"two"]
    assert min(t for t, _v in got) >= sent + 1500, "tailrace produce --delay 1.5s, send_delayed: not before"
    refused_and_nothing_kept(b)


def refused_and_nothing_kept(b) -> None:
    """Too far ahead (past delay_max_ms, 7 days) and to a topic that does not exist: refused."""
    with Admin(b.bootstrap) as a:
        a.create_topic("refused", 1)
    with Producer(b.bootstrap) as p:
        p.send("refused", b"x", deliver_after_ms=8 * 86_400_000)
        with pytest.raises(InvalidRequestError, match="delay_max_ms"):
            p.flush()
    with Producer(b.bootstrap) as p:
        p.send("refused", b"x", partition=0, deliver_after_ms=10)
        p._delayed.groups = {("nope", 0, k[2]): g for k, g in p._delayed.groups.items()}  # as a client naming another topic
        with pytest.raises(UnknownTopicError):
            p.flush()
    assert drain(b.bootstrap, "refused", 1, 1.5) == []


def test_delayed_records_survive_a_broker_killed_and_still_come_on_time(make_broker):
    """Also: a start reads the timer's topic from its floor, past what was already delivered, and
    delivers none of that again."""
    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("t", 2)
        a.create_topic("early", 1)
    with Producer(b.bootstrap) as p:  # delivered and noted done before the kill
        for i in range(50):
            p.send("early", b"e%d" % i, deliver_after_ms=100 + (i % 5) * 100)
    assert len(drain(b.bootstrap, "early", 50, 10)) == 50
    floor = b.data_dir / datadir.TIMER_FLOOR_FILE
    deadline = time.monotonic() + 5
    while not (floor.exists() and int(floor.read_text() or 0) >= 5) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert floor.exists() and int(floor.read_text()) >= 5, "the floor did not move past them"
    due = int(time.time() * 1000) + 9000
    with Producer(b.bootstrap) as p:
        for i in range(200):
            p.send("t", b"due:%d:%d" % (due + (i % 2) * 1000, i), deliver_at_ms=due + (i % 2) * 1000)
        p.flush()  # answered: durable in the timer's topic
    b.hard_kill_all()
    b.start()
    assert int(time.time() * 1000) < due - 500, "the restart took too long for this test to show anything"
    got = drain(b.bootstrap, "t", 200, 20)
    assert sorted(v for _t, v in got) == sorted(b"due:%d:%d" % (due + (i % 2) * 1000, i) for i in range(200)), \
        "every delayed record once (its done record may be lost only with a kill after delivery)"
    late = check_on_time(got)
    assert max(late) < 1000, f"delivered up to {max(late)} ms after due"
    assert sorted(v for _t, v in drain(b.bootstrap, "early", 51, 2)) == sorted(b"e%d" % i for i in range(50))
    ready = (b.data_dir / "logs" / "router.log").read_text().rsplit("timer ready: ", 1)[1].splitlines()[0]
    assert int(ready.split("read back from offset ")[1].split()[0]) >= 5, ready
