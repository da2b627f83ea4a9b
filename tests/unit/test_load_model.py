"""router/load.py: partition loads from heartbeats, pure (time passed in), like the scheduler."""

from __future__ import annotations

import pytest

from tailrace.router.load import HELD_DECAY, RATE_UNIT, LoadModel


def test_an_append_rate_of_one_mib_per_second_converges_to_one_unit_of_load():
    m = LoadModel()
    for _ in range(20):
        total = m.beat([1], 0.5, {1: 1 << 19}, [], {})  # 0.5 MiB each half second
    assert m.slot_load(1) == pytest.approx(1.0, rel=1e-4)
    assert total == pytest.approx(m.slot_load(1))


def test_the_rate_halves_each_silent_beat_and_held_requests_halve_every_four():
    m = LoadModel()
    m.beat([1, 2], 1.0, {1: int(RATE_UNIT) * 2}, [2], {2: 8})
    rate0, held0 = m.rate[1], m.held[2]
    assert rate0 == pytest.approx(RATE_UNIT) and held0 == pytest.approx(8 * (1 - HELD_DECAY))
    for _ in range(4):
        m.beat([1, 2], 1.0, {}, [], {})
    assert m.rate[1] == pytest.approx(rate0 / 16)
    assert m.held[2] == pytest.approx(held0 / 2)


def test_busy_is_what_the_owner_said_at_its_last_beat_and_only_for_its_own_slots():
    m = LoadModel()
    m.beat([1, 2], 1.0, {}, [1, 2, 9], {1: 1, 2: 1, 9: 5})  # 9 is not this worker's
    assert m.busy == {1, 2} and 9 not in m.held
    m.beat([3], 1.0, {}, [3], {3: 1})  # another worker's beat leaves these alone
    assert m.busy == {1, 2, 3}
    m.beat([1, 2], 1.0, {}, [2], {2: 1})
    assert m.busy == {2, 3}


def test_beats_closer_than_the_floor_do_not_spike_the_rate():
    m = LoadModel()
    m.beat([1], 0.001, {1: 1 << 20}, [], {})
    assert m.rate[1] == pytest.approx(0.5 * (1 << 20) / 0.1)


def test_a_slot_never_heard_of_has_no_load():
    assert LoadModel().slot_load(42) == 0.0
