"""cluster/controller.py against a real etcd: election, failover, the controller-epoch fence,
placement balance and what happens to a lost broker's partitions."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import msgspec
import pytest

from tailrace.broker.lifetime import pdeathsig_preexec
from tailrace.cluster.controller import Controller, ControllerLoop
from tailrace.cluster.errors import InvalidReassignment, MetadataConflict, NoLiveBrokers, NotController, NotEnoughBrokers
from tailrace.cluster.etcd import mod_revision_is, put_op
from tailrace.cluster.metadata import (NO_LEADER, BrokerLoad, Keys, PartitionAssignment, encode, read_assignments, read_controller,
                                       read_topics, reassigning)

from .conftest import TTL_S, wait_until


def leaders(etcd, cluster_name, topic=None) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (leader, leader_epoch)."""
    found, _ = read_assignments(etcd, Keys(cluster_name), topic)
    return {tp: (a.leader, a.leader_epoch) for tp, (a, _) in found.items()}


@pytest.fixture
def loops():
    started: list[ControllerLoop] = []
    yield started
    for loop in started:
        loop.stop()


def test_of_three_candidates_racing_exactly_one_wins_and_its_epoch_is_the_keys_create_revision(
        etcd, new_client, cluster_name, make_member):
    controllers = [Controller(new_client(), make_member(i))
                   for i in (1, 2, 3)]
    start = threading.Barrier(3)
    won = {}

    def race(c):
        start.wait()
        won[c.broker_id] = c.campaign()

    threads = [threading.Thread(target=race, args=(c,)) for c in controllers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won.values()) == [False, False, True]
    (winner,) = [c for c in controllers if won[c.broker_id]]
    assert read_controller(etcd, Keys(cluster_name)) == (winner.broker_id, winner.epoch)
    assert etcd.get(Keys(cluster_name).controller).create_revision == winner.epoch
    assert all(c.epoch == 0 for c in controllers if c is not winner)


def test_a_deposed_controllers_late_write_is_refused_once_its_lease_is_revoked(etcd, cluster_name, make_member):
    a = Controller(etcd, make_member(1))
    b = Controller(etcd, make_member(2))
    assert a.campaign() and not b.campaign()
    a.create_topic("before", 2)
    etcd.revoke(a.membership.lease)  # a is paused, say: its lease is gone, and it has not noticed
    assert b.campaign() and b.epoch > a.epoch
    assert a.is_controller  # a still believes it leads...
    with pytest.raises(NotController, match=f"epoch={a.epoch}"):
        a.create_topic("late", 1)  # ...but etcd refuses its write
    assert not a.is_controller
    assert "late" not in read_topics(etcd, Keys(cluster_name))
    b.create_topic("after", 1)
    assert set(read_topics(etcd, Keys(cluster_name))) == {"before", "after"}


def test_a_deposed_controllers_reassignment_is_refused_once_its_lease_expired(etcd, cluster_name, make_member):
    a = Controller(etcd, make_member(1), lost_policy="reassign")
    b = Controller(etcd, make_member(2), lost_policy="reassign")
    assert a.campaign()
    a.create_topic("t", 4)
    before = leaders(etcd, cluster_name)
    a.membership.close(revoke=False)  # a stops renewing (a long GC pause, a SIGSTOP)...
    a.epoch = read_controller(etcd, Keys(cluster_name))[1]  # ...and wakes up believing it still leads
    assert wait_until(lambda: read_controller(etcd, Keys(cluster_name)) is None, TTL_S + 4)
    assert b.campaign() and b.epoch > a.epoch
    with pytest.raises(NotController):
        a.reconcile()  # would move broker 1's partitions (broker 1 is gone) under the old epoch
    assert leaders(etcd, cluster_name) == before
    moved = b.reconcile()
    assert {m.leader for m in moved} == {2} and all(m.controller_epoch == b.epoch for m in moved)


def test_placement_balances_partitions_over_three_brokers_by_count(etcd, cluster_name, make_member):
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[0])
    assert c.campaign()
    c.create_topic("a", 12, config={"retention.ms": 1000})
    assert Counter(leader for leader, _ in leaders(etcd, cluster_name).values()) == {1: 4, 2: 4, 3: 4}
    c.create_topic("b", 2)  # to brokers 1 and 2, so the next one fills 3 first
    c.create_topic("c", 4)
    counts = Counter(leader for leader, _ in leaders(etcd, cluster_name).values())
    assert counts == {1: 6, 2: 6, 3: 6}
    assert [leaders(etcd, cluster_name, "c")[("c", p)][0] for p in range(4)] == [3, 1, 2, 3]
    found, _ = read_assignments(etcd, Keys(cluster_name), "a")
    a0 = found[("a", 0)][0]
    assert (a0.replicas, a0.isr, a0.leader_epoch, a0.controller_epoch) == ([a0.leader], [a0.leader], 0, c.epoch)
    meta, topic_id = read_topics(etcd, Keys(cluster_name))["a"]
    assert (meta.partitions, meta.replication_factor, meta.config) == (12, 1, {"retention.ms": 1000})
    assert topic_id == etcd.get(Keys(cluster_name).topic("a")).create_revision
    raw = json.loads(etcd.get(Keys(cluster_name).partition("a", 0)).value)
    assert set(raw) == {"topic", "partition", "replicas", "leader", "leader_epoch", "isr", "controller_epoch", "target"}
    assert raw["target"] == []  # no reassignment pending; a value written before the field existed reads the same:
    del raw["target"]
    assert msgspec.json.decode(json.dumps(raw).encode(), type=PartitionAssignment) == a0 and not reassigning(json.dumps(raw).encode())


def test_placement_weighs_the_load_brokers_publish(etcd, cluster_name, make_member):
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[0])
    assert c.campaign()
    c.create_topic("even", 6)  # no loads published: by count, 2 each
    keys = Keys(cluster_name)
    for b, rate in ((1, 9e6), (2, 1e6), (3, 1e6)):  # as each broker's router publishes it, under its lease
        etcd.put(keys.load(b), encode(BrokerLoad(bytes_in_per_s=rate, bytes_out_per_s=0.0)), lease=members[b - 1].lease)
    c.create_topic("tilted", 6)
    got = Counter(leader for leader, _ in leaders(etcd, cluster_name, "tilted").values())
    assert got[1] < got[2] == got[3], got  # the busy broker takes fewer of the new partitions


def test_a_replicated_topic_s_partitions_take_distinct_brokers_and_elect_from_the_isr(
        etcd, cluster_name, make_member):
    keys = Keys(cluster_name)
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[0])
    assert c.campaign()
    with pytest.raises(NotEnoughBrokers, match="replication_factor=4 .* needs 4 live brokers"):
        c.create_topic("r", 3, replication_factor=4)
    assert etcd.get(keys.topic("r")) is None  # nothing written
    c.create_topic("r", 3, replication_factor=2)
    found, _ = read_assignments(etcd, keys, "r")
    sets = [found[("r", p)][0] for p in range(3)]
    assert all(len(set(a.replicas)) == 2 and a.isr == a.replicas and a.leader == a.replicas[0] for a in sets)
    assert sorted(a.leader for a in sets) == [1, 2, 3]
    assert read_topics(etcd, keys)["r"][0].replication_factor == 2
    c.create_partitions("r", 5)  # grown with the topic's factor
    found, _ = read_assignments(etcd, keys, "r")
    assert [len(found[("r", p)][0].replicas) for p in range(5)] == [2] * 5

    def now(p):
        return read_assignments(etcd, keys, "r")[0][("r", p)][0]

    # a lost leader: its in-sync follower leads (epoch + 1), the ISR loses the lost broker (broker
    # 1 is the controller: a partition without it if there is one)
    sets = [found[("r", p)][0] for p in range(5)]
    lost = next((a for a in sets if 1 not in a.replicas), next(a for a in sets if a.leader != 1))
    other = next(b for b in lost.replicas if b != lost.leader)
    members[lost.leader - 1].close(revoke=True)
    c.reconcile()
    a = now(lost.partition)
    assert (a.leader, a.leader_epoch, a.replicas, a.isr) == (other, 1, lost.replicas, [other])
    # a partition the lost broker only followed keeps its leader and epoch, its ISR shrinks
    followed = next(x for x in sets if lost.leader in x.replicas and x.leader != lost.leader)
    b = now(followed.partition)
    assert (b.leader, b.leader_epoch, b.isr) == (followed.leader, 0, [followed.leader])
    # it comes back: a follower, out of the ISR until its leader sees it caught up
    members[lost.leader - 1].register()
    c.reconcile()
    assert (now(lost.partition).leader, now(lost.partition).leader_epoch, now(lost.partition).isr) == (other, 1, [other])
    # the ISR down to one broker, and it is lost: offline, not led by a stale replica...
    if other != 1:
        members[other - 1].close(revoke=True)
        c.reconcile()
        a = now(lost.partition)
        assert (a.leader, a.leader_epoch, a.isr) == (NO_LEADER, 2, [other])
        # ...until the ISR member is back; or at once with unclean election on
        members[other - 1].register()
        c.reconcile()
        assert (now(lost.partition).leader, now(lost.partition).leader_epoch) == (other, 3)
        c.alter_config("r", {"unclean.leader.election.enable": 1})
        members[other - 1].close(revoke=True)
        c.reconcile()
        a = now(lost.partition)
        assert (a.leader, a.leader_epoch, a.isr) == (lost.leader, 4, [lost.leader])
        assert c.elections[-1] == ("r", lost.partition, lost.leader, 4)


def test_a_topic_is_created_once_and_only_with_a_live_broker(etcd, cluster_name, make_member):
    c = Controller(etcd, make_member(1))
    assert c.campaign()
    c.create_topic("t", 3)
    with pytest.raises(MetadataConflict, match="exists"):
        c.create_topic("t", 5)
    assert len(leaders(etcd, cluster_name, "t")) == 3
    with pytest.raises(ValueError):
        c.create_topic("no/slash", 1)
    etcd.delete(Keys(cluster_name).brokers, prefix=True)  # no broker registered (an odd moment)
    with pytest.raises(NoLiveBrokers):
        c.create_topic("u", 1)


def test_a_topic_of_more_partitions_than_one_transaction_takes_is_written_whole(etcd, cluster_name, make_member):
    c = Controller(etcd, make_member(1))
    assert c.campaign()
    c.create_topic("wide", 250)  # etcd takes at most 128 ops in one transaction
    assert len(leaders(etcd, cluster_name, "wide")) == 250
    assert read_topics(etcd, Keys(cluster_name))["wide"][0].partitions == 250


def test_a_lost_brokers_partitions_move_to_live_brokers_with_a_bumped_leader_epoch(
        etcd, new_client, cluster_name, make_member, loops):
    members = [make_member(i) for i in (1, 2, 3)]
    for m in members:
        loops.append(ControllerLoop(Controller(new_client(), m,
                                               lost_policy="reassign"), resync_s=0.5).start())
    assert wait_until(lambda: read_controller(etcd, Keys(cluster_name)), 5.0)
    controller_id, epoch = read_controller(etcd, Keys(cluster_name))
    c = next(loop.controller for loop in loops if loop.controller.broker_id == controller_id)
    c.create_topic("t", 9)
    lost = next(b for b in (1, 2, 3) if b != controller_id)
    had = sorted(tp for tp, (leader, _) in leaders(etcd, cluster_name).items() if leader == lost)
    assert len(had) == 3
    members[lost - 1].close(revoke=True)  # the broker leaves (its registration is deleted at once)

    def moved():
        now = leaders(etcd, cluster_name)
        return all(now[tp][0] not in (lost, NO_LEADER) for tp in had) and now

    now = wait_until(moved, 5.0)
    assert now, leaders(etcd, cluster_name)
    assert all(now[tp][1] == 1 for tp in had)  # leader epoch 0 -> 1
    assert all(epoch_ == 0 for tp, (_, epoch_) in now.items() if tp not in had)  # the others untouched
    assert sorted(Counter(leader for leader, _ in now.values()).values()) == [4, 5]
    found, _ = read_assignments(etcd, Keys(cluster_name))
    assert all(found[tp][0].controller_epoch == epoch and found[tp][0].isr == [now[tp][0]] for tp in had)


def test_with_the_offline_policy_a_lost_brokers_partitions_have_no_leader_until_it_returns(
        etcd, new_client, cluster_name, make_member, loops):
    members = [make_member(i) for i in (1, 2)]
    for m in members:
        loops.append(ControllerLoop(Controller(new_client(), m),
                                    resync_s=0.5).start())
    assert wait_until(lambda: read_controller(etcd, Keys(cluster_name)), 5.0)
    controller_id, _ = read_controller(etcd, Keys(cluster_name))
    c = next(loop.controller for loop in loops if loop.controller.broker_id == controller_id)
    c.create_topic("t", 4)
    lost = 3 - controller_id
    had = sorted(tp for tp, (leader, _) in leaders(etcd, cluster_name).items() if leader == lost)
    members[lost - 1].close(revoke=True)
    assert wait_until(lambda: all(leaders(etcd, cluster_name)[tp] == (NO_LEADER, 1) for tp in had), 5.0), \
        leaders(etcd, cluster_name)
    members[lost - 1].register()  # it comes back (same id, its data directory with it)
    assert wait_until(lambda: all(leaders(etcd, cluster_name)[tp] == (lost, 2) for tp in had), 5.0), \
        leaders(etcd, cluster_name)


CANDIDATE = textwrap.dedent("""
    import sys, time
    from tailrace.cluster.controller import Controller, ControllerLoop
    from tailrace.cluster.etcd import Etcd
    from tailrace.cluster.membership import Membership
    from tailrace.cluster.metadata import BrokerInfo
    endpoint, cluster, broker_id, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    m = Membership(Etcd(endpoint), cluster, BrokerInfo(id=broker_id, endpoints=[]), ttl_s=ttl)
    m.register()
    loop = ControllerLoop(Controller(Etcd(endpoint), m), resync_s=0.5).start()
    while not loop.epochs:
        time.sleep(0.02)
    print("EPOCH", loop.epochs[0], flush=True)
    time.sleep(600)
""")


def test_when_the_controller_process_is_killed_another_broker_takes_over_within_the_ttl_plus_2_s(
        etcd, etcd_server, new_client, cluster_name, make_member, loops):
    proc = subprocess.Popen([sys.executable, "-c", CANDIDATE, etcd_server.endpoint, cluster_name, "1", str(TTL_S)],
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=pdeathsig_preexec(os.getpid(), signal.SIGKILL))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20.0)
        line = proc.stdout.readline() if ready else "(nothing within 20 s)"
        assert line.startswith("EPOCH"), line
        old_epoch = int(line.split()[1])
        assert read_controller(etcd, Keys(cluster_name)) == (1, old_epoch)
        for i in (2, 3):  # two standbys, started after the first won
            loops.append(ControllerLoop(Controller(new_client(), make_member(i)),
                                        resync_s=0.5).start())
        time.sleep(0.5)
        assert read_controller(etcd, Keys(cluster_name)) == (1, old_epoch)  # nobody takes a held role
        proc.kill()
        killed = time.monotonic()
        now = wait_until(lambda: (read_controller(etcd, Keys(cluster_name)) or (1, 0))[0] != 1 and
                         read_controller(etcd, Keys(cluster_name)), TTL_S + 4)
        assert now, "no new controller"
        took_s = time.monotonic() - killed
        new_id, new_epoch = now
        assert new_id in (2, 3) and new_epoch > old_epoch and took_s <= TTL_S + 2, (now, took_s)
        new = next(loop for loop in loops if loop.controller.broker_id == new_id)
        assert new.epochs == [new_epoch]
        new.controller.create_topic("after", 2)  # placement works under the new controller
        assert {leader for leader, _ in leaders(etcd, cluster_name, "after").values()} == {2, 3}
    finally:
        proc.kill()
        proc.wait()


def test_leadership_goes_back_to_the_preferred_replica_once_it_is_in_sync_again(etcd, cluster_name, make_member):
    keys = Keys(cluster_name)
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[2], rebalance_leaders=True)  # broker 3: not the one lost below
    assert c.campaign()
    (a,) = c.create_topic("pref", 1, replication_factor=3)
    preferred = a.replicas[0]
    assert preferred == 1  # ties go to the lower id
    members[preferred - 1].close(revoke=True)
    c.reconcile()
    now = read_assignments(etcd, keys, "pref")[0][("pref", 0)]
    assert now[0].leader != preferred and now[0].leader_epoch == 1
    members[preferred - 1].register()
    assert c.reconcile() == []  # back, but not in sync: it follows
    # its leader sees it caught up and writes it into the ISR (router/cluster_agent.py propose_isr)
    grown = msgspec.structs.replace(now[0], isr=[*now[0].isr, preferred])
    assert etcd.txn([mod_revision_is(keys.partition("pref", 0), now[1])], [put_op(keys.partition("pref", 0), encode(grown))]).succeeded
    c.reconcile()
    back = read_assignments(etcd, keys, "pref")[0][("pref", 0)][0]
    assert (back.leader, back.leader_epoch, sorted(back.isr)) == (preferred, 2, sorted(a.replicas))
    assert c.reconcile() == []  # and it stays


def test_a_reassignment_adds_the_target_finishes_once_it_is_in_sync_and_moves_leadership_once(
        etcd, cluster_name, make_member):
    """Kafka's KIP-455 at the controller: the union first (ISR unchanged), finished only when every
    target replica is in the ISR, leadership moved once (the preferred-leader move waits), a lost
    leader elected first, a pending reassignment replaced, and what is refused before any write."""
    keys = Keys(cluster_name)
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[2], rebalance_leaders=True)  # broker 3
    assert c.campaign()
    (a,) = c.create_topic("mv", 1, replication_factor=2)
    assert (a.replicas, a.leader) == ([1, 2], 1)

    def now(topic="mv", p=0):
        return read_assignments(etcd, keys, topic)[0][(topic, p)]

    def in_sync(topic, p, isr):  # what the leader writes once its followers caught up (propose_isr)
        cur, rev = now(topic, p)
        key = keys.partition(topic, p)
        assert etcd.txn([mod_revision_is(key, rev)], [put_op(key, encode(msgspec.structs.replace(cur, isr=isr)))]).succeeded

    rev = now()[1]
    for bad, says in (([], "at least 1 broker"), ([2, 2], "names a broker twice"), ([2, 9], r"broker\(s\) \[9\] are not")):
        with pytest.raises(InvalidReassignment, match=says):
            c.reassign("mv", 0, bad)
    with pytest.raises(InvalidReassignment, match="has 1 partitions: no partition"):
        c.reassign("mv", 1, [2])
    with pytest.raises(MetadataConflict, match="does not exist"):
        c.reassign("nope", 0, [2])
    assert c.reassign("mv", 0, [1, 2]) == a  # its replicas already: nothing written
    assert now()[1] == rev

    # away from its leader: the union (target first), the ISR and the leader as they were
    moving = c.reassign("mv", 0, [2, 3])
    assert (moving.replicas, moving.target, moving.isr, moving.leader, moving.leader_epoch) == ([2, 3, 1], [2, 3], [1, 2], 1, 0)
    assert now()[0] == moving
    assert c.reassign("mv", 0, [2, 3]) == moving  # asked again: under way already
    assert c.reconcile() == []  # 3 not in sync yet; broker 2 (preferred, in sync) does not lead meanwhile
    in_sync("mv", 0, [1, 2, 3])
    (done,) = c.reconcile()
    assert (done.replicas, done.target, done.isr, done.leader, done.leader_epoch) == ([2, 3], [], [2, 3], 2, 1)
    assert c.reconcile() == []  # one leader change in all

    # a leader lost while its partition moves: elected first (the union, target first), finished later
    (b,) = c.create_topic("mv2", 1, replication_factor=2)
    lead, follow = b.leader, next(x for x in b.replicas if x != b.leader)
    assert lead != 3  # the controller's broker stays
    spare = next(x for x in (1, 2, 3) if x not in b.replicas)
    c.reassign("mv2", 0, [spare, follow])
    members[lead - 1].close(revoke=True)
    (elected,) = c.reconcile()
    assert (elected.leader, elected.leader_epoch, elected.isr, elected.target) == (follow, 1, [follow], [spare, follow])
    in_sync("mv2", 0, [follow, spare])
    (done,) = c.reconcile()
    assert (done.replicas, done.leader, done.leader_epoch, done.isr, done.target) == ([spare, follow], follow, 1,
                                                                                      [spare, follow], [])
    members[lead - 1].register()
    (pref,) = c.reconcile()  # and now its preferred replica, in sync, leads (the move that waited)
    assert (pref.topic, pref.leader, pref.leader_epoch) == ("mv2", spare, 2)

    # a new reassignment replaces a pending one: what the first added and never synced is dropped at the end
    cur = now("mv")[0]  # replicas [2, 3], leader 2
    c.reassign("mv", 0, [2, 1])
    replaced = c.reassign("mv", 0, [3, 2])  # 3 and 2 in sync: finished by the next reconcile
    assert (replaced.replicas, replaced.target) == ([3, 2, 1], [3, 2]) and cur.replicas == [2, 3]
    (done,) = c.reconcile()
    assert (done.replicas, done.isr, done.leader, done.leader_epoch, done.target) == ([3, 2], [3, 2], 2, 1, [])


def test_the_controller_loop_finishes_a_reassignment_when_the_isr_grows_without_waiting_for_its_resync(
        etcd, cluster_name, make_member, loops):
    keys = Keys(cluster_name)
    members = [make_member(i) for i in (1, 2, 3)]
    c = Controller(etcd, members[0])
    loop = ControllerLoop(c, resync_s=60.0)
    loops.append(loop.start())
    assert wait_until(lambda: c.is_controller, 5)
    (a,) = c.create_topic("woken", 1, replication_factor=1)
    to = next(b for b in (1, 2, 3) if b != a.leader)
    c.reassign("woken", 0, [to])
    cur, rev = read_assignments(etcd, keys, "woken")[0][("woken", 0)]
    key = keys.partition("woken", 0)
    t0 = time.monotonic()
    assert etcd.txn([mod_revision_is(key, rev)], [put_op(key, encode(msgspec.structs.replace(cur, isr=[to, a.leader])))]).succeeded
    assert wait_until(lambda: read_assignments(etcd, keys, "woken")[0][("woken", 0)][0].target == [], 5)
    took = time.monotonic() - t0
    done = read_assignments(etcd, keys, "woken")[0][("woken", 0)][0]
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ([to], [to], to, 1)
    assert took < 2, f"finished {took:.1f} s after the ISR grew (resync is 60 s)"
