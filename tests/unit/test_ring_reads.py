"""Reads from the ring and from disk always return the batch that holds the asked offset."""

from __future__ import annotations

import random

from client.records import encode_batch, iter_batches

from .storage import append_numbered, make_storage


def test_random_appends_flushes_and_reads_always_return_the_right_batch(tmp_path):
    st = make_storage(tmp_path / "data", partitions=1, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      segment_bytes=1 << 20, write_buffer_bytes=64 * 1024)
    actor = st.actors[0]
    rng = random.Random(3)
    sources = {"ring": 0, "disk": 0}
    try:
        for step in range(3000):
            op = rng.random()
            if op < 0.5:
                append_numbered(st, actor, rng.randint(1, 40))
            elif op < 0.7:
                st.flusher.do_work()
            elif actor.high_watermark:
                off = rng.randrange(actor.high_watermark)
                res = actor.read(off, rng.choice([1, 4096, 1 << 20]), rng.choice([1, 10, 1 << 20]), "memory")
                if not res.parts:
                    continue
                sources[res.source] += 1
                views = iter_batches(b"".join(res.parts))
                first = views[0]
                assert first.base_offset <= off < first.base_offset + first.record_count, (step, off, res.source)
                expect = first.base_offset
                for v in views:
                    assert v.base_offset == expect, (step, off, res.source)
                    assert [v.value(i) for i in range(v.record_count)] == [b"%d" % (v.base_offset + i) for i in range(v.record_count)]
                    expect += v.record_count
                assert res.next_offset == expect
        assert sources["ring"] > 100 and sources["disk"] > 100, sources
    finally:
        st.close()


def test_a_batch_ending_exactly_at_the_ring_end_is_flushed_and_read_whole(tmp_path):
    """Positions stay contiguous across such a lap boundary while the bytes restart at 0."""
    st = make_storage(tmp_path / "data", partitions=1, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      segment_bytes=1 << 20, write_buffer_bytes=256 * 1024)
    actor = st.actors[0]
    value = b"v" * (4096 - 64 - 8)  # header + offsets (2 x int32) + value = exactly 4096 bytes
    try:
        for i in range(40):  # 16 frames fill the ring exactly; later laps start at byte 0
            assert actor.append(encode_batch([value]), 1 << 14)[0] == 0
            if i % 10 == 9:
                st.flusher.do_work()
        res = actor.read(8, 1 << 20, 1 << 20, "memory")  # spans a lap boundary in the ring
        assert [v.base_offset for v in iter_batches(b"".join(res.parts))] == list(range(8, 8 + len(iter_batches(b"".join(res.parts)))))
        assert res.next_offset == 40
        st.flusher.do_work()
        disk = actor._read_disk(0, 1 << 20, 1 << 20, 40)
        views = iter_batches(b"".join(disk.parts))
        assert [v.base_offset for v in views] == list(range(len(views))) and disk.next_offset == len(views)
        assert all(v.value(0) == value for v in views)
    finally:
        st.close()


def test_the_flusher_stages_a_partition_activated_after_its_scan_once_it_rescans(tmp_path, monkeypatch):
    """The flusher's cycles look only at the rows active at its last full scan; a partition a
    worker adopts later is staged (and made durable) after the rescan its kick b"N" causes, and
    untouched before it, with nothing lost."""
    from actors.partition import PartitionActor
    from client.catalog import Catalog
    from persistence import flusher as flusher_mod
    from shm.layout import COL

    monkeypatch.setattr(flusher_mod, "RESCAN_NS", 1 << 62)  # no timed rescan during the test
    st = make_storage(tmp_path / "data", partitions=1)
    try:
        topic = Catalog(st.s.data_dir).add_topic("late", 1, 64 * 1024)
        late = PartitionActor(st.flusher.table, st.s.instance, topic.slots[0], topic.topic_id, 0, 64 * 1024, 1,
                              st.s.data_dir, st.journal, str(tmp_path / "data"))
        st.actors.append(late)
        assert topic.slots[0] not in st.flusher.slots.tolist()
        for i in range(5):
            assert late.append(encode_batch([b"%d" % i]), 1 << 14)[0] == 0
        st.flusher.do_work()
        st.flusher.sync()
        assert int(late.row[COL["flushed_offset"]]) == 0 and int(late.row[COL["durable_offset"]]) == 0
        st.flusher.rescan()
        st.flusher.do_work()
        st.flusher.sync()
        assert int(late.row[COL["durable_offset"]]) == 5
        views = iter_batches(b"".join(late.read(0, 1 << 20, 1 << 20, "durable").parts))
        assert [v.value(0) for v in views] == [b"%d" % i for i in range(5)]
    finally:
        st.close()
