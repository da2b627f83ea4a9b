"""Retention against topics made and deleted while it runs (issue: a new topic's records deleted).

A retention pass reads the catalog, then decides which journal segments no partition needs and
deletes them. Between the read and the delete the router may delete a topic, give its cleared
slot to a new topic, and that topic's owner may write and the flusher flush and checkpoint
records into segments the pass then looks at. Whatever the pass read, it must keep every segment
holding a record of a live partition. Real Flusher, actor, files and shared memory, in one
process (bench/inprocess.py), so the interleaving is exact.
"""

from __future__ import annotations

import time

from tailrace.actors.partition import PartitionActor
from tailrace.bench.inprocess import make_storage
from tailrace.broker.catalog import Catalog
from tailrace.broker.datadir import file_signature
from tailrace.client.records import encode_batch
from tailrace.persistence.index import IndexFile
from tailrace.persistence.journal import list_segments
from tailrace.persistence.retire import free_slots
from tailrace.shm.layout import COL

SEGMENT = 1 << 20
VALUE = b"r" * 100
PER_BATCH = 100  # ~12 KiB a batch, under the 16 KiB the helper below allows


def _fill(st, actor, segments: int) -> int:
    """Append and flush 100 B records until the journal's head is ``segments`` segments on; the count."""
    f, n = st.flusher, 0
    until = f.journal.segment_start + segments * SEGMENT
    while f.journal.segment_start < until:
        code = actor.append(encode_batch([VALUE] * PER_BATCH), 1 << 14)[0]
        if code == 0:
            n += PER_BATCH
        f.do_work()
        f.sync()
    while f.do_work():
        pass
    f.sync()
    f.checkpoint()  # recovery starts past these segments: only retention's pin keeps them
    return n


def _read_all(actor, end: int) -> int:
    """Records read back from the journal for offsets [0, end) of the actor's partition."""
    got, offset = 0, 0
    while offset < end:
        res = actor._read_disk(offset, 1 << 20, 1 << 20, end)
        assert res.code == 0, f"offset {offset} of {end}: code {res.code}"
        assert res.next_offset > offset
        got += res.next_offset - offset
        offset = res.next_offset
    return got


def test_a_topic_made_written_and_flushed_between_a_passs_catalog_read_and_its_delete_keeps_every_segment(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    st = make_storage(tmp_path / "data", partitions=1, segment_bytes=SEGMENT, ipc_dir=str(tmp_path / "run"),
                      retention_ms=1)  # every record expires at once
    f, s, r = st.flusher, st.s, st.flusher.retention
    try:
        router = Catalog(s.data_dir)  # the router's writer of the same file
        old = st.actors.pop()
        old_end = _fill(st, old, 6)
        time.sleep(0.01)
        r.run(time.monotonic_ns())  # the old topic's records expire: its log start is stored
        assert r.starts.get(0, 0) == old_end

        # The pass under test reads the catalog now: slot 0 is the old topic's, with its start.
        f.catalog.reload(force=True)
        seen = f.catalog.data

        # Meanwhile: the old topic is deleted and its slot cleared, then a new topic takes the
        # slot and writes and flushes fewer records than the old one had, over three segments.
        router.delete_topic("t")
        old.close()
        assert f.retirer.run(time.monotonic_ns()) == 1
        # as if the pass had read its starts before the retirer forgot them: the old topic's
        r.starts[0], r.start_topics[0] = old_end, seen.topics["t"].topic_id
        t2 = router.add_topic("t2", 1, s.ring_bytes, free=free_slots(router, s))
        assert t2.slots == [0]
        IndexFile(s.data_dir, 0, writable=True).close()  # made with the topic (router._prepare_slots)
        new = PartitionActor(f.table, s.instance, 0, t2.topic_id, 0, s.ring_bytes, 1, s.data_dir, st.journal,
                             str(tmp_path / "data"))
        st.actors.append(new)
        f.rescan()
        first_segment = f.journal.segment_start
        new_end = _fill(st, new, 3)
        assert new_end <= old_end  # so the old topic's start says "all expired" of the new records too
        assert f.table.rows[0, COL["flushed_offset"]] == new_end

        # The pass goes on from what it read: its catalog, its starts, and it deletes.
        f.catalog.data, f.catalog._seen = seen, file_signature(f.catalog.path)
        r.delete_segments()
        assert first_segment in list_segments(r.journal_dir), \
            f"the new topic's first segment {first_segment} was deleted (pinned by slot {r.pinned_by})"
        assert r.pinned_by == 0
        assert _read_all(new, new_end) == new_end  # every acknowledged record still reads back
    finally:
        st.close()
