"""actors/replication.py: a replicated partition's leader state, pure (no process, no clock of
its own: each call is handed the time)."""

from __future__ import annotations

from tailrace.actors.replication import Replication
from tailrace.client import protocol as P

MS = 1_000_000


def leader(isr=(0, 1, 2), min_isr=2, lag_ms=1000, now=0) -> Replication:
    return Replication(P.LeaderAndIsrRequest(0, 3, [0, 1, 2], list(isr), min_isr, lag_ms), 0, now)


def test_the_high_watermark_is_the_least_log_end_over_the_isr_and_never_goes_back():
    r = leader()
    assert r.hw_at(100) == 0  # no follower has said where it is
    assert r.fetched(1, 100, 100, 100, 1 * MS) and r.hw_at(100) == 0
    assert r.fetched(2, 60, 40, 100, 1 * MS)
    assert r.hw_at(100) == 60 and r.durable_hw_at(100) == 40
    assert r.fetched(2, 50, 50, 100, 2 * MS)  # a follower that went back (it truncated): the watermark stays
    assert r.hw_at(100) == 60
    assert r.hw_at(55) == 60  # nor does it follow the leader's own end down
    assert not r.fetched(7, 100, 100, 100, 2 * MS)  # not a replica: not counted
    assert not r.fetched(0, 100, 100, 100, 2 * MS)  # the leader itself


def test_durable_acks_need_every_isr_replica_synced_and_the_isr_must_be_big_enough():
    r = leader(min_isr=2)
    r.fetched(1, 80, 30, 100, 0)
    r.fetched(2, 90, 70, 100, 0)
    assert r.durable_hw_at(100) == 30  # synced on the leader and every in-sync follower
    r.fetched(1, 100, 100, 100, 0)
    assert r.durable_hw_at(100) == 70 and r.durable_hw_at(50) == 70  # never back
    assert leader(min_isr=3).durable_hw_at(100) == 0  # no follower has synced anything yet
    assert leader(isr=(0,), min_isr=1).durable_hw_at(100) == 100
    assert not leader(isr=(0, 1), min_isr=2).short() and leader(isr=(0,), min_isr=2).short()


def test_a_follower_not_caught_up_within_the_lag_leaves_the_isr_and_one_caught_up_joins():
    r = leader(lag_ms=1000, now=0)
    assert r.wanted_isr(500 * MS) is None  # every ISR member has the lag time from when the leader learned it
    r.fetched(1, 100, 100, 100, 900 * MS)  # follower 1 asks from our end: caught up
    r.fetched(2, 40, 40, 100, 900 * MS)  # follower 2 behind
    assert r.wanted_isr(1500 * MS) == [0, 1]
    # while the shrink is pending both watermarks still count follower 2 (the union)
    assert r.hw_at(100) == 40
    r.update(P.LeaderAndIsrRequest(0, 3, [0, 1, 2], [0, 1], 2, 1000), 1600 * MS)  # etcd has it
    assert r.proposed is None and r.hw_at(100) == 100
    # follower 2 catches up to our log end: it is asked back in, and counted from the proposal on
    r.fetched(2, 90, 90, 120, 1700 * MS)  # short of the end (120), and of what we held at its last fetch (100)
    assert r.wanted_isr(1750 * MS) is None
    r.fetched(2, 120, 120, 120, 1800 * MS)
    assert r.wanted_isr(1850 * MS) == [0, 1, 2]
    assert r.hw_at(130) == min(130, r.ends[1], 120)


def test_under_steady_load_a_follower_holding_what_the_leader_held_at_its_last_fetch_stays_in_sync():
    r = leader(lag_ms=1000, now=0)
    end = 0
    for step in range(1, 40):  # every fetch arrives after more was appended: never exactly at the end
        now = step * 100 * MS
        r.fetched(1, end, end, end + 10, now)
        r.fetched(2, end, end, end + 10, now)
        end += 10
    assert r.wanted_isr(40 * 100 * MS) is None  # both still in sync
    assert r.hw_at(end) == end - 10
