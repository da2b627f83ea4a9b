"""The sticky min-heap scheduler as a pure object."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tailrace.router.scheduler import StickyScheduler


def test_new_partitions_go_to_the_least_loaded_worker_ties_to_lowest_id():
    s = StickyScheduler(3)
    assert [s.place(slot) for slot in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_placed_partition_is_sticky():
    s = StickyScheduler(2)
    first = s.place(10)
    for slot in range(20):
        s.place(slot)
    assert s.place(10) == first


def test_release_makes_room_and_stale_heap_entries_are_skipped():
    s = StickyScheduler(2)
    for slot in range(4):
        s.place(slot)  # 0,1 -> w0 has 0,2 ; w1 has 1,3
    s.release(0)
    s.release(2)
    assert s.load == {0: 0, 1: 2}
    assert s.place(100) == 0 and s.place(101) == 0


def test_weights_count_in_the_load():
    s = StickyScheduler(2)
    s.place(0, weight=5)
    assert [s.place(i) for i in range(1, 6)] == [1, 1, 1, 1, 1]
    assert s.place(6) == 0 and s.load == {0: 6, 1: 5}  # a tie goes to the lower id


def test_traffic_from_heartbeats_steers_new_partitions_to_the_less_busy_worker():
    s = StickyScheduler(2)
    assert [s.place(slot) for slot in range(4)] == [0, 1, 0, 1]
    s.set_traffic(0, 5.0)  # worker 0 holds requests / appends MiB/s: its key is 2 + 5
    assert s.total(0) == 7.0 and s.total(1) == 2.0
    assert [s.place(slot) for slot in range(4, 9)] == [1, 1, 1, 1, 1]  # until worker 1 reaches 7
    assert s.place(9) == 0  # a tie (7 vs 7) goes to the lower id
    s.set_traffic(0, 0.0)  # traffic gone: only partition counts (3 vs 7) are left
    assert s.place(10) == 0 and s.load == {0: 4, 1: 7}


def test_heap_stays_bounded_under_churn():
    s = StickyScheduler(4)
    for i in range(10_000):
        s.place(i)
        if i % 2:
            s.release(i - 1)
    assert len(s._heap) <= 4 * 4 + 16 + 1


def test_no_live_worker_is_an_error():
    s = StickyScheduler(1)
    s.alive.clear()
    with pytest.raises(RuntimeError):
        s.place(1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200), st.integers(1, 5))
def test_every_partition_has_exactly_one_owner_and_loads_add_up(ops, workers):
    s = StickyScheduler(workers)
    for place, slot in ops:
        if place:
            w = s.place(slot)
            assert s.place(slot) == w
        else:
            s.release(slot)
        assert sum(s.load.values()) == len(s.owner)
        assert all(0 <= w < workers for w in s.owner.values())
    if all(p for p, _ in ops):
        assert max(s.load.values()) - min(s.load.values()) <= 1


from tailrace.router.scheduler import Rebalancer


def _two_workers_with(loads_w0, loads_w1):
    s = StickyScheduler(2)
    load = {}
    slot = 0
    for w, loads in ((0, loads_w0), (1, loads_w1)):
        for lo in loads:
            s.owner[slot] = w
            s.weight[slot] = 1
            s.load[w] += 1
            load[slot] = lo
            slot += 1
    return s, load


def test_rebalance_moves_an_idle_cool_partition_off_the_hot_worker():
    s, load = _two_workers_with([8.0, 1.0, 1.0], [1.0])
    plan = Rebalancer().plan(s, load, busy=set(), now=100.0)
    assert plan is not None and plan[1:] == (0, 1)
    assert load[plan[0]] == 1.0  # the hot partition (8.0) is more than half the gap: it stays


def test_an_imbalance_must_last_persist_s_before_anything_moves():
    s, load = _two_workers_with([8.0, 1.0, 1.0], [1.0])
    r = Rebalancer(persist_s=3.0)
    assert r.plan(s, load, busy=set(), now=100.0) is None  # imbalance begins
    assert r.plan(s, load, busy=set(), now=102.0) is None  # 2 s: not yet
    even = {0: 0.5, 1: 0.25, 2: 0.25, 3: 1.0}  # a beat where the loads even out (1 vs 1) resets the clock
    assert r.plan(s, even, busy=set(), now=102.5) is None
    assert r.plan(s, load, busy=set(), now=104.0) is None  # begins again at 104
    assert r.plan(s, load, busy=set(), now=106.5) is None
    plan = r.plan(s, load, busy=set(), now=107.0)
    assert plan is not None and plan[1:] == (0, 1)
    r.moved(plan[0], 107.0)
    r.interval_s = 2.0
    assert r.plan(s, even, busy=set(), now=108.0) is None  # a break inside the move interval...
    assert r.plan(s, load, busy=set(), now=109.5) is None  # ...resets the clock: 1.5 s is not 3


def test_inside_the_hysteresis_band_nothing_moves():
    s, load = _two_workers_with([2.0, 2.0], [3.0])  # 4 vs 3: under 1.5x
    assert Rebalancer().plan(s, load, set(), now=100.0) is None
    s, load = _two_workers_with([0.6, 0.6], [0.2])  # 1.2 vs 0.2 but a gap under min_gap
    assert Rebalancer().plan(s, load, set(), now=100.0) is None


def test_a_partition_with_requests_in_flight_never_moves_and_moves_cool_down():
    s, load = _two_workers_with([8.0, 1.0, 1.0], [1.0])
    r = Rebalancer(interval_s=0)
    assert r.plan(s, load, busy={1, 2}, now=100.0) is None
    slot, src, dst = r.plan(s, load, busy=set(), now=100.0)
    s.move(slot, dst)
    r.moved(slot, 100.0)
    again = r.plan(s, load, busy=set(), now=101.0)
    assert again is None or again[0] != slot  # cooled down: the same partition does not bounce


def test_evacuating_a_dead_worker_moves_all_its_partitions_to_live_ones():
    s = StickyScheduler(3)
    for slot in range(9):
        s.place(slot)
    s.mark_dead(1)
    moved = s.evacuate(1)
    assert sorted(m[0] for m in moved) == [1, 4, 7]
    assert all(w in (0, 2) for _slot, w in moved) and not s.partitions_of(1)
    s.mark_alive(1)
    assert s.place(100) == 1  # back and least loaded


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["place", "release", "dead", "alive", "rebalance", "traffic"]), st.integers(0, 30)), max_size=150))
def test_every_partition_has_exactly_one_owner_and_epochs_only_grow(ops):
    s = StickyScheduler(3)
    r = Rebalancer(interval_s=0, cooldown_s=0, min_gap=0.1)
    epoch = {}  # slot -> last epoch handed out (the router bumps it on every placement change)
    counter = 0
    for i, (op, x) in enumerate(ops):
        if op == "place" and s.alive:
            if x not in s.owner:
                lowest = min(s.total(w) for w in s.alive)
                assert s.total(s.place(x)) - 1 == lowest, "a new partition went to a busier worker"
                counter += 1
                epoch[x] = counter
        elif op == "release":
            s.release(x)
        elif op == "dead" and len(s.alive) > 1:
            w = x % 3
            s.mark_dead(w)
            for slot, _to in s.evacuate(w):
                counter += 1
                assert counter > epoch.get(slot, 0)
                epoch[slot] = counter
        elif op == "alive":
            s.mark_alive(x % 3)
        elif op == "traffic":
            s.set_traffic(x % 3, (x % 7) * 0.75)
        elif op == "rebalance":
            load = {slot: float((slot * 7) % 5) for slot in s.owner}
            plan = r.plan(s, load, set(), now=float(i))
            if plan:
                slot, src, dst = plan
                assert s.owner[slot] == src and dst in s.alive
                s.move(slot, dst)
                r.moved(slot, float(i))
                counter += 1
                assert counter > epoch.get(slot, 0)
                epoch[slot] = counter
        assert sum(s.load.values()) == len(s.owner)
        assert sum(len(s.partitions_of(w)) for w in range(3)) == len(s.owner)  # one owner each
        assert all(s.owner[slot] in s.alive for slot in s.owner), "a partition left on a dead worker"


def test_a_new_worker_takes_partitions_only_once_alive_and_spread_evens_counts_moving_only_idle_ones():
    s = StickyScheduler(1)
    for slot in range(8):
        s.place(slot)
    s.add_worker(1)
    assert s.place(8) == 0, "a worker that has not answered yet got a partition"
    assert s.spread() == ([], True)  # only one live worker: nothing to spread to
    s.mark_alive(1)
    moves, balanced = s.spread(busy={8, 7, 6, 5, 4, 3})
    assert balanced is False and [m[0] for m in moves] == [2, 1, 0]  # busy ones stay; the idle ones go
    assert all(src == 0 and dst == 1 for _slot, src, dst in moves)
    moves, balanced = s.spread(busy=set())
    assert balanced and sorted(len(s.partitions_of(w)) for w in (0, 1)) == [4, 5]


def test_a_retired_worker_is_forgotten_only_once_it_owns_nothing():
    s = StickyScheduler(3)
    for slot in range(6):
        s.place(slot)
    s.mark_dead(2)  # retiring: takes nothing new
    with pytest.raises(ValueError):
        s.forget(2)
    for slot in s.partitions_of(2):
        s.move(slot, s.least_loaded())
    s.forget(2)
    assert 2 not in s.load and sorted(s.owner.values()).count(2) == 0
    assert sum(s.load.values()) == 6 and sorted(len(s.partitions_of(w)) for w in (0, 1)) == [3, 3]
