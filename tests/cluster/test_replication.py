"""Replicas (issue 34, first part): a topic's partitions on ``replication_factor`` distinct
brokers, and followers that pull the leader's batches into their own logs, as the leader stored
them, and pick up where their own log ends after a kill -9.

Three real brokers on one real etcd, on loopback (tests/cluster/harness.py). A follower's copy is
read through its worker's own endpoint (the router answers clients for the partitions it leads
only): every batch as the leader's, but for the topic id its stamp carries (each broker's own)."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest

from tailrace.client import protocol as P
from tailrace.client.admin import Admin
from tailrace.client.connection import Connection
from tailrace.client.consumer import Consumer
from tailrace.client.errors import InvalidRequestError, NotEnoughReplicasError
from tailrace.client.producer import Producer
from tailrace.client.records import LENGTH, STAMP_AT, align8
from tailrace.cluster.metadata import read_assignments

from ..helpers import hard_kill_all
from .conftest import wait_until
from .test_cluster_cli import status_json, tailrace
from .harness import cluster_fixture

_fetch_reply = P.decoder(P.FetchReply)
TOPIC_ID_AT = STAMP_AT + 20  # STAMP = base_offset, append_time_us, partition, topic_id


@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


def read_copy(broker, topic: str, partition: int) -> tuple[bytes, int]:
    """Every batch of ``partition`` as ``broker``'s worker holds it (its topic ids zeroed), and
    the log end it reports ((b"", -1) while that worker does not serve it)."""
    out, offset = [], 0
    conn = Connection(broker.settings.worker_endpoint(0), 5000)
    try:
        while True:
            r = conn.wait_for(conn.send(P.Op.FETCH, topic, partition, P.encode(P.FetchRequest(offset, 1 << 20))), 5000)
            if r.code != P.ErrorCode.OK:  # not adopted there yet (NOT_OWNER), or starting
                return b"", -1
            reply = _fetch_reply.decode(r.header)
            body = bytearray(r.body or b"")
            at = 0
            while at < len(body):  # one step per batch
                body[at + TOPIC_ID_AT:at + TOPIC_ID_AT + 4] = b"\0\0\0\0"
                at += align8(LENGTH.unpack_from(body, at)[0])
            out.append(bytes(body))
            if reply.next_offset >= reply.high_watermark or not body:
                return b"".join(out), reply.high_watermark
            offset = reply.next_offset
    finally:
        conn.close()


def copies_match(c, topic: str, partitions: int, want: int) -> bool:
    current, _ = read_assignments(c.etcd, c.keys, topic)
    for p in range(partitions):
        a = current[(topic, p)][0]
        leader_bytes, end = read_copy(c.brokers[a.leader], topic, p)
        if end != want:
            return False
        for b in a.replicas:
            if b != a.leader and read_copy(c.brokers[b], topic, p) != (leader_bytes, end):
                return False
    return True


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: bytes) -> int:
    with Producer(bootstrap, acks="durable") as p:
        for i in range(per_partition * partitions):
            p.send(topic, tag + b"%d" % i, partition=i % partitions, headers=[("n", b"%d" % i)] if i % 3 == 0 else None)
        return p.flush(30_000)


def test_replicas_on_distinct_brokers_copy_the_leader_s_batches_and_catch_up_after_a_kill(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint, replica_lag_time_max_ms=1500)
    r = tailrace("topic", "create", "copies", "--partitions", "3", "--replication-factor", "3",
                 "--bootstrap", c.bootstrap(1))  # through any broker: the CLI follows NOT_CONTROLLER
    assert r.returncode == 0 and "3 partitions, 3 replicas each" in r.stdout, (r.stdout, r.stderr)
    with Admin(c.bootstrap(1)) as a:
        with pytest.raises(InvalidRequestError, match="replication_factor=4 .* needs 4 live brokers"):
            a.create_topic("toomany", 1, replication_factor=4)
        a.create_topic("single", 2, replication_factor=1)
    current, _ = read_assignments(c.etcd, c.keys, "copies")
    assigned = [current[("copies", p)][0] for p in range(3)]
    for a in assigned:
        assert sorted(a.replicas) == [0, 1, 2] and a.isr == a.replicas and a.leader == a.replicas[0]
    assert sorted(a.leader for a in assigned) == [0, 1, 2], "leaders spread one per broker"
    single, _ = read_assignments(c.etcd, c.keys, "single")
    assert [len(a.replicas) for a, _ in single.values()] == [1, 1]
    # any broker describes replicas and ISR
    def described():
        with Admin(c.bootstrap(2)) as a:
            d = a.describe_topic("copies")
        return d if [p.replicas for p in d.partitions] == [a.replicas for a in assigned] else None
    d = wait_until(described, 10)
    assert d and d.topic.replication_factor == 3 and [p.isr for p in d.partitions] == [a.isr for a in assigned]
    r = tailrace("topic", "describe", "copies", "--bootstrap", c.bootstrap(2))
    assert r.returncode == 0 and "replication factor 3" in r.stdout, (r.stdout, r.stderr)
    for a in assigned:  # Kafka's Leader, Replicas and Isr columns
        line = next(x for x in r.stdout.splitlines() if x.split() and x.split()[0] == str(a.partition))
        assert ",".join(map(str, a.replicas)) in line and str(a.leader) in line, line

    assert produce(c.bootstrap(0), "copies", 3, 200, b"first") == 600
    for a in assigned:  # acks=durable on a replicated partition: synced on every in-sync replica when answered
        short = [b for b in a.replicas if read_copy(c.brokers[b], "copies", a.partition)[1] != 200]
        assert not short, f"partition {a.partition}: brokers {short} lacked durable records when they were acknowledged"
    assert wait_until(lambda: copies_match(c, "copies", 3, 200), 20), "followers did not copy the leaders' batches"
    st = c.status(0)["cluster"]["replication"]
    assert st["following"] == 2 and st["records_copied"] == 400 and st["not_copying"] == []

    # a follower killed with everything of it misses records (durable acks wait until it has left the
    # ISR, replica.lag.time.max.ms later), and takes them from its own log end when back
    victim = next(a.replicas[1] for a in assigned if c.controller()[0] != a.replicas[1])
    hard_kill_all(c.brokers[victim])
    kept = [a.partition for a in assigned if a.leader != victim]
    with Producer(c.bootstrap(next(b for b in range(3) if b != victim)), acks="durable") as p:
        for i in range(300):
            p.send("copies", b"second%d" % i, partition=kept[i % len(kept)])
        assert p.flush(30_000) == 300
    c.brokers[victim].spawn()
    c.brokers[victim].wait_ready(90)
    # its own partition failed over to an in-sync follower and comes back to it (preferred leader); every copy catches up
    assert wait_until(lambda: all(c.leaders("copies")[p] >= 0 for p in range(3)), 30)
    ends = {p: 200 + 300 // len(kept) if p in kept else 200 for p in range(3)}

    def caught_up():
        current, _ = read_assignments(c.etcd, c.keys, "copies")
        for p in range(3):
            a = current[("copies", p)][0]
            want = read_copy(c.brokers[a.leader], "copies", p)
            if want[1] != ends[p] or any(read_copy(c.brokers[b], "copies", p) != want for b in a.replicas):
                return False
        return True
    assert wait_until(caught_up, 30), "the restarted follower did not catch up from its own log end"
    with Admin(c.bootstrap(1)) as a:  # a cluster of 3 live brokers: a topic has 3 replicas by default
        assert a.create_topic("default", 1).replication_factor == 3


def isr_of(c, topic: str, partition: int) -> list[int]:
    current, _ = read_assignments(c.etcd, c.keys, topic)
    return sorted(current[(topic, partition)][0].isr)


def consumed(bootstrap: str, topic: str, seconds: float) -> list:
    with Consumer(bootstrap, max_wait_ms=100) as c:
        c.assign(topic, start="earliest")
        got, until = [], time.monotonic() + seconds
        while time.monotonic() < until:
            got += c.poll(100)
        return got


def send_all(bootstrap: str, acks: str, tag: bytes, n: int) -> int:
    """``n`` records ``tag0``, ``tag1``... to partition 0 of topic ``all``; how many were acknowledged."""
    with Producer(bootstrap, acks=acks) as p:
        for i in range(n):
            p.send("all", tag + b"%d" % i, partition=0)
        return p.flush(20_000)


def metrics(c, b: int) -> str:
    with urllib.request.urlopen(c.brokers[b].metrics_url, timeout=10) as r:
        return r.read().decode()


def test_acks_all_waits_for_the_isr_consumers_stop_at_the_high_watermark_and_the_isr_shrinks_and_grows(
        make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint, replica_lag_time_max_ms=1500)
    with Admin(c.bootstrap(0)) as a:
        a.create_topic("all", 1, replication_factor=3)  # min.insync.replicas: 2 by default
    current, _ = read_assignments(c.etcd, c.keys, "all")
    leader = current[("all", 0)][0].leader
    controller = c.controller()[0]
    followers = [b for b in range(3) if b != leader]
    followers.sort(key=lambda b: b == controller)  # the first one stopped is not the controller if it can be helped
    boot = c.bootstrap(leader)
    # acks=all: once acknowledged, every in-sync replica holds the records (no waiting here)
    assert send_all(boot, "all", b"a", 100) == 100
    leader_copy = read_copy(c.brokers[leader], "all", 0)
    assert leader_copy[1] == 100
    for b in followers:
        assert read_copy(c.brokers[b], "all", 0) == leader_copy, f"broker {b} lacks acknowledged records"

    # one follower stops fetching (its router paused): the high watermark stays where the ISR is,
    # so what the leader alone holds is not served ...
    paused = c.brokers[followers[0]].pids()["router"]
    os.kill(paused, signal.SIGSTOP)
    try:
        assert send_all(boot, "memory", b"m", 10) == 10
        seen = consumed(boot, "all", 0.3)
        with Admin(boot) as a:
            listed = a.list_offsets("all")[0].high_watermark
        assert (len(seen), listed) == (100, 100) or isr_of(c, "all", 0) == sorted([leader, followers[1]]), \
            f"{len(seen)} records served, high watermark {listed}, past the ISR's while it was {isr_of(c, 'all', 0)}"
        # ... until the follower has lagged replica.lag.time.max.ms: it leaves the ISR, and acks=all
        # and reads go on with the two left (min.insync.replicas=2)
        assert wait_until(lambda: isr_of(c, "all", 0) == sorted([leader, followers[1]]), 15), isr_of(c, "all", 0)
        assert wait_until(lambda: 'tailrace_replica_under_replicated{partition="0",topic="all"} 1.0' in metrics(c, leader), 10), \
            metrics(c, leader)
        doc = status_json(etcd_server.endpoint, c.name)  # `tailrace cluster status`: Kafka's under-replicated partitions
        assert [(u["topic"], u["partition"], sorted(u["isr"])) for u in doc["under_replicated"]] == \
            [("all", 0, sorted([leader, followers[1]]))], doc["under_replicated"]
        assert send_all(boot, "all", b"b", 50) == 50
        assert len(consumed(boot, "all", 1.0)) == 160
        # a second follower gone: fewer in-sync replicas than min.insync.replicas, acks=all refused
        os.kill(c.brokers[followers[1]].pids()["router"], signal.SIGSTOP)
        try:
            assert wait_until(lambda: isr_of(c, "all", 0) == [leader], 15), isr_of(c, "all", 0)
            with Producer(boot, acks="all", delivery_timeout_ms=1500) as p:
                p.send("all", b"refused", partition=0)
                with pytest.raises(NotEnoughReplicasError, match="fewer than min.insync.replicas=2"):
                    p.flush(10_000)
        finally:
            os.kill(c.brokers[followers[1]].pids()["router"], signal.SIGCONT)
    finally:
        os.kill(paused, signal.SIGCONT)
    # both back: they catch up from where they stopped and rejoin the ISR
    assert wait_until(lambda: isr_of(c, "all", 0) == [0, 1, 2], 30), isr_of(c, "all", 0)
    assert send_all(boot, "all", b"c", 20) == 20
    leader_copy = read_copy(c.brokers[leader], "all", 0)
    assert leader_copy[1] == 180
    # the metrics: the leader's ISR size, each follower's lag (none now), the leader changes seen
    assert wait_until(lambda: 'tailrace_replica_isr_size{partition="0",topic="all"} 3.0' in metrics(c, leader), 10)
    for b in followers:
        assert wait_until(lambda b=b: 'tailrace_replica_follower_lag_records{partition="0",topic="all"} 0.0'
                          in metrics(c, b), 10), metrics(c, b)
    for b in range(3):  # any broker lists the leader's high watermark
        with Admin(c.bootstrap(b)) as a:
            assert wait_until(lambda: a.list_offsets("all")[0].high_watermark == 180, 5)
    for b in followers:
        assert read_copy(c.brokers[b], "all", 0) == leader_copy
    values = [r.value for r in consumed(boot, "all", 1.0)]
    assert values == ([b"a%d" % i for i in range(100)] + [b"m%d" % i for i in range(10)] + [b"b%d" % i for i in range(50)]
                      + [b"c%d" % i for i in range(20)])
