"""Share groups with real processes: a member killed -9 holding locks, a poison record, a broker
killed -9 under acknowledgements (router/share.py, client/share.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailrace.client import Admin, Consumer, Producer, ShareConsumer
from tailrace.client import protocol as P
from tailrace.client import share_protocol as S


@pytest.fixture
def broker(module_broker):
    """The first two tests share one broker (their own topics and groups); the kill test has its own."""
    return module_broker


def alter(bootstrap: str, group: str, **config) -> S.ShareGroupInfo:
    with Admin(bootstrap) as a:
        r = a.conn.request(P.Op.ALTER_SHARE_GROUP, group, -1, P.encode(S.AlterShareGroupRequest(
            {k.replace("_", "."): str(v) for k, v in config.items()})))
        return P.decoder(S.ShareGroupInfo).decode(r.header)


def describe(bootstrap: str, group: str) -> S.ShareGroupInfo:
    with Admin(bootstrap) as a:
        return P.decoder(S.ShareGroupInfo).decode(a.conn.request(P.Op.DESCRIBE_SHARE_GROUP, group, -1).header)


def produce(bootstrap: str, topic: str, n: int, partition: int | None = None) -> None:
    with Producer(bootstrap, acks="durable") as p:
        for i in range(n):
            p.send(topic, b"m%06d" % i, partition=partition)
        p.flush()


VICTIM = textwrap.dedent("""
    import sys, time
    from tailrace.client import ShareConsumer
    c = ShareConsumer(sys.argv[1], group="hg", topics=["held"], max_records=150, prefetch=False)  # holds what it printed
    got = []
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        got = c.poll(500)
    print(" ".join(str(r.offset) for r in got), flush=True)
    time.sleep(600)  # holds its locks until killed
""")


def test_a_member_killed_holding_locks_has_its_records_redelivered_and_every_record_is_accepted_once(broker):
    b = broker
    with Admin(b.bootstrap) as a:
        a.create_topic("held", 1)
    alter(b.bootstrap, "hg", share_auto_offset_reset="earliest", share_record_lock_duration_ms=2000)
    produce(b.bootstrap, "held", 1000)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, b.bootstrap], stdout=subprocess.PIPE, text=True)
    try:
        held = [int(x) for x in victim.stdout.readline().split()]
        assert len(held) == 150, held
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait(10)
    killed = time.monotonic()
    accepted: dict[int, int] = {}  # offset -> delivery count when accepted (answered)
    members = [ShareConsumer(b.bootstrap, group="hg", topics=["held"], max_records=100) for _ in range(3)]
    early = set()
    deadline = time.monotonic() + 30
    while len(accepted) < 1000 and time.monotonic() < deadline:
        for c in members:
            recs = c.poll(200)
            for r in recs:
                if r.offset in held and time.monotonic() - killed < 1.5:
                    early.add(r.offset)
                assert r.offset not in accepted, f"offset {r.offset} delivered again after its ACCEPT was answered"
            c.acknowledge(recs)
            assert c.commit_sync() == []
            accepted.update((r.offset, r.delivery_count) for r in recs)
    for c in members:
        c.close()
    assert sorted(accepted) == list(range(1000))
    assert not early, f"the killed member's records came back before its locks ended: {sorted(early)[:5]}"
    assert {accepted[o] for o in held} == {2}, "the killed member's records: delivered twice (it, then a survivor)"
    assert {c for o, c in accepted.items() if o not in held} == {1}, sorted((o, c) for o, c in accepted.items() if c != 1 and o not in held)[:20]
    info = describe(b.bootstrap, "hg")
    assert [(p.start, p.in_flight) for p in info.partitions] == [(1000, 0)]


def test_a_poison_record_reaches_the_dead_letter_topic_after_the_limit_with_its_provenance(broker):
    b = broker
    with Admin(b.bootstrap) as a:
        a.create_topic("jobs", 2)
    alter(b.bootstrap, "g", share_auto_offset_reset="earliest", share_delivery_count_limit=3,
          share_retry_backoff_ms="50,100")
    with Producer(b.bootstrap, acks="durable") as p:
        p.send("jobs", b"ok-1", partition=1)
        p.send("jobs", b"poison", key=b"k", headers=[("trace", b"t1")], partition=1)
        p.send("jobs", b"bad-input", partition=0)
        p.send("jobs", b"ok-2", partition=1)
        p.flush()
    c = ShareConsumer(b.bootstrap, group="g", topics=["jobs"])
    deliveries: dict[bytes, list[int]] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(deliveries.get(b"poison", [])) < 3:
        for r in c.poll(300):
            deliveries.setdefault(r.value, []).append(r.delivery_count)
            if r.value == b"poison":
                c.acknowledge(r, "release", error=f"ValueError: attempt {r.delivery_count}")
            elif r.value == b"bad-input":
                c.acknowledge(r, "reject", error="unparseable")
            else:
                c.acknowledge(r)
    assert c.commit_sync() == []
    assert deliveries[b"poison"] == [1, 2, 3], deliveries
    assert deliveries[b"ok-1"] == deliveries[b"ok-2"] == deliveries[b"bad-input"] == [1]
    assert c.poll(500) == [], "a record past the limit or rejected is never delivered again"
    c.close()
    dead = []
    with Consumer(b.bootstrap) as dlq:
        dlq.assign("g.dlq")
        deadline = time.monotonic() + 10
        while len(dead) < 2 and time.monotonic() < deadline:
            dead.extend(dlq.poll(300))
    by_value = {r.value: r for r in dead}
    assert sorted(by_value) == [b"bad-input", b"poison"]
    poison = by_value[b"poison"]
    assert poison.key == b"k"
    assert dict(poison.headers) == {"trace": b"t1", S.DLQ_TOPIC: b"jobs", S.DLQ_PARTITION: b"1", S.DLQ_OFFSET: b"1",
                                    S.DLQ_COUNT: b"3", S.DLQ_GROUP: b"g", S.DLQ_ERROR: b"ValueError: attempt 3"}
    bad = dict(by_value[b"bad-input"].headers)
    assert (bad[S.DLQ_PARTITION], bad[S.DLQ_OFFSET], bad[S.DLQ_COUNT], bad[S.DLQ_ERROR]) == (b"0", b"0", b"1", b"unparseable")
    assert by_value[b"bad-input"].key is None
    info = describe(b.bootstrap, "g")
    assert {(p.partition, p.start, p.in_flight, p.dead) for p in info.partitions} == {(0, 1, 0, 1), (1, 3, 0, 1)}
    want = {"tailrace_share_deliveries_total": 6.0, "tailrace_share_redeliveries_total": 2.0,
            "tailrace_share_dead_letters_total": 2.0}
    deadline = time.monotonic() + 10
    while (got := scrape(b)) != want and time.monotonic() < deadline:  # the router writes its figures every second
        time.sleep(0.3)
    assert got == want
    with Admin(b.bootstrap) as a:  # a topic deleted and made again under its name: the group starts it afresh
        a.delete_topic("jobs")
        a.create_topic("jobs", 1)
    produce(b.bootstrap, "jobs", 2, partition=0)
    with ShareConsumer(b.bootstrap, group="g", topics=["jobs"]) as c:
        again: list = []
        deadline = time.monotonic() + 15
        while len(again) < 2 and time.monotonic() < deadline:
            recs = c.poll(300)
            again += [(r.offset, r.delivery_count) for r in recs]
            c.acknowledge(recs)
    assert again == [(0, 1), (1, 1)]


def scrape(b) -> dict[str, float]:
    with urllib.request.urlopen(b.metrics_url, timeout=10) as r:
        fams = text_string_to_metric_families(r.read().decode())
    return {s.name: s.value for f in fams for s in f.samples if s.name.startswith("tailrace_share_")
            and s.labels.get("group") == "g" and "partition" not in s.labels}


def test_a_broker_killed_under_acknowledgements_loses_no_answered_accept(make_broker):
    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("jobs", 2)
    alter(b.bootstrap, "g", share_auto_offset_reset="earliest")
    produce(b.bootstrap, "jobs", 2000)
    accepted: set[tuple[int, int]] = set()
    c = ShareConsumer(b.bootstrap, group="g", topics=["jobs"], max_records=200)
    while len(accepted) < 1000:
        recs = c.poll(500)
        c.acknowledge(recs)
        assert c.commit_sync() == []  # answered: durable
        accepted.update((r.partition, r.offset) for r in recs)
    c.poll(500)  # acquired, never acknowledged: these come back after the restart
    b.hard_kill_all()
    b.start()
    again: dict[tuple[int, int], int] = {}
    c2 = ShareConsumer(b.bootstrap, group="g", topics=["jobs"], max_records=500)
    deadline = time.monotonic() + 30
    while len(accepted) + len(again) < 2000 and time.monotonic() < deadline:
        recs = c2.poll(500)
        for r in recs:
            assert (r.partition, r.offset) not in accepted, f"{r.partition}/{r.offset} accepted and answered, delivered again"
            again[(r.partition, r.offset)] = r.delivery_count
        c2.acknowledge(recs)
    assert c2.commit_sync() == []
    c2.close()
    assert len(accepted) + len(again) == 2000
    assert max(again.values()) <= 2
