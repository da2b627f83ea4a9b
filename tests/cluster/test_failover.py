"""Failover (issue 34): a replicated partition's leader lost under load, Jepsen's shape, bounded.

Three real brokers on one real etcd, on loopback (tests/cluster/harness.py), one partition of
three replicas (min.insync.replicas 2). An idempotent producer with acks=all and a consumer run
while the test does two things to the leader's broker in a row: kill -9 it (then restarts it),
and SIGSTOP it past its lease (then resumes it). Then, with everything quiet, it checks what Kafka's
tests check:

- every acknowledged record is in the final log, exactly once, in the order it was sent, at
  the offset its acknowledgement named;
- every replica's copy is byte-identical (up to the topic id each broker stamps);
- no consumer ever saw a record the final log does not hold at that offset;
- the old leader came back as a follower, cut what only it held (by leader epoch) and is in
  sync again.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer
from tailrace.client.producer import Producer
from tailrace.cluster.metadata import read_assignments

from ..helpers import hard_kill_all
from .conftest import TTL_S, wait_until
from .harness import cluster_fixture
from .test_replication import read_copy

TOPIC = "jepsen"


@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


def assignment(c, topic: str = TOPIC, partition: int = 0):
    current, _ = read_assignments(c.etcd, c.keys, topic)
    return current[(topic, partition)][0]


class Load:
    """An acks=all idempotent producer (values ``v0``, ``v1``... in order) and a consumer from
    the earliest offset, each on a thread, through a broker that stays up."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.acks: list[tuple[float, int, int]] = []  # (monotonic time, base offset, count), in ack order
        self.sent = 0
        self.seen: list[tuple[int, bytes]] = []  # (offset, value) the consumer got
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def acked(self) -> int:
        return sum(n for _, _, n in self.acks)

    def _produce(self) -> None:
        def on_ack(_topic, _partition, base, count):
            self.acks.append((time.monotonic(), base, count))

        try:
            with Producer(self.bootstrap, acks="all", linger_ms=2, batch_records=50, on_ack=on_ack,
                          request_timeout_ms=2000) as p:
                while not self.stop.is_set():
                    for _ in range(20):
                        p.send(TOPIC, b"v%d" % self.sent, partition=0)
                        self.sent += 1
                    p.poll(5)
                    time.sleep(0.005)
                p.flush(60_000)
                self.errors += [repr(e) for e in p.errors]
        except Exception as exc:  # noqa: BLE001 - the test reports it
            self.errors.append(f"producer: {exc!r}")

    def _consume(self) -> None:
        try:
            with Consumer(self.bootstrap, max_wait_ms=100) as cons:
                cons.assign(TOPIC, start="earliest")
                while not self.stop.is_set():
                    self.seen += [(r.offset, r.value) for r in cons.poll(100)]
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"consumer: {exc!r}")

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


def final_log(c, leader: int) -> list[bytes]:
    with Consumer(c.bootstrap(leader), max_wait_ms=100) as cons:
        cons.assign(TOPIC, start="earliest")
        out: list[bytes] = []
        quiet = 0
        while quiet < 5:  # until a second of empty polls (the copies' ends are compared in ``check``)
            got = cons.poll(200)
            quiet = 0 if got else quiet + 1
            out += [r.value for r in got]
        return out


def check(c, load: Load) -> dict:
    """The checks of the module docstring; returns a few figures for the caller."""
    assert not load.errors, load.errors
    assert wait_until(lambda: sorted(assignment(c).isr) == [0, 1, 2], 40), f"not all back in sync: {assignment(c)}"
    a = assignment(c)
    log = final_log(c, a.leader)
    acked = load.acked()
    assert acked > 0
    values = [int(v[1:]) for v in log]
    assert len(set(values)) == len(values), "a record is in the log twice"
    assert values == sorted(values), "records out of the order they were sent"
    want = set(range(acked))
    assert want <= set(values), f"acknowledged records lost: {sorted(want - set(values))[:20]}"
    for _t, base, count in load.acks:  # each acknowledgement's offsets hold what it acknowledged
        assert all(0 <= base + i < len(log) for i in range(count))
    by_offset = dict(enumerate(log))
    wrong = [(o, v) for o, v in load.seen if by_offset.get(o) != v]
    assert not wrong, f"consumers saw records the final log does not hold: {wrong[:5]}"
    copies = [read_copy(c.brokers[b], TOPIC, 0) for b in a.replicas]
    assert all(copy == copies[0] for copy in copies), [copy[1] for copy in copies]
    assert copies[0][1] == len(log)
    return {"records": len(log), "acked": acked, "seen": len(load.seen)}


def failover_s(load: Load, t0: float) -> float:
    """From ``t0`` to the first acknowledgement after the silence that followed it (replies the
    old leader had sent before its kill may still arrive just after it)."""
    prev = t0
    for t in sorted(t for t, _, _ in load.acks if t > t0):
        if t - prev > 0.3:
            return t - t0
        prev = t
    return float("inf")


def start(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint, replica_lag_time_max_ms=1500)
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic(TOPIC, 1, replication_factor=3)
    leader = assignment(c).leader
    # the clients go through a broker that stays up: the controller if it is not the leader
    ctl = c.controller()[0]
    stays = ctl if ctl != leader else next(b for b in range(3) if b != leader)
    return c, leader, Load(c.bootstrap(stays)).start()


def test_a_leader_killed_then_one_paused_past_its_lease_lose_nothing_acknowledged_and_rejoin(make_cluster, etcd_server):
    """Two faults in a row on one cluster: the leader's broker killed (kill -9 of every process)
    and started again; then, once leadership is back on the preferred replica, that broker
    SIGSTOPped past its lease and resumed (fenced meanwhile: it must not serve at its old epoch)."""
    c, leader, load = start(make_cluster, etcd_server)
    try:
        assert wait_until(lambda: load.acked() >= 1000, 60), (load.acked(), load.errors)
        t0 = time.monotonic()
        hard_kill_all(c.brokers[leader])
        assert wait_until(lambda: assignment(c).leader not in (leader, -1), TTL_S + 10), assignment(c)
        elected = time.monotonic() - t0
        new = assignment(c)
        assert new.leader_epoch == 1 and leader not in new.isr
        assert wait_until(lambda: failover_s(load, t0) < 60, 30), "no acknowledgement after the leader was lost"
        took = failover_s(load, t0)
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 500, 60)
        c.brokers[leader].spawn()  # back with whatever it held that the new leader never had
        c.brokers[leader].wait_ready(90)
        assert wait_until(lambda: leader in assignment(c).isr, 40), f"the old leader did not rejoin: {assignment(c)}"
        cut = c.status(leader)["cluster"]["replication"]["truncations"]
        # the preferred replica leads again (auto leader rebalance); now it is paused past its lease
        assert wait_until(lambda: assignment(c).leader == leader, 20), assignment(c)
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 300, 30)
        pids = list(c.brokers[leader].pids().values())
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: assignment(c).leader not in (leader, -1), TTL_S + 10), assignment(c)
            acked = load.acked()
            assert wait_until(lambda: load.acked() >= acked + 500, 60)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: leader in assignment(c).isr, 40), f"the paused leader did not rejoin: {assignment(c)}"
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 300, 30)
    finally:
        load.finish()
    figures = check(c, load)
    figures.update(old_leader_cuts=cut, elected_s=round(elected, 2))
    # (the time is printed, not asserted: the number is met in bench/replication_bench.py's failover step)
    print(f"failover {took:.2f} s (lease TTL {TTL_S} s); {figures}")


def test_unclean_election_is_off_by_default_and_reports_the_loss_when_on(make_cluster, etcd_server):
    c = make_cluster(etcd_server.endpoint, replica_lag_time_max_ms=1000)
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic(TOPIC, 1, replication_factor=3, config={"min.insync.replicas": "1"})
    a = assignment(c)
    # the ISR down to the leader alone: both followers' routers paused (their copies stop)
    followers = [b for b in a.replicas if b != a.leader]
    paused = [c.brokers[b].pids()["router"] for b in followers]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        with Producer(c.bootstrap(a.leader), acks="all") as p:
            for i in range(100):
                p.send(TOPIC, b"v%d" % i, partition=0)
            assert p.flush(20_000) == 100
        assert wait_until(lambda: assignment(c).isr == [a.leader], 20), assignment(c)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    # ... and that broker lost: no stale replica leads, the partition is offline
    hard_kill_all(c.brokers[a.leader])
    assert wait_until(lambda: assignment(c).leader == -1, TTL_S + 10), assignment(c)
    time.sleep(1)
    assert assignment(c).leader == -1 and assignment(c).isr == [a.leader]
    # with unclean election on, a live replica leads at once, and the controller says what was lost
    alive = next(b for b in range(3) if b != a.leader)
    with Admin(c.bootstrap(alive)) as adm:
        adm.alter_configs(TOPIC, {"unclean.leader.election.enable": "true"})
    assert wait_until(lambda: assignment(c).leader in followers, 15), assignment(c)
    assert sorted(assignment(c).isr) == [assignment(c).leader]
    ctl = c.controller()[0]
    report = c.status(ctl)["cluster"]["unclean_elections"]
    assert [(u["topic"], u["leader"], u["lost_isr"]) for u in report] == [(TOPIC, assignment(c).leader, [a.leader])]
    logs = c.brokers[ctl].data_dir / "logs"
    assert any("UNCLEAN leader election" in f.read_text(errors="replace") for f in logs.iterdir() if f.is_file())
