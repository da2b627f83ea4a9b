"""The catalog's side of topic delete (broker/catalog.py): retired slots, their reuse once free,
and which journal topic ids name deleted topics."""

from __future__ import annotations

import numpy as np

from tailrace.broker.catalog import Catalog


def test_deleted_slots_are_retired_and_reused_lowest_first_only_when_free(tmp_path):
    c = Catalog(tmp_path)
    a = c.add_topic("a", 3, 1 << 20)
    b = c.add_topic("b", 2, 1 << 20)
    assert (a.slots, b.slots, a.topic_id, b.topic_id) == ([0, 1, 2], [3, 4], 1, 2)
    gone = c.delete_topic("a")
    assert gone.slots == [0, 1, 2] and c.data.retired == [0, 1, 2] and c.get("a") is None
    assert c.slots_available(8, free=[]) == 3 and c.slots_available(8, free=[1, 2]) == 5
    again = c.add_topic("a", 3, 1 << 20, free=[2, 0])  # only the cleared ones, lowest first, then new
    assert again.slots == [0, 2, 5] and again.topic_id == 3 and c.data.retired == [1] and c.data.next_slot == 6
    grown = c.add_partitions("b", 3, free=[1])
    assert grown.slots == [3, 4, 1] and c.data.retired == []
    reread = Catalog(tmp_path)  # durable, and the slot map follows
    assert reread.data.retired == [] and reread.topic_of_slot(1)[0].name == "b" and reread.topic_of_slot(5)[0].topic_id == 3
    ids = np.array([0, 1, 2, 3, 4, 99])
    assert reread.deleted_topic_ids(ids).tolist() == [False, True, False, False, False, False]
