"""Three real brokers (each ``tailrace serve`` with its own data directory, ports and supervisord)
on one real etcd, on loopback: topics spread over the brokers, produce and consume through any
of them, and the faults the cluster issue names: a broker killed with everything of it, the
controller killed, the controller paused past its lease, etcd stopped. Every topic here has one
replica, stated (a cluster's default is 3): what a lost broker does to partitions of one copy is
what these tests show; replicas and failover are tests/cluster/test_replication.py's and
test_failover.py's.

Every broker is stopped by pid at teardown (bench/launcher.py), etcd too (conftest.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tailrace.broker.catalog import Catalog
from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer
from tailrace.client.errors import MetadataUnavailableError, NotLeaderOrFollowerError, TailraceError, TopicExistsError
from tailrace.client.producer import Producer
from tailrace.cluster.metadata import NO_LEADER, read_assignments

from ..helpers import hard_kill_all
from .conftest import wait_until
from .harness import TTL_S, cluster_fixture



@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: bytes = b"v") -> int:
    with Producer(bootstrap, acks="durable") as p:
        for i in range(per_partition * partitions):
            p.send(topic, tag + b"%d" % i, partition=i % partitions)
        return p.flush(30_000)


def consume_all(bootstrap: str, topic: str, want: int, timeout_s: float = 30.0) -> list:
    c = Consumer(bootstrap)
    try:
        c.assign(topic)
        got: list = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            got += c.poll(500)
        return got
    finally:
        c.close()


def test_topics_spread_over_brokers_and_any_broker_serves_them(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint)
    with Admin(c.bootstrap(1)) as a:  # broker 1 may not be the controller: the admin follows NOT_CONTROLLER
        info = a.create_topic("spread", 6, replication_factor=1)
    assert info.partitions == 6
    leaders = c.leaders("spread")
    assert sorted(leaders) == list(range(6))
    assert sorted(set(leaders.values())) == [0, 1, 2], leaders  # two partitions on each broker
    # every broker describes the whole topic with the same leaders, once its watch has the topic
    for i in range(3):
        def described(i=i):
            with Admin(c.bootstrap(i)) as a:
                try:
                    d = a.describe_topic("spread")
                except TailraceError:
                    return None
            return d if {p.partition: p.leader for p in d.partitions} == leaders else None
        d = wait_until(described, 10)
        assert d, f"broker {i} does not describe the topic's leaders"
        assert d.broker_id == i
        for p in d.partitions:
            assert (p.leader_endpoint == "") == (p.leader == i)
    assert produce(c.bootstrap(0), "spread", 6, 100) == 600
    for i in range(3):
        with Admin(c.bootstrap(i)) as a:
            assert [o.high_watermark for o in a.list_offsets("spread")] == [100] * 6
    got = consume_all(c.bootstrap(2), "spread", 600)
    assert len(got) == 600
    # every broker publishes its measured traffic for the controller's placement
    from tailrace.cluster.metadata import read_loads
    assert wait_until(lambda: set(read_loads(c.etcd, c.keys)) == {0, 1, 2}, 5)
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(600))
    # delayed delivery: broker 0's timer holds the batches and appends each, when due, at its
    # partition's leader (two partitions are its own, four the other brokers'): never early, within 1 s
    due = int(time.time() * 1000) + 1500
    with Producer(c.bootstrap(0)) as p:
        for part in range(6):
            p.send("spread", b"due:%d:%d" % (due, part), partition=part, deliver_at_ms=due)
    late = {}
    with Consumer(c.bootstrap(2)) as cons:
        cons.assign("spread", start=100)
        deadline = time.monotonic() + 10
        while len(late) < 6 and time.monotonic() < deadline:
            for r in cons.poll(50):
                late[r.partition] = int(time.time() * 1000) - due
                assert r.value == b"due:%d:%d" % (due, r.partition) and r.offset == 100
    assert sorted(late) == list(range(6)), late
    assert 0 <= min(late.values()) and max(late.values()) < 1000, late
    # a broker asked directly for a partition it does not lead names the leader
    follower = next(p for p, b in leaders.items() if b != 0)
    with Admin(c.bootstrap(0)) as a:
        from tailrace.client import protocol as P
        r = a.conn.send(P.Op.FETCH, "spread", follower, P.encode(P.FetchRequest(0, 1 << 20, 0)))
        reply = a.conn.wait_for(r, 5000)
    assert reply.code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER
    err = P.decoder(P.ErrorReply).decode(reply.header)
    assert err.endpoint == c.bootstrap(leaders[follower])


def test_a_killed_broker_s_partitions_are_unavailable_and_come_back_whole(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint)
    with Admin(c.bootstrap(0)) as a:
        a.create_topic("dies", 6, replication_factor=1)
        a.create_topic("gone", 3, replication_factor=1)
        a.create_topic("again", 3, replication_factor=1)
    assert produce(c.bootstrap(0), "dies", 6, 50) == 300
    assert produce(c.bootstrap(0), "again", 3, 10, tag=b"old") == 30
    victim = 2 if c.controller()[0] != 2 else 1
    lost = sorted(p for p, b in c.leaders("dies").items() if b == victim)
    kept = sorted(p for p, b in c.leaders("dies").items() if b != victim)
    with Producer(c.bootstrap(victim)) as p:  # held by the victim's timer, due while it is down
        for part in (lost[0], kept[0]):
            p.send_delayed("dies", [b"delayed%d" % part], partition=part, deliver_after_ms=1000)
    hard_kill_all(c.brokers[victim])
    died = time.monotonic()
    assert wait_until(lambda: all(c.leaders("dies")[p] == NO_LEADER for p in lost), TTL_S + 5), "not reported unavailable"
    took = time.monotonic() - died
    assert took <= TTL_S + 3, f"{took:.1f} s from the kill to its partitions unavailable"
    other = 0 if victim != 0 else 1
    # the others keep serving, through any live broker
    with Producer(c.bootstrap(other), acks="durable") as p:
        for i in range(100):
            p.send("dies", b"after%d" % i, partition=kept[i % len(kept)])
        assert p.flush(20_000) == 100
    # the dead broker's partitions: a clear error, nothing stored
    with Producer(c.bootstrap(other), acks="durable", delivery_timeout_ms=2000) as p:
        p.send("dies", b"lost", partition=lost[0])
        with pytest.raises(NotLeaderOrFollowerError, match="no leader"):
            p.flush(10_000)
    # topics deleted, and one made again under the same name, while it is down
    with Admin(c.bootstrap(other)) as a:
        a.delete_topic("gone")
        a.delete_topic("again")

        def made_again():  # as in Kafka, the name stays taken a moment after a delete (until the controller has let it go)
            try:
                return a.create_topic("again", 2, replication_factor=1)
            except TopicExistsError:
                return None
        assert wait_until(made_again, 10, 0.2)
    assert produce(c.bootstrap(other), "again", 2, 5, tag=b"new") == 10
    # it comes back: every acknowledged record is there
    c.brokers[victim].start(90)
    assert wait_until(lambda: all(c.leaders("dies")[p] == victim for p in lost), 20)
    got = consume_all(c.bootstrap(other), "dies", 402)  # and the delayed batches it held: appended once it is back
    assert len(got) == 402
    assert {r.value for r in got} >= {b"v%d" % i for i in range(300)} | {b"delayed%d" % lost[0], b"delayed%d" % kept[0]}
    # and its catalog lost what the cluster deleted meanwhile: "again" is the new topic, empty of the old
    catalog = Catalog(str(c.brokers[victim].data_dir))
    assert wait_until(lambda: catalog.reload() or (catalog.get("gone") is None and catalog.get("again") is not None
                                                   and catalog.get("again").partitions == 2), 10), catalog.data.topics
    got = consume_all(c.bootstrap(victim), "again", 10)
    assert sorted(r.value for r in got) == sorted(b"new%d" % i for i in range(10))


def test_controller_killed_another_takes_over_and_places_topics(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint)
    old, old_epoch = c.controller()
    hard_kill_all(c.brokers[old])
    died = time.monotonic()
    assert wait_until(lambda: (c.controller() or (old, 0))[0] != old, TTL_S + 5), "no new controller"
    took = time.monotonic() - died
    assert took <= TTL_S + 2, f"{took:.1f} s to a new controller (lease {TTL_S} s)"
    new, epoch = c.controller()
    assert epoch > old_epoch
    live = next(i for i in range(3) if i != old)
    with Admin(c.bootstrap(live)) as a:
        a.create_topic("after", 4, replication_factor=1)
    assert sorted(set(c.leaders("after").values())) == sorted(i for i in range(3) if i != old)
    assert produce(c.bootstrap(live), "after", 4, 10) == 40


def test_paused_controller_s_late_writes_are_refused(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint)
    old, old_epoch = c.controller()
    pids = c.brokers[old].pids()
    os.kill(pids["router"], signal.SIGSTOP)
    try:
        assert wait_until(lambda: (c.controller() or (old, 0))[0] != old, TTL_S + 5), "no new controller"
    finally:
        os.kill(pids["router"], signal.SIGCONT)
    new, epoch = c.controller()
    assert epoch > old_epoch
    # the resumed router's controller write carries the old epoch: refused (cluster/controller.py);
    # seen from outside: it no longer creates topics itself, and nothing it wrote afterwards bears its epoch
    with Admin(c.bootstrap(old)) as a:
        def created():
            try:
                return a.create_topic("late", 3, replication_factor=1)
            except (MetadataUnavailableError, TailraceError):
                return None
        assert wait_until(created, 20), "the resumed broker never got topic creation to the new controller"
    current, _ = read_assignments(c.etcd, c.keys, "late")
    assert {a.controller_epoch for a, _ in current.values()} == {epoch}


def test_etcd_stopped_the_data_path_keeps_serving(make_cluster, own_etcd_server):
    c = make_cluster(own_etcd_server.endpoint)
    with Admin(c.bootstrap(0)) as a:
        a.create_topic("steady", 3, replication_factor=1)
    assert produce(c.bootstrap(1), "steady", 3, 10) == 30
    own_etcd_server.stop()
    stopped = time.monotonic()
    try:
        n = 0
        while time.monotonic() - stopped < 10:
            assert produce(c.bootstrap(1), "steady", 3, 10, tag=b"down%d-" % n) == 30
            n += 1
        with Admin(c.bootstrap(2), timeout_ms=10_000) as a:
            with pytest.raises(MetadataUnavailableError):
                a.create_topic("refused", 2, replication_factor=1)
        got = consume_all(c.bootstrap(2), "steady", 30 * (n + 1))
        assert len(got) == 30 * (n + 1)
    finally:
        own_etcd_server.start()

    def created():
        try:
            with Admin(c.bootstrap(2)) as a:
                return a.create_topic("resumed", 2, replication_factor=1)
        except TailraceError:
            return None
    assert wait_until(created, 30, 0.5), "topic admin did not resume after etcd came back"
    assert produce(c.bootstrap(0), "steady", 3, 10, tag=b"back") == 30


def test_a_group_moves_with_its_committed_offsets_when_its_coordinator_dies(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint)
    with Admin(c.bootstrap(0)) as a:
        a.create_topic("work", 6, replication_factor=1)
    assert produce(c.bootstrap(0), "work", 6, 50) == 300
    group = "movers"
    with Admin(c.bootstrap(0)) as a:
        coord = a.find_coordinator(group)
    assert coord.broker_id in (0, 1, 2) and coord.endpoint == c.bootstrap(coord.broker_id)
    # every broker names the same coordinator
    for i in range(3):
        with Admin(c.bootstrap(i)) as a:
            assert a.find_coordinator(group).broker_id == coord.broker_id
    via = next(i for i in range(3) if i != coord.broker_id)  # the members' bootstrap survives
    members = [Consumer(c.bootstrap(via), group=group, auto_offset_reset="earliest", auto_commit=False) for _ in range(2)]
    try:
        for m in members:
            m.subscribe("work")
        got = 0
        deadline = time.monotonic() + 30
        while got < 300 and time.monotonic() < deadline:
            for m in members:
                got += len(m.poll(200))
        assert got == 300
        for m in members:
            m.commit()
        before = members[0].committed()
        assert sum(before.values()) == 300, before
        # any broker lists it, wherever it is coordinated (each broker lists its own; the admin asks all)
        import asyncio

        from tailrace.client.aio import AsyncAdmin

        async def async_list(bootstrap):
            async with AsyncAdmin(bootstrap) as aa:
                return [g.group for g in await aa.list_groups()]
        for i in range(3):
            with Admin(c.bootstrap(i)) as a:
                assert [g.group for g in a.list_groups()] == [group]
            assert asyncio.run(async_list(c.bootstrap(i))) == [group]
    finally:
        for m in members:
            m.close()
    hard_kill_all(c.brokers[coord.broker_id])

    def moved():
        with Admin(c.bootstrap(via)) as a:
            return a.find_coordinator(group).broker_id != coord.broker_id
    assert wait_until(moved, TTL_S + 5), "the group did not move"
    late = Consumer(c.bootstrap(via), group=group, auto_offset_reset="earliest")
    try:
        after = wait_until(lambda: _committed(late), 20)
    finally:
        late.close()
    assert after == before


def _committed(consumer):
    try:
        return consumer.committed()
    except TailraceError:
        return None


def test_async_client_and_cli_follow_leaders_from_a_bootstrap_list(make_cluster, etcd_server, tmp_path):
    import asyncio
    import subprocess
    import sys

    from tailrace.client.aio import AsyncConsumer, AsyncProducer

    c = make_cluster(etcd_server.endpoint)
    dead = "127.0.0.1:1"  # nothing listens there: the list goes on to the next
    bootstrap = ",".join([dead, *(b.bootstrap.removeprefix("tcp://") for b in c.brokers)])
    with Admin(bootstrap) as a:
        a.create_topic("listed", 6, replication_factor=1)
    assert wait_until(lambda: _leaders_known(c.bootstrap(2), "listed"), 10)

    async def roundtrip():
        async with AsyncProducer(bootstrap, acks="durable") as p:
            for i in range(120):
                p.send("listed", b"a%d" % i, partition=i % 6)
            await p.flush()
        consumer = AsyncConsumer(bootstrap)
        try:
            await consumer.assign("listed")
            got = []
            for _ in range(60):
                got += await consumer.poll(500)
                if len(got) >= 120:
                    break
            return got
        finally:
            await consumer.close()
    got = asyncio.run(roundtrip())
    assert sorted(r.value for r in got) == sorted(b"a%d" % i for i in range(120))
    lines = "".join(f"line{i}\n" for i in range(60))
    out = subprocess.run([sys.executable, "-m", "tailrace", "produce", "listed", "--bootstrap", bootstrap, "--acks", "durable"],
                         input=lines, text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "tailrace", "consume", "listed", "--bootstrap", c.bootstrap(1),
                          "--from-beginning", "--max", "180", "--timeout-ms", "20000"],
                         text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split()
    assert len(printed) == 180 and {f"line{i}" for i in range(60)} <= set(printed)


def _leaders_known(bootstrap: str, topic: str) -> bool:
    try:
        with Admin(bootstrap) as a:
            return all(p.leader >= 0 for p in a.describe_topic(topic).partitions)
    except TailraceError:
        return False


def test_topic_lifecycle_through_any_broker(make_cluster, etcd_server):
    from tailrace.client.errors import UnknownTopicError

    c = make_cluster(etcd_server.endpoint)
    with Admin(c.bootstrap(2)) as a:
        a.create_topic("life", 3, replication_factor=1)
    with Admin(c.bootstrap(1)) as a:
        grown = a.create_partitions("life", 6)
    assert grown.partitions == 6
    assert sorted(c.leaders("life")) == list(range(6))
    assert sorted(set(c.leaders("life").values())) == [0, 1, 2]
    with Admin(c.bootstrap(0)) as a:
        altered = a.alter_configs("life", {"retention.ms": 60_000})
    assert altered.config["retention.ms"] == "60000"

    def everywhere():
        for i in range(3):
            with Admin(c.bootstrap(i)) as a:
                d = a.describe_topic("life")
                if d.topic.partitions != 6 or d.topic.config["retention.ms"] != "60000" or len(d.partitions) != 6:
                    return False
        return True
    assert wait_until(everywhere, 10), "not every broker took the growth and the setting"
    assert produce(c.bootstrap(0), "life", 6, 10) == 60
    with Admin(c.bootstrap(1)) as a:
        a.delete_topic("life")

    def gone():
        for i in range(3):
            with Admin(c.bootstrap(i)) as a:
                try:
                    a.describe_topic("life")
                    return False
                except UnknownTopicError:
                    pass
        return True
    assert wait_until(gone, 10), "a broker still describes the deleted topic"
    assert c.leaders("life") == {}
    with Admin(c.bootstrap(2)) as a:
        a.create_topic("life", 2, replication_factor=1)
    assert produce(c.bootstrap(1), "life", 2, 5) == 10
    got = consume_all(c.bootstrap(0), "life", 10)
    assert len(got) == 10  # the new topic starts empty: nothing of the deleted one comes back
