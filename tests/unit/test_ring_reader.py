"""Same-host ring reads (client/ring_reader.py): what a read-only reader copies out of a ring is always the
batch that holds the asked offset, or nothing; never bytes the writer is reusing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tailrace.client.records import encode_batch, iter_batches
from tailrace.persistence.recovery import data_dir_id
from tailrace.shm.layout import COL
from tailrace.shm.ring import LayoutMismatch
from tailrace.client import ring_reader as tail_mod
from tailrace.client.ring_reader import SharedRings, TailStatus

from tailrace.bench.inprocess import append_numbered, make_storage
from tests.helpers import check_numbered


@pytest.fixture
def storage(tmp_path):
    st = make_storage(tmp_path / "data", partitions=1, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      segment_bytes=1 << 20, write_buffer_bytes=64 * 1024)
    yield st
    st.close()


def _tail(st):
    actor = st.actors[0]
    rings = SharedRings(st.s.instance, data_dir_id(st.s.data_dir))
    return actor, rings, rings.partition(actor.slot, actor.topic_id, actor.partition)


def _numpy_read(tail, monkeypatch, *args):
    """The same read with the plain-Python walk near the head turned off (the numpy search)."""
    with monkeypatch.context() as m:
        m.setattr(tail_mod, "_near_head", lambda *a: None)
        return tail.read(*args)


def test_reads_match_the_owner_through_many_laps_and_fall_below_where_the_ring_dropped(storage, monkeypatch):
    actor, rings, tail = _tail(storage)
    rng = random.Random(5)
    seen = {"DATA": 0, "BELOW": 0, "EMPTY": 0}
    try:
        for step in range(4000):
            op = rng.random()
            if op < 0.5:
                append_numbered(storage, actor, rng.randint(1, 40))
            elif op < 0.65:
                storage.flusher.do_work()
            else:
                hw = actor.high_watermark
                off = hw if rng.random() < 0.1 else rng.randrange(hw + 1)
                limits = (rng.choice([1, 4096, 1 << 20]), rng.choice([1, 10, 1 << 20]))
                got = tail.read(off, *limits)
                ref = _numpy_read(tail, monkeypatch, off, *limits)
                assert (got.status, got.body, got.next_offset) == (ref.status, ref.body, ref.next_offset)
                seen[got.status.name] += 1
                if got.status == TailStatus.DATA:
                    check_numbered(got.body, off, got.next_offset)
                    assert got.high_watermark == hw
                    owner = actor.read(off, 1 << 20, 1 << 20, "memory")
                    assert owner.source == "ring" and b"".join(owner.parts).startswith(got.body[:64])
                elif got.status == TailStatus.EMPTY:
                    assert off == hw
                else:  # below the ring: the owner serves it from the journal
                    assert off < int(actor.row[COL["ring_start_offset"]])
                    assert actor.read(off, 1 << 20, 1 << 20, "memory").source == "disk"
        assert seen["DATA"] > 300 and seen["BELOW"] > 100 and seen["EMPTY"] > 10, seen
        # isolation "durable" stops at the flusher's durable watermark
        storage.flusher.do_work()
        storage.flusher.sync()
        n = actor.high_watermark
        assert int(actor.row[COL["durable_offset"]]) == n
        assert actor.append(encode_batch([b"%d" % n]), 1 << 14)[0] == 0
        assert tail.read(n, 1 << 20, 1 << 20, "durable").status == TailStatus.EMPTY  # not durable yet
        assert tail.read(n, 1 << 20, 1 << 20, "memory").status == TailStatus.DATA
        storage.flusher.do_work()
        storage.flusher.sync()
        assert tail.read(n, 1 << 20, 1 << 20, "durable").status == TailStatus.DATA
        print(f"\nshm tail reads: {seen}; torn copies thrown away: {tail.torn}")
    finally:
        rings.close()


def test_a_copy_the_writer_reclaims_meanwhile_is_thrown_away_never_returned(storage, monkeypatch):
    """The writer appends (and so drops the oldest batches) while the reader is copying: the
    tail check after the copy must see it and retry; after ATTEMPTS it answers BELOW."""
    actor, rings, tail = _tail(storage)
    try:
        value = b"x" * 2000
        for _ in range(30):  # fill most of the 64 KiB ring
            assert actor.append(encode_batch([value]), 1 << 14)[0] == 0
        storage.flusher.do_work()
        oldest = int(actor.row[COL["ring_start_offset"]])
        real_copy = tail.ring.copy_batches
        appended = []

        def copy_while_the_writer_laps(descs):
            views = real_copy(descs)
            for _ in range(12):  # ~24 KiB more: the oldest batches are dropped and overwritten
                assert actor.append(encode_batch([b"y" * 2000]), 1 << 14)[0] == 0
                appended.append(1)
            storage.flusher.do_work()
            return views

        monkeypatch.setattr(tail.ring, "copy_batches", copy_while_the_writer_laps)
        got = tail.read(oldest, 1 << 20, 1 << 20)
        assert tail.torn >= 1 and appended
        if got.status == TailStatus.DATA:  # a later attempt found the batch still whole
            views = iter_batches(got.body)
            assert views[0].base_offset <= oldest < views[0].base_offset + views[0].record_count
        else:
            assert got.status == TailStatus.BELOW
        monkeypatch.undo()
        # the same offset, now really gone from the ring, is BELOW; the newest is DATA
        assert tail.read(oldest, 1 << 20, 1 << 20).status == TailStatus.BELOW
        newest = actor.high_watermark - 1
        got = tail.read(newest, 1 << 20, 1 << 20)
        assert got.status == TailStatus.DATA and iter_batches(got.body)[0].value(0) == b"y" * 2000
    finally:
        rings.close()


def test_a_near_head_copy_the_writer_laps_meanwhile_is_thrown_away(storage, monkeypatch):
    """The plain-Python walk over the newest batches is guarded by the same seqlock: the writer
    laps the whole ring between the copy and the check, so the copy must not be returned."""
    actor, rings, tail = _tail(storage)
    try:
        for _ in range(10):
            assert actor.append(encode_batch([b"x" * 2000]), 1 << 14)[0] == 0
        storage.flusher.do_work()
        newest = actor.high_watermark - 1
        real = tail_mod._near_head
        lapped = []

        def walk_while_the_writer_laps(*args):
            got = real(*args)
            assert got is not None  # the offset is near the head: the walk, not the numpy search
            if not lapped:
                for _ in range(40):  # ~80 KiB: more than the 64 KiB ring
                    assert actor.append(encode_batch([b"y" * 2000]), 1 << 14)[0] == 0
                    storage.flusher.do_work()
                lapped.append(1)
            return got

        monkeypatch.setattr(tail_mod, "_near_head", walk_while_the_writer_laps)
        got = tail.read(newest, 1 << 20, 1 << 20)
        assert lapped and tail.torn >= 1
        assert got.status == TailStatus.BELOW  # lapped: the offset is gone from the ring
        monkeypatch.undo()
        got = tail.read(actor.high_watermark - 1, 1 << 20, 1 << 20)
        assert got.status == TailStatus.DATA and iter_batches(got.body)[0].value(0) == b"y" * 2000
    finally:
        rings.close()


def test_the_mapping_is_read_only_and_knows_its_broker(storage):
    actor, rings, tail = _tail(storage)
    try:
        with pytest.raises(ValueError):
            rings.rows[actor.slot, 0] = 1  # PROT_READ: numpy refuses the store
        with pytest.raises((TypeError, ValueError)):
            tail.ring.mv[0:1] = b"z"
        with pytest.raises(AttributeError):
            tail.row.next_offset = 1  # a reader's view of the row (RowView) has no setters
        with pytest.raises(TypeError):
            tail.row.cells[0] = 1  # ... and the memory under it is read-only
        assert rings.is_current() and tail.ring.region.is_current()
        with pytest.raises(LayoutMismatch):
            SharedRings(storage.s.instance, data_dir_id(storage.s.data_dir) + 1)
        # a slot that holds another partition now is GONE
        other = rings.partition(actor.slot, actor.topic_id, actor.partition + 1)
        assert other.read(0, 1 << 20, 1 << 20).status == TailStatus.GONE
        assert np.array_equal(rings.watermarks(np.array([actor.slot]), "memory"), [actor.high_watermark])
    finally:
        rings.close()
