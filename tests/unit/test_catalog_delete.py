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


def test_the_retirer_lets_go_of_a_slot_a_new_topic_took_after_it_read_the_catalog(tmp_path):
    """The race the 200-topics delete test hit (persistence/retire.py, step 1): a pass reads the
    catalog, then the router gives a slot an earlier pass cleared to a new topic (catalog, index
    file) and its new owner appends before it holds the slot's lock. The pass finds the slot not
    clear and its lock free: it must read the catalog again and leave the slot alone, not zero
    the live row and unlink the ring its owner appends to. Real Flusher, actors, files and
    shared memory, in one process (bench/inprocess.py)."""
    import time

    from tailrace.actors.partition import PartitionActor
    from tailrace.bench.inprocess import append_numbered, make_storage
    from tailrace.broker.datadir import file_signature
    from tailrace.persistence.index import IndexFile
    from tailrace.persistence.retire import cleared, free_slots
    from tailrace.shm import region
    from tailrace.shm.layout import COL

    (tmp_path / "run").mkdir(mode=0o700)  # where the slots' lock files are (no broker made it)
    st = make_storage(tmp_path / "data", partitions=1, ipc_dir=str(tmp_path / "run"))
    f, s = st.flusher, st.s
    try:
        router = Catalog(s.data_dir)  # the router's writer of the same file
        old = st.actors.pop()
        append_numbered(st, old, 5)
        f.do_work()
        router.delete_topic("t")
        old.close()  # its worker let go
        assert f.retirer.run(time.monotonic_ns()) == 1 and cleared(s, 0)
        seen = f.catalog.data  # this pass's view: slot 0 retired

        t2 = router.add_topic("t2", 1, s.ring_bytes, free=free_slots(router, s))
        assert t2.slots == [0]
        IndexFile(s.data_dir, 0, writable=True).close()  # made with the topic (router._prepare_slots)
        new = PartitionActor(f.table, s.instance, 0, t2.topic_id, 0, s.ring_bytes, 1, s.data_dir, st.journal,
                             str(tmp_path / "data"))
        st.actors.append(new)
        append_numbered(st, new, 3)

        f.catalog.data, f.catalog._seen = seen, file_signature(f.catalog.path)  # read before the router wrote
        f.retirer.next_ns = 0
        assert f.retirer.run(time.monotonic_ns()) == 0
        row = f.table.rows[0]
        assert row[COL["active"]] == 1 and row[COL["topic_id"]] == t2.topic_id and row[COL["next_offset"]] == 3
        assert region.exists(region.ring_name(s.instance, 0))
        f.rescan()
        assert f.do_work() > 0 and row[COL["flushed_offset"]] == 3  # staged from the ring it still has
    finally:
        st.close()
