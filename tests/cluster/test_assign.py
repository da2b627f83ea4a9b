"""cluster/assign.py: placement by partition count, pure."""

from __future__ import annotations

import pytest

from tailrace.cluster.assign import partition_counts, place


def test_new_partitions_go_to_the_brokers_holding_the_fewest_ties_to_the_lower_id():
    assert place({1: 0, 2: 0, 3: 0}, 7) == [1, 2, 3, 1, 2, 3, 1]
    assert place({1: 5, 2: 0, 3: 1}, 4) == [2, 2, 3, 2]


def test_counts_leave_out_brokers_that_are_not_live():
    assert partition_counts([1, 3], [[1], [2], [3], [3], [2, 1]]) == {1: 2, 3: 2}


def test_placing_with_no_broker_is_refused():
    with pytest.raises(ValueError, match="no broker"):
        place({}, 1)
    assert place({}, 0) == []
