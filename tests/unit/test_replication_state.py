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


class _Row:
    def __init__(self, start, end):
        self.log_start_offset, self.next_offset = start, end


class _Log:
    """A log as epochs.py sees it: ``epochs[o]`` is the leader epoch of offset o's batch."""

    def __init__(self, epochs, start=0):
        self.epochs = epochs
        self.owner_row = _Row(start, len(epochs))
        self.reads = 0


def with_log(monkeypatch, log: _Log) -> None:
    from tailrace.actors import epochs

    def epoch_at(actor, offset):
        assert actor.owner_row.log_start_offset <= offset < actor.owner_row.next_offset, offset
        actor.reads += 1
        return actor.epochs[offset]
    monkeypatch.setattr(epochs, "epoch_at", epoch_at)


def test_the_end_of_an_epoch_is_the_first_offset_of_a_later_one_found_in_log_n_reads(monkeypatch):
    """The binary search of actors/epochs.py over a stand-in log (its ``epoch_at`` reads a list:
    tests/cluster/test_failover.py runs the real one, reading rings and the journal)."""
    from tailrace.actors import epochs
    log = _Log([0] * 1000 + [2] * 500 + [5] * 24)
    with_log(monkeypatch, log)
    assert epochs.end_of_epoch(log, 0) == (0, 1000)
    assert epochs.end_of_epoch(log, 1) == (0, 1000)  # an epoch this log never had: the one below it
    assert epochs.end_of_epoch(log, 2) == (2, 1500)
    assert epochs.end_of_epoch(log, 4) == (2, 1500)
    assert epochs.end_of_epoch(log, 5) == (5, 1524)  # the last epoch ends at the log end
    assert epochs.end_of_epoch(log, 9) == (5, 1524)
    log.reads = 0
    epochs.end_of_epoch(log, 0)
    assert log.reads <= 2 + 12  # the two ends, then log2(1524)
    assert epochs.last_epoch(log) == 5
    later = _Log([0] * 10 + [3] * 10, start=10)  # retention took epoch 0's records
    with_log(monkeypatch, later)
    assert epochs.end_of_epoch(later, 1) == (-1, 10)
    assert epochs.last_epoch(_Log([])) == -1


def test_a_copy_is_told_it_diverged_only_when_it_is_not_a_prefix_of_the_leader_s_log(monkeypatch):
    from tailrace.actors.replication import diverging
    log = _Log([0] * 100 + [1] * 50)  # epoch 1 (this leader's, below) started at 100
    with_log(monkeypatch, log)
    r = Replication(P.LeaderAndIsrRequest(0, 1, [0, 1, 2], [0, 1, 2], 2, 1000), 0, 0)
    assert diverging(log, r, -1, 0) is None  # an empty copy
    assert diverging(log, r, 1, 120) is None  # copying this epoch
    assert diverging(log, r, 0, 100) is None  # the old epoch's records, all of which the leader holds
    assert diverging(log, r, 0, 90) is None
    assert diverging(log, r, 0, 130) == (0, 100)  # the old leader, back with 30 records nobody else had
    assert r.epoch_ends == {0: (0, 100)}  # kept: an earlier epoch's end cannot move while this one leads
    log.reads = 0
    assert diverging(log, r, 0, 130) == (0, 100) and log.reads == 0
    assert diverging(log, r, 1, 151) == (1, 150)  # past the leader's end in its own epoch


def test_an_isr_falling_below_min_insync_keeps_the_watermarks_it_had_for_the_waiters():
    r = leader(isr=(0, 1, 2), min_isr=2)
    r.fetched(1, 40, 30, 100, 1 * MS)
    r.fetched(2, 50, 20, 100, 1 * MS)
    assert (r.hw_at(100), r.durable_hw_at(100)) == (40, 20)
    r.update(P.LeaderAndIsrRequest(0, 3, [0, 1, 2], [0, 1], 2, 1000), 2 * MS)  # still 2: not short
    assert r.shrunk is None and not r.short()
    r.update(P.LeaderAndIsrRequest(0, 3, [0, 1, 2], [0], 2, 1000), 3 * MS)
    assert r.short() and r.shrunk == (40, 20)  # acks past these are refused NOT_ENOUGH_REPLICAS (actors/produce.py)
    assert r.hw_at(100) == 100  # the leader alone: its own end (reads may go on; acks=all may not)
