"""cluster/assign.py: placement by partition count, pure."""

from __future__ import annotations

import pytest

from tailrace.cluster.assign import partition_counts, place, place_replicas


def test_new_partitions_go_to_the_brokers_holding_the_fewest_ties_to_the_lower_id():
    assert place({1: 0, 2: 0, 3: 0}, 7) == [1, 2, 3, 1, 2, 3, 1]
    assert place({1: 5, 2: 0, 3: 1}, 4) == [2, 2, 3, 2]


def test_counts_leave_out_brokers_that_are_not_live():
    assert partition_counts([1, 3], [[1], [2], [3], [3], [2, 1]]) == {1: 2, 3: 2}


def test_placing_with_no_broker_is_refused():
    with pytest.raises(ValueError, match="no broker"):
        place({}, 1)
    assert place({}, 0) == []


def test_measured_load_tilts_where_new_partitions_go():
    # equal counts; broker 1 carries three times the traffic of the others: it gets fewer
    assert place({1: 4, 2: 4, 3: 4}, 6, {1: 3e6, 2: 1e6, 3: 1e6}) == [2, 3, 2, 3, 2, 3]
    # loads equal (or none published): counts alone, as without loads
    assert place({1: 5, 2: 0, 3: 1}, 4, {1: 7e6, 2: 7e6, 3: 7e6}) == place({1: 5, 2: 0, 3: 1}, 4) == [2, 2, 3, 2]
    assert place({1: 0, 2: 0}, 4, {1: 0.0, 2: 0.0}) == [1, 2, 1, 2]
    # a trickle against idle brokers decides nothing (the 1 MB/s floor): still 2 each
    assert sorted(place({0: 0, 1: 0, 2: 0}, 6, {0: 120.0, 1: 0.0, 2: 0.0})) == [0, 0, 1, 1, 2, 2]
    # a broker that published nothing (just joined) counts as the mean; counts still outweigh
    # load in the end: the busy broker takes its share once the others hold more
    chosen = place({1: 2, 2: 2, 3: 2}, 12, {1: 2e6, 2: 1e6})
    assert chosen[:2] == [2, 3] and 0 < chosen.count(1) <= chosen.count(2)
    assert place({1: 0, 2: 0, 3: 0}, 6, {1: 9e6, 2: 1e6, 3: 1e6}).count(1) == 1


def test_replicas_go_to_distinct_brokers_and_leaders_spread_as_evenly_as_replicas():
    sets = place_replicas({0: 0, 1: 0, 2: 0}, 6, 3)
    assert all(sorted(r) == [0, 1, 2] for r in sets)
    assert [r[0] for r in sets] == [0, 1, 2, 0, 1, 2]  # each leads two
    sets = place_replicas({0: 0, 1: 0, 2: 0, 3: 0}, 8, 2)
    assert all(len(set(r)) == 2 for r in sets)
    held = partition_counts([0, 1, 2, 3], sets)
    assert held == {0: 4, 1: 4, 2: 4, 3: 4}
    assert sorted(r[0] for r in sets) == [0, 0, 1, 1, 2, 2, 3, 3]
    # leaders already held count: a broker leading much gets none of the new leaders
    assert all(r[0] != 0 for r in place_replicas({0: 3, 1: 3, 2: 3}, 2, 3, leaders={0: 3, 1: 0, 2: 0}))
    # a factor of 1 is place()
    assert [r[0] for r in place_replicas({1: 5, 2: 0, 3: 1}, 4, 1)] == place({1: 5, 2: 0, 3: 1}, 4)
    assert [r[0] for r in place_replicas({1: 4, 2: 4, 3: 4}, 6, 1, {1: 3e6, 2: 1e6, 3: 1e6})] == [2, 3, 2, 3, 2, 3]


def test_a_replication_factor_above_the_live_brokers_is_refused():
    with pytest.raises(ValueError, match="replication factor 3 needs 3 live brokers, 2 are"):
        place_replicas({0: 0, 1: 0}, 1, 3)
    with pytest.raises(ValueError):
        place_replicas({0: 0}, 1, 0)
    assert place_replicas({0: 0}, 0, 5) == []
