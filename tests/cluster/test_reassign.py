"""Partition reassignment and broker decommission (issue 34's Operations, Kafka's KIP-455).

Real brokers on one real etcd, on loopback (tests/cluster/harness.py):

- under load: an idempotent acks=all producer and a consumer (test_failover.py's ``Load``) run
  while ``tailrace partitions reassign --wait`` moves a partition of two replicas off its leader's
  broker to a third; then every acknowledged record is in the log once, in order, at the offset
  its acknowledgement named, on both replicas of the final set byte for byte; the removed broker
  follows nothing and its own copy is still on its disk (not reclaimed);
- ``tailrace cluster decommission --wait``: no partition lists the broker afterwards (one-replica
  partitions moved too, with their records), and with it stopped every partition is served;
  before that, what is refused (an unknown broker, one named twice, none, an unknown topic or
  partition) with nothing changed, and a single host refusing reassignment;
- the limit: a partition whose log start retention moved past 0 cannot be copied by a new
  replica (OFFSET_OUT_OF_RANGE, logged plainly), so its move does not finish; a new
  reassignment back to its old replica replaces it.
"""

from __future__ import annotations

import time

import pytest

from tailrace.bench.launcher import Broker
from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer
from tailrace.client.errors import InvalidRequestError, UnknownPartitionError, UnknownTopicError
from tailrace.client.producer import Producer

from .conftest import wait_until
from .harness import cluster_fixture
from .test_cluster_cli import tailrace
from .test_failover import TOPIC, Load, assignment, final_log
from .test_replication import read_copy


@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request, etcd_server):
    """The 3-broker cluster (replica_lag_time_max_ms 1500) of the first two tests, started once: a
    cluster start and stop is 10-15 s on a 2-core CI box. The move under load runs first, the
    decommission second (it stops the broker it empties, and its checks hold whatever the first
    test left: its own topics, and a broker it empties of every replica it holds)."""
    made = cluster_fixture(tmp_path_factory.mktemp("reassign"), request)
    make = next(made)
    try:
        yield make(etcd_server.endpoint, replica_lag_time_max_ms=1500)
    finally:
        made.close()


def following(c, b: int) -> int:
    return c.status(b)["cluster"]["replication"]["following"]


def logged(c, b: int, text: str) -> bool:
    logs = c.brokers[b].data_dir / "logs"
    return any(text in f.read_text(errors="replace") for f in logs.iterdir() if f.is_file())


def test_a_partition_moved_off_its_leader_under_acks_all_load_loses_and_duplicates_nothing(cluster):
    c = cluster
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic(TOPIC, 1, replication_factor=2)
    a = assignment(c)
    old, stays = a.leader, next(b for b in a.replicas if b != a.leader)
    new = next(b for b in range(3) if b not in a.replicas)
    assert following(c, new) == 0
    # through the broker the partition leaves: the clients' direct routes to its worker go stale at the move
    load = Load(c.bootstrap(old)).start()
    try:
        assert wait_until(lambda: load.acked() >= 2000, 60), (load.acked(), load.errors)
        at_move = load.acked()
        t0 = time.monotonic()
        r = tailrace("partitions", "reassign", TOPIC, "--partition", "0", "--replicas", f"{stays},{new}",
                     "--wait", "40", "--bootstrap", c.bootstrap(new))  # any broker: the CLI follows NOT_CONTROLLER
        took = time.monotonic() - t0
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f"moving to replicas {stays},{new}" in r.stdout and "done" in r.stdout, r.stdout
        done = assignment(c)
        # leadership moved once, to the first target replica (in sync: it holds every acknowledged record)
        assert (done.replicas, done.isr, done.target, done.leader, done.leader_epoch) == \
            ([stays, new], [stays, new], [], stays, a.leader_epoch + 1), done
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 1000, 30), "no acknowledgement after the move"
    finally:
        load.finish()
    assert not load.errors, load.errors
    log = final_log(c, done.leader)
    values = [int(v[1:]) for v in log]
    assert values == list(range(len(values))), "the log is not every record sent, once, in the order sent"
    acked_offsets = sorted(base + i for _t, base, count in load.acks for i in range(count))
    assert acked_offsets == list(range(load.acked())) and load.acked() == len(log) == load.sent, \
        (load.acked(), len(log), load.sent)  # each record acknowledged once, at the offset that holds it
    by_offset = dict(enumerate(log))
    wrong = [(o, v) for o, v in load.seen if by_offset.get(o) != v]
    assert not wrong, f"the consumer saw records the final log does not hold: {wrong[:5]}"
    copies = {b: read_copy(c.brokers[b], TOPIC, 0) for b in done.replicas}
    assert copies[stays] == copies[new] and copies[new][1] == len(log), {b: cp[1] for b, cp in copies.items()}
    # the removed broker follows nothing, its worker stood down, and its copy is still on its disk
    assert following(c, old) == 0 and following(c, new) == 1 and following(c, stays) == 0
    assert logged(c, old, f"partition {TOPIC}/0: no replica here any more")
    kept = read_copy(c.brokers[old], TOPIC, 0)
    assert kept[1] >= at_move, kept[1]
    stall = max((t2 - t1 for (t1, _, _), (t2, _, _) in zip(load.acks, load.acks[1:]) if t2 > t0), default=0.0)
    print(f"moved in {took:.2f} s (CLI, --wait); {len(log)} records, longest gap between acks after the move "
          f"started {stall * 1000:.0f} ms; the removed broker keeps {kept[1]} records")


def test_decommission_moves_every_replica_off_a_broker_and_refusals_change_nothing(cluster, tmp_path):
    c = cluster
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic("spread", 3, replication_factor=2)
        adm.create_topic("single", 3, replication_factor=1)
        before = {t: adm.describe_topic(t) for t in ("spread", "single")}
        # what is refused, with nothing written
        for bad, err, says in (({0: [9]}, InvalidRequestError, r"broker\(s\) \[9\] are not registered"),
                               ({0: [1, 1]}, InvalidRequestError, "names a broker twice"),
                               ({0: []}, InvalidRequestError, "at least 1 broker"),
                               ({7: [1]}, UnknownPartitionError, "has 3 partitions: no partition 7"),
                               ({}, InvalidRequestError, "at least one partition")):
            with pytest.raises(err, match=says):
                adm.reassign_partitions("spread", bad)
        with pytest.raises(UnknownTopicError):
            adm.reassign_partitions("nope", {0: [1]})
        assert [p.replicas for p in adm.describe_topic("spread").partitions] == \
            [p.replicas for p in before["spread"].partitions]
    r = tailrace("partitions", "reassign", "spread", "--partition", "0", "--replicas", "1,x", "--bootstrap", c.bootstrap(0))
    assert r.returncode == 2 and "expected a broker id" in r.stderr, r.stderr
    r = tailrace("partitions", "reassign", "spread", "--partition", "0", "--replicas", "9", "--bootstrap", c.bootstrap(0))
    assert r.returncode == 1 and "INVALID_REQUEST" in r.stderr and "Traceback" not in r.stderr, r.stderr

    with Producer(c.bootstrap(0), acks="all") as p:
        for topic in ("spread", "single"):
            for i in range(300):
                p.send(topic, b"%s-%d" % (topic.encode(), i), partition=i % 3)
        assert p.flush(30_000) == 600
    ctl = c.controller()[0]
    gone = next(b for b in range(3) if b != ctl)  # any broker would do; the controller keeps its role for the check
    holds = [(t, p.partition) for t, d in before.items() for p in d.partitions if gone in p.replicas]
    assert holds
    t0 = time.monotonic()
    r = tailrace("cluster", "decommission", str(gone), "--wait", "40", "--bootstrap", c.bootstrap(ctl))
    took = time.monotonic() - t0
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"broker {gone} holds no replica: it can be stopped" in r.stdout, r.stdout
    for t, p in holds:
        assert f"{t}/{p}: replicas" in r.stdout, r.stdout
    with Admin(c.bootstrap(ctl)) as adm:
        after = {t: adm.describe_topic(t) for t in ("spread", "single")}
    for t, d in after.items():
        for p in d.partitions:
            assert gone not in p.replicas and not p.target, (t, p.partition, p.replicas, p.target)
            assert len(p.replicas) == (2 if t == "spread" else 1) and sorted(p.isr) == sorted(p.replicas)
    assert following(c, gone) == 0
    # nothing left there: stopped, and every record is still served by the other two
    c.brokers[gone].stop()
    for t in ("spread", "single"):
        with Consumer(c.bootstrap(ctl), max_wait_ms=100) as cons:
            cons.assign(t, start="earliest")
            got: list = []
            wait_until(lambda: got.extend(cons.poll(200)) or len(got) >= 300, 20)
        assert sorted(r.value for r in got) == sorted(b"%s-%d" % (t.encode(), i) for i in range(300)), t
    again = tailrace("cluster", "decommission", str(gone), "--bootstrap", c.bootstrap(ctl))
    assert again.returncode == 0 and f"broker {gone} holds no replica" in again.stdout, again.stdout
    print(f"decommissioned broker {gone} ({len(holds)} replicas moved) in {took:.2f} s")

    # a single host has nowhere to move anything
    single = Broker(tmp_path / "single-host", workers=1).start()
    try:
        with Admin(single.bootstrap) as adm:
            adm.create_topic("t", 1)
            with pytest.raises(InvalidRequestError, match="reassignment needs a cluster"):
                adm.reassign_partitions("t", {0: [0]})
        r = tailrace("cluster", "decommission", "0", "--bootstrap", single.bootstrap)
        assert r.returncode == 1 and "single host" in r.stderr, r.stderr
    finally:
        single.stop()
        single.cleanup_shm()


def test_a_new_replica_cannot_copy_a_log_that_no_longer_starts_at_0_and_its_move_does_not_finish(
        make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint, n=2, retention_check_ms=300)
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic("expiring", 1, replication_factor=1, config={"retention.ms": "500"})
        a = assignment(c, "expiring")
        with Producer(c.bootstrap(0), acks="durable") as p:
            for i in range(50):
                p.send("expiring", b"x%d" % i, partition=0)
            assert p.flush(10_000) == 50
        assert wait_until(lambda: adm.list_offsets("expiring")[0].log_start_offset > 0, 15), "retention did not run"
        start = adm.list_offsets("expiring")[0].log_start_offset
        new = 1 - a.leader
        r = tailrace("partitions", "reassign", "expiring", "--partition", "0", "--replicas", str(new),
                     "--wait", "3", "--bootstrap", c.bootstrap(new))
        assert r.returncode == 1 and "not moved within 3 s" in r.stderr, (r.stdout, r.stderr)
        assert "cannot catch up yet" in r.stderr, r.stderr  # said when it was asked
        stuck = assignment(c, "expiring")
        assert (stuck.replicas, stuck.target, stuck.isr, stuck.leader) == ([new, a.leader], [new], [a.leader], a.leader)
        assert "expiring/0" in c.status(new)["cluster"]["replication"]["not_copying"]
        assert logged(c, new, f"below the leader's log start {start}")
        # replaced by a reassignment back to where it is: finished at once, the new broker stops following
        (back,) = adm.reassign_partitions("expiring", {0: [a.leader]})
        assert back.target == [a.leader]
        assert wait_until(lambda: assignment(c, "expiring").target == [], 10), assignment(c, "expiring")
        done = assignment(c, "expiring")
        assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ([a.leader], [a.leader], a.leader, a.leader_epoch)
        assert wait_until(lambda: following(c, new) == 0, 5)
