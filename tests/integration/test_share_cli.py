"""Share groups from the client and the command line, against a real broker: the admin calls
(blocking and asyncio), two asyncio members sharing a topic, ``consume --share-group`` (a broken
pipe with ``--reject-on-error`` dead-letters the record it could not write), ``share-groups
list|describe|alter`` and ``dlq replay`` (tailrace/share_commands.py, client/aio_share.py).

One broker for the module; every test has its own topic and group.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from tailrace.aio import AsyncAdmin, AsyncShareConsumer
from tailrace.bench.launcher import Broker
from tailrace.client import Admin, Consumer, Producer, ShareConsumer
from tailrace.client import share_protocol as S
from tailrace.client.errors import InvalidRequestError, TailraceError, UnknownGroupError

FAST = {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "5000"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("share-cli") / "data", workers=1, segment_bytes=8 << 20,
               shm_budget_bytes=256 << 20)
    b.start()
    yield b
    b.stop()
    left = b.shm_regions()
    b.cleanup_shm()
    assert not left, f"shared memory left after a clean stop: {left}"


def run(b: Broker, *argv: str, stdout=subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "TAILRACE_BOOTSTRAP": b.bootstrap}
    r = subprocess.run([sys.executable, "-m", "tailrace", *argv], stdout=stdout, stderr=subprocess.PIPE, env=env,
                       timeout=timeout)
    assert b"Traceback" not in (r.stdout or b"") + r.stderr, r.stderr.decode(errors="replace")
    return r


def setup(b: Broker, topic: str, group: str, values: list[bytes], partitions: int = 1, **extra) -> None:
    """The topic with ``values`` in it (value i in partition i % partitions, key k<i>, header h=<i>),
    and the group reading it from the start."""
    with Admin(b.bootstrap) as a:
        a.create_topic(topic, partitions)
        a.alter_share_group(group, {**FAST, **extra})
    with Producer(b.bootstrap, acks="durable") as p:
        for i, v in enumerate(values):
            p.send(topic, v, key=b"k%d" % i, headers=[("h", b"%d" % i)], partition=i % partitions)
        p.flush()


def read_all(b: Broker, topic: str, within_s: float = 15.0, want: int = 1) -> list:
    """Every record of ``topic``: waiting for it to exist and to hold ``want``, then 0.3 s more
    (so one too many shows)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with Consumer(b.bootstrap, max_wait_ms=100) as c:
                c.assign(topic, start="earliest")
                got = []
                while len(got) < want and time.monotonic() < deadline:
                    got += c.poll(100)
                return got + c.poll(300)
        except TailraceError:  # not made yet (a dead-letter topic comes with its first record)
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def test_admin_lists_describes_and_alters_share_groups_blocking_and_async(broker):
    with Admin(broker.bootstrap) as a:
        info = a.alter_share_group("adm", {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"})
        assert isinstance(info, S.ShareGroupInfo) and info.group == "adm"
        assert info.config["share.auto.offset.reset"] == "earliest" and info.config["share.delivery.count.limit"] == "3"
        assert info.dlq_topic == "adm.dlq" and info.members == [] and info.partitions == []
        assert "adm" in a.list_share_groups()
        assert a.describe_share_group("adm").config == info.config
        reset = a.alter_share_group("adm", {"share.delivery.count.limit": ""})  # "" resets to the default
        assert reset.config["share.delivery.count.limit"] != "3" and reset.config["share.auto.offset.reset"] == "earliest"
        with pytest.raises(UnknownGroupError):
            a.describe_share_group("never-made")
        with pytest.raises(InvalidRequestError):
            a.alter_share_group("adm", {"share.no.such.setting": "1"})

    async def main():
        async with AsyncAdmin(broker.bootstrap) as a:
            info = await a.alter_share_group("adm-aio", {"share.dlq.topic": "none"})
            assert info.dlq_topic == "" and info.config["share.dlq.topic"] == "none"
            assert {"adm", "adm-aio"} <= set(await a.list_share_groups())
            assert (await a.describe_share_group("adm-aio")).group == "adm-aio"
            with pytest.raises(UnknownGroupError):
                await a.describe_share_group("never-made")

    asyncio.run(main())


def test_two_async_members_share_a_topic_and_every_record_is_accepted_once(broker):
    n = 300
    setup(broker, "aio-jobs", "aio-g", [b"v%d" % i for i in range(n)], partitions=2)
    seen: dict[tuple[int, int], str] = {}

    async def member(name: str, implicit: bool):
        async with AsyncShareConsumer(broker.bootstrap, group="aio-g", topics=["aio-jobs"], max_records=25,
                                      implicit=implicit) as c:
            deadline = time.monotonic() + 20
            while len(seen) < n and time.monotonic() < deadline:
                records = await c.poll(200)
                for r in records:
                    assert (r.partition, r.offset) not in seen, f"{r} delivered twice"
                    assert r.delivery_count == 1 and r.value == b"v%d" % (r.offset * 2 + r.partition)
                    seen[(r.partition, r.offset)] = name
                if not implicit:  # the other accepts at its next poll by itself
                    c.acknowledge(records)
                    if records and len(seen) % 2:
                        assert await c.commit_sync() == []
                await asyncio.sleep(0)
            assert c.failed == []

    async def main():
        await asyncio.gather(member("a", False), member("b", True))

    asyncio.run(main())
    assert len(seen) == n
    assert set(seen.values()) == {"a", "b"}, "both members got records"
    with Admin(broker.bootstrap) as a:
        info = a.describe_share_group("aio-g")
    assert info.members == []  # both left at close
    assert [(p.partition, p.start, p.in_flight, p.dead) for p in info.partitions] == [(0, n // 2, 0, 0), (1, n // 2, 0, 0)]


def test_consume_share_group_prints_each_record_and_accepts_it(broker):
    setup(broker, "cs-jobs", "cs-g", [b"a", b"b", b"c", b"d"])
    r = run(broker, "consume", "cs-jobs", "--share-group", "cs-g", "--max", "3", "--print-offset", "--timeout-ms", "5000")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == ["Offset:0\ta", "Offset:1\tb", "Offset:2\tc"]
    # the fourth was never acquired (--max asks for no more); it is the next one's, then nothing is left
    r = run(broker, "consume", "cs-jobs", "--share-group", "cs-g", "--json", "--timeout-ms", "1500")
    assert r.returncode == 0, r.stderr
    assert [(j["offset"], j["value"], j["key"]) for j in map(json.loads, r.stdout.splitlines())] == [(3, "d", "k3")]
    with Admin(broker.bootstrap) as a:
        (p,) = a.describe_share_group("cs-g").partitions
    assert (p.start, p.end, p.in_flight) == (4, 4, 0), p
    r = run(broker, "consume", "cs-jobs", "--share-group", "cs-g", "--from", "latest")
    assert r.returncode == 2 and b"--from" in r.stderr, r.stderr


def consume_into_a_broken_pipe(b: Broker, *argv: str) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written: the first write is EPIPE
    try:
        return run(b, "consume", *argv, "--timeout-ms", "5000", stdout=write)
    finally:
        os.close(write)


def test_a_broken_pipe_with_reject_on_error_dead_letters_the_record_it_could_not_write(broker):
    setup(broker, "bp-jobs", "bp-g", [b"first", b"second", b"third"])
    r = consume_into_a_broken_pipe(broker, "bp-jobs", "--share-group", "bp-g", "--reject-on-error")
    assert r.returncode == 0, r.stderr  # as consume exits on a broken pipe
    (dead,) = read_all(broker, "bp-g.dlq")
    assert (dead.value, dead.key) == (b"first", b"k0")
    h = dict(dead.headers)
    assert (h["h"], h[S.DLQ_TOPIC], h[S.DLQ_PARTITION], h[S.DLQ_OFFSET], h[S.DLQ_GROUP]) == (b"0", b"bp-jobs", b"0", b"0", b"bp-g")
    assert b"Broken pipe" in h[S.DLQ_ERROR], h
    # without --reject-on-error the record it could not write is released, as is what it fetched
    # after it: the next member prints them
    r = consume_into_a_broken_pipe(broker, "bp-jobs", "--share-group", "bp-g")
    assert r.returncode == 0, r.stderr
    r = run(broker, "consume", "bp-jobs", "--share-group", "bp-g", "--timeout-ms", "1500", "--format", "%v %o")
    assert r.stdout.splitlines() == [b"second 1", b"third 2"], r
    r = run(broker, "share-groups", "describe", "bp-g", "--json")
    doc = json.loads(r.stdout)
    (p,) = doc["partitions"]
    assert (doc["dlq_topic"], doc["dlq_records"], p["start"], p["in_flight"], p["dead"]) == ("bp-g.dlq", 1, 3, 0, 1), doc


def test_share_groups_list_describe_and_alter(broker):
    r = run(broker, "share-groups", "alter", "cli-g", "--config", "share.auto.offset.reset=earliest",
            "share.record.lock.duration.ms=60000", "--config", "share.delivery.count.limit=2")
    assert r.returncode == 0, r.stderr
    assert b"share.delivery.count.limit=2" in r.stdout and b"share.record.lock.duration.ms=60000" in r.stdout, r.stdout
    setup(broker, "cli-jobs", "cli-g", [b"x", b"y", b"z"])
    with ShareConsumer(broker.bootstrap, group="cli-g", topics=["cli-jobs"], max_records=2, prefetch=False) as c:
        held = []
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            held = c.poll(500)
        assert len(held) == 2
        r = run(broker, "share-groups", "describe", "cli-g")
        assert r.returncode == 0, r.stderr
        text = r.stdout.decode()
        for words in ("share group cli-g: 1 members, dead letters to cli-g.dlq (0 so far)", "in flight", "acquired",
                      "available", "deliveries", "cli-jobs", "1:2", c.member_id[:12], "share.delivery.count.limit=2"):
            assert words in text, (words, text)
        doc = json.loads(run(broker, "share-groups", "describe", "cli-g", "--json").stdout)
        (p,) = doc["partitions"]
        assert {k: p[k] for k in ("topic", "partition", "start", "end", "in_flight", "acquired", "available")} == {
            "topic": "cli-jobs", "partition": 0, "start": 0, "end": 3, "in_flight": 3, "acquired": 2, "available": 1}, p
        assert p["delivery_histogram"] == [1, 2] and doc["members"][0]["acquired"] == 2, doc
        c.acknowledge(held)
    r = run(broker, "share-groups", "list")
    assert r.returncode == 0 and b"cli-g" in r.stdout, r
    assert "cli-g" in json.loads(run(broker, "share-groups", "list", "--json").stdout)
    r = run(broker, "share-groups", "alter", "cli-g", "--config", "share.delivery.count.limit=", "--json")
    assert json.loads(r.stdout)["config"]["share.delivery.count.limit"] != "2", r.stdout
    r = run(broker, "share-groups", "alter", "cli-g", "--config", "share.bogus=1")
    assert r.returncode == 1 and b"INVALID_REQUEST" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    r = run(broker, "share-groups", "describe", "nope")
    assert r.returncode == 1 and b"UNKNOWN_GROUP" in r.stderr, r.stderr
    r = run(broker, "share-groups", "alter", "cli-g", "--config", "novalue")
    assert r.returncode == 2, r.stderr


def test_dlq_replay_puts_a_rejected_record_back_once(broker):
    setup(broker, "rp-jobs", "rp-g", [b"ok", b"poison", b"ok2"], partitions=2)  # poison: partition 1, offset 0
    with ShareConsumer(broker.bootstrap, group="rp-g", topics=["rp-jobs"]) as c:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            for r in c.poll(300):
                got.append(r)
                c.acknowledge(r, "reject" if r.value == b"poison" else "accept", error="bad input" if r.value == b"poison" else "")
        assert len(got) == 3
    (dead,) = read_all(broker, "rp-g.dlq")
    h = dict(dead.headers)
    assert (dead.value, h[S.DLQ_TOPIC], h[S.DLQ_PARTITION], h[S.DLQ_ERROR]) == (b"poison", b"rp-jobs", b"1", b"bad input")

    r = run(broker, "dlq", "replay", "rp-g.dlq", "--dry-run")
    assert r.returncode == 0 and b"would replay rp-g.dlq/0@0 -> rp-jobs/1" in r.stdout, r
    r = run(broker, "dlq", "replay", "rp-g.dlq", "--max-messages", "5")
    assert r.returncode == 0 and b"replayed 1 records (1 to rp-jobs)" in r.stdout, r
    back = [x for x in read_all(broker, "rp-jobs", want=4) if x.partition == 1]
    assert [(x.offset, x.key, x.value, [tuple(h) for h in x.headers]) for x in back] == [
        (0, b"k1", b"poison", [("h", b"1")]), (1, b"k1", b"poison", [("h", b"1")])], back
    r = run(broker, "dlq", "replay", "rp-g.dlq")
    assert r.returncode == 0 and b"nothing to replay" in r.stdout, r
    assert len(read_all(broker, "rp-jobs", want=4)) == 4  # nothing replayed twice
    # the group sees the replayed record as a new one and accepts it
    with ShareConsumer(broker.bootstrap, group="rp-g", topics=["rp-jobs"]) as c:
        again = []
        deadline = time.monotonic() + 10
        while not again and time.monotonic() < deadline:
            again = c.poll(300)
            c.acknowledge(again)
    assert [(x.partition, x.offset, x.value) for x in again] == [(1, 1, b"poison")]
