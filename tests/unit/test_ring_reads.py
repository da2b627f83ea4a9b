"""Reads from the ring and from disk always return the batch that holds the asked offset."""

from __future__ import annotations

import random
from pathlib import Path

from tailrace.client.protocol import ErrorCode
from tailrace.client.records import encode_batch, iter_batches
from tailrace.shm.layout import COL

from tailrace.bench.inprocess import append_numbered, make_storage


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
    from tailrace.actors.partition import PartitionActor
    from tailrace.broker.catalog import Catalog
    from tailrace.persistence import flusher as flusher_mod
    from tailrace.shm.layout import COL

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


def _stage_run(data_dir, monkeypatch, small: bool, frames: list, plan: list) -> dict:
    """Run ``plan`` (("append", partition, frame index) / ("cycle",)) on a fresh storage stack
    with the flusher's plain-Python staging on or off; returns the journal's and the indexes'
    bytes, and how often each staging path staged."""
    from tailrace.actors import partition as partition_mod
    from tailrace.persistence import flusher as flusher_mod

    clock = iter(range(1, 1 << 40))
    monkeypatch.setattr(partition_mod, "now_us", lambda: next(clock))  # the append time is in the frame
    monkeypatch.setattr(flusher_mod, "SMALL_RUN", 16 if small else 0)
    st = make_storage(data_dir, partitions=3, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      segment_bytes=128 * 1024, write_buffer_bytes=32 * 1024)
    fl, used = st.flusher, {"small": 0, "numpy": 0}
    stage_small = fl._stage_small

    def counting(*args):
        staged = stage_small(*args)
        used["small" if staged is not None else "numpy"] += 1
        return staged

    fl._stage_small = counting
    published = []  # each cycle's flushed_* columns: what the rings free and the readers trust
    cols = [COL[c] for c in ("flushed_position", "flushed_desc", "flushed_offset")]
    try:
        for step in plan:
            published.append(fl.table.rows[[a.slot for a in st.actors]][:, cols].tolist())
            if step[0] == "append":
                actor = st.actors[step[1]]
                code = actor.append(frames[step[2]], 1 << 14)[0]
                if code == ErrorCode.BACKPRESSURE:
                    fl.do_work()  # a full ring: let the flusher drain it (the same in both runs)
                assert code in (ErrorCode.OK, ErrorCode.BACKPRESSURE), code
            else:
                fl.do_work()
        fl.do_work()
        fl.sync()
        data = Path(st.s.data_dir)
        files = {str(p.relative_to(data)): p.read_bytes() for sub in ("journal", "index") for p in sorted((data / sub).iterdir())}
        assert all(int(a.row[COL["flushed_offset"]]) == a.high_watermark for a in st.actors)
        assert all(int(a.row[COL["flushed_position"]]) == int(a.row[COL["write_position"]]) for a in st.actors)
    finally:
        st.close()
    return {"files": files, "published": published, **used}


def test_the_flusher_plain_python_staging_writes_the_same_journal_and_indexes_as_numpy(tmp_path, monkeypatch):
    """A cycle stages a partition's few one-record batches without numpy
    (``Flusher._stage_small``): journal segments and index files come out byte for byte as the
    numpy path writes them, over runs that mix in batches of several records, do not fit the
    staging buffer, roll segments and lap the rings; and every cycle publishes the same flushed
    positions."""
    rng = random.Random(11)
    frames = [encode_batch([b"%d-%d" % (i, j) * rng.randint(1, 20) for j in range(n)], create_time_us=i)
              for i, n in enumerate(rng.choice([1] * 12 + [2, 9, 80]) for _ in range(64))]
    plan = []
    for _ in range(3000):
        r = rng.random()
        plan.append(("append", rng.randrange(3), rng.randrange(len(frames))) if r < 0.8 else ("cycle",))
    small = _stage_run(tmp_path / "small", monkeypatch, True, frames, plan)
    numpy_only = _stage_run(tmp_path / "numpy", monkeypatch, False, frames, plan)
    assert small["small"] > 100 and small["numpy"] > 10, small  # both paths ran, and the fallback
    assert numpy_only["small"] == 0
    assert len([f for f in small["files"] if f.startswith("journal")]) > 3  # segments rolled
    assert small["published"] == numpy_only["published"]
    assert small["files"].keys() == numpy_only["files"].keys()
    for name, content in small["files"].items():
        assert content == numpy_only["files"][name], name
