"""The quota arithmetic on real shared memory: per-writer tallies summed over writers, and the
hold a principal's bytes earn (broker/quota.py, shm/tally.py)."""

from __future__ import annotations

import os
import uuid

import pytest

from tailrace.broker import quota
from tailrace.shm import region
from tailrace.shm.tally import KEYS, TableFull, Tally, key_of, tally_name


@pytest.fixture
def instance():
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    region.unlink(tally_name(name))


def test_tallies_of_several_writers_sum_and_a_restarted_writer_counts_on(instance):
    a, b = Tally(instance, 0), Tally(instance, 7)
    k = key_of("alice")
    a.add(k, 0, 100)
    b.add(k, 0, 20)
    b.add(k, 1, 5)
    assert a.total(k, 0) == b.total(k, 0) == 120 and a.total(k, 1) == 5
    # keys that collide in their home cell: the second is displaced, and still found everywhere
    other = k + KEYS  # same key % KEYS
    b.add(other, 0, 3)
    a.add(other, 0, 4)
    assert a.total(other, 0) == b.total(other, 0) == 7 and a.total(k, 0) == 120
    assert a.latest(k, 0) == 0  # no marks yet
    a.mark(k, 0, 50)
    b.mark(k, 0, 70)
    b.mark(other, 1, 9)
    assert a.latest(k, 0) == b.latest(k, 0) == 70 and a.latest(other, 1) == 9 and a.latest(k, 1) == 0
    b.close()
    again = Tally(instance, 7)  # a writer restarted after a crash finds its cells where they were
    again.add(k, 0, 1)
    assert a.total(k, 0) == 121
    assert key_of("alice") == key_of("alice") != key_of("bob")


def test_a_full_block_refuses_another_key(instance):
    t = Tally(instance, 1)
    for i in range(KEYS):
        t.add(i + 1, 0, 1)
    with pytest.raises(TableFull):
        t.add(KEYS + 5, 0, 1)


def test_holds_pay_the_debt_at_the_rate_across_workers_and_idle_credit_is_capped(tmp_path, instance):
    quota.set_quota(str(tmp_path), quota.Quota("slow", producer_byte_rate=1000, consumer_byte_rate=0))
    w0 = quota.Throttle(str(tmp_path), instance, 0)
    w1 = quota.Throttle(str(tmp_path), instance, 1)
    assert w0.charge("fast", quota.PRODUCE, 10**9, 0.0) == 0  # no quota: never held
    assert w0.charge("slow", quota.FETCH, 10**9, 0.0) == 0  # no fetch quota
    assert w0.charge("slow", quota.PRODUCE, 500, 100.0) == 500  # 500 B at 1000 B/s: 0.5 s
    # first sight on w1: it starts where w0 left the clock (100.5), then its own 500 B
    assert w1.allowance("slow", quota.PRODUCE, 100.0) == pytest.approx(1000 * 1.5, abs=2)
    assert w1.charge("slow", quota.PRODUCE, 500, 100.0) == 1000
    # w0 sees w1's 500 B too: the debt is 1 s past 100.0 plus its own 500 B
    assert w0.charge("slow", quota.PRODUCE, 500, 100.0) == 1500
    assert w0.charge("slow", quota.PRODUCE, 10_000, 100.0) == quota.MAX_HOLD_MS  # held at most 2 s...
    assert w0.charge("slow", quota.PRODUCE, 0, 105.0) == quota.MAX_HOLD_MS  # 6.5 s of debt left at 105.0
    # ...and the debt beyond waits for the next request (11.5 s of bytes by 100.0: clear at 111.5)
    assert w0.charge("slow", quota.PRODUCE, 0, 112.0) == 0
    # idle for long: at most BURST_S of credit, so 2 s of bytes at once are held about 1 s
    assert 900 <= w0.charge("slow", quota.PRODUCE, 2000, 200.0) <= 1000
    assert w0.allowance("slow", quota.PRODUCE, 200.0) == pytest.approx(1000 * (2.0 - 1.0), abs=2)
    assert w0.allowance("fast", quota.PRODUCE, 200.0) is None
    quota.remove_quota(str(tmp_path), "slow")
    w0._seen = "stale"
    w0.refresh()
    assert w0.charge("slow", quota.PRODUCE, 10**9, 300.0) == 0
    w0.close()
    w1.close()


def test_the_default_quota_gives_each_principal_a_budget_of_its_own(tmp_path, instance):
    quota.set_quota(str(tmp_path), quota.Quota(quota.DEFAULT, producer_byte_rate=1000))
    t = quota.Throttle(str(tmp_path), instance, 0)
    assert t.charge("a", quota.PRODUCE, 1000, 0.0) == 1000
    assert t.charge("b", quota.PRODUCE, 1000, 0.0) == 1000  # not 2000: b's own budget
    assert t.charge("router", quota.PRODUCE, 10**9, 0.0) == 0  # the router itself is never held
    assert quota.local_principal(os.geteuid()).startswith("unix:")
    t.close()
