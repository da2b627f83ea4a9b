"""Rings give their flushed pages back (shm/ring.py ``RingWriter.release``, actors/keeper.py):
the pages go (the tmpfs file's blocks drop), what the writer says it holds never under-counts
them, every read still returns the batch that holds the asked offset (from the ring or, below
what was given back, the journal), a same-host reader's copy of a page punched meanwhile is
thrown away, and a worker over its share refuses appends that would take new pages."""

from __future__ import annotations

import os
import random

import pytest

from tailrace.actors.keeper import RingKeeper
from tailrace.client.ring_reader import SharedRings, TailStatus
from tailrace.persistence.recovery import data_dir_id
from tailrace.shm import region
from tailrace.shm.layout import COL
from tailrace.shm.ring import PAGE, RingFull

from tailrace.bench.inprocess import append_numbered, make_storage
from tests.helpers import check_numbered

RING = 256 * 1024


@pytest.fixture
def storage(tmp_path):
    st = make_storage(tmp_path / "data", partitions=2, ring_bytes=RING, max_batch_bytes=16 * 1024,
                      segment_bytes=1 << 20, write_buffer_bytes=64 * 1024)
    yield st
    st.close()


def _blocks(st, actor) -> int:
    """The bytes the ring's tmpfs file holds now."""
    return os.stat(region.SHM_DIR / region.ring_name(st.s.instance, actor.slot).lstrip("/")).st_blocks * 512


def _check_read(actor, off: int) -> str:
    res = actor.read(off, 8 * 1024, 1 << 20, "memory")  # a batch or a few
    check_numbered(b"".join(res.parts), off, res.next_offset)
    return res.source


def test_random_appends_flushes_releases_and_reads(storage):
    """Interleaved at random: every read is right, flushed-only release, the estimate holds."""
    actor = storage.actors[0]
    rng = random.Random(11)
    sources = {"ring": 0, "disk": 0}
    released = 0
    for step in range(3000):
        op = rng.random()
        if op < 0.45:
            append_numbered(storage, actor, rng.randint(1, 200))
        elif op < 0.6:
            storage.flusher.do_work()
        elif op < 0.65:
            row = actor.row
            unflushed = int(row[COL["write_position"]] - row[COL["flushed_position"]])
            released += actor.writer.release(rng.choice([0, PAGE, 20_000, RING // 2]))
            # nothing the flusher has not copied out is given back or dropped
            assert int(row[COL["write_position"]] - row[COL["flushed_position"]]) == unflushed
            assert int(row[COL["desc_tail"]]) <= int(row[COL["flushed_desc"]]) or unflushed == 0
            assert _blocks(storage, actor) <= actor.writer.resident_bytes(), step
        elif actor.high_watermark:
            hw = actor.high_watermark
            sources[_check_read(actor, rng.randrange(hw) if rng.random() < 0.5 else rng.randrange(max(0, hw - 2000), hw))] += 1
    assert released > 2 * RING and sources["ring"] > 100 and sources["disk"] > 100, (released, sources)


def test_release_gives_the_pages_back_and_keeps_the_unflushed_and_warm_bytes(storage):
    actor = storage.actors[0]
    for _ in range(100):
        append_numbered(storage, actor, 100)  # ~100 x 1 KiB, under the ring
    written = int(actor.row[COL["write_position"]])
    assert _blocks(storage, actor) >= written
    assert actor.writer.release(0) == 0  # nothing flushed yet: nothing goes
    storage.flusher.do_work()
    before = _blocks(storage, actor)
    freed = actor.writer.release(32 * 1024)  # keep the newest 32 KiB warm
    after = _blocks(storage, actor)
    assert freed > 0 and before - after >= written - 32 * 1024 - 2 * PAGE, (before, after, written)
    assert after <= actor.writer.resident_bytes()
    start = int(actor.row[COL["ring_start_offset"]])
    assert 0 < start < actor.high_watermark
    assert _check_read(actor, start) == "ring" and _check_read(actor, start - 1) == "disk" and _check_read(actor, 0) == "disk"
    actor.writer.release(0)
    assert _blocks(storage, actor) <= 4 * PAGE  # the header's page, a descriptor page, the head's partial page
    for _ in range(300):  # writes go on, through the pages given back, laps and all
        append_numbered(storage, actor, 100)
    storage.flusher.do_work()
    for off in range(0, actor.high_watermark, 997):
        _check_read(actor, off)


def test_a_same_host_copy_of_pages_given_back_meanwhile_is_thrown_away(storage, monkeypatch):
    actor = storage.actors[0]
    for _ in range(40):
        append_numbered(storage, actor, 100)
    storage.flusher.do_work()
    rings = SharedRings(storage.s.instance, data_dir_id(storage.s.data_dir))
    try:
        tail = rings.partition(actor.slot, actor.topic_id, actor.partition)
        real_copy = tail.ring.copy_batches

        def copy_then_release(descs):
            views = real_copy(descs)
            actor.writer.release(0)  # the writer gives the pages back after the reader's copy began
            return views

        monkeypatch.setattr(tail.ring, "copy_batches", copy_then_release)
        monkeypatch.setattr("tailrace.client.ring_reader._near_head", lambda *a: None)
        got = tail.read(0, 1 << 20, 1 << 20)
        assert tail.torn >= 1 and got.status == TailStatus.BELOW  # never the zeros of a punched page
    finally:
        rings.close()


def test_a_worker_over_its_share_refuses_new_pages_and_the_keeper_gives_back_the_idle(storage):
    a, b = storage.actors
    keeper = RingKeeper(share_bytes=3 * RING, idle_s=1.0, warm_bytes=0)
    keeper.add(a.slot, a.writer, 0.0)
    keeper.add(b.slot, b.writer, 0.0)
    actors = {a.slot: a, b.slot: b}
    for actor in (a, b):
        while int(actor.row[COL["write_position"]]) < RING - 20_000:
            append_numbered(storage, actor, 100)
        keeper.appended(actors, {actor.slot}, 0.5)
    assert keeper.growth.allowed  # ~2 rings of 3
    keeper.share = RING  # as if the budget were smaller: over it now
    keeper.appended(actors, {a.slot}, 0.6)
    assert not keeper.growth.allowed
    with pytest.raises(RingFull):  # the first lap's pages are new ones
        a.writer.claim(2000)
    storage.flusher.do_work()
    keeper.tick(actors, 0.7)  # over HIGH: gives back what is flushed, coldest first, down to LOW
    assert keeper.total <= RING * 0.5 and keeper.growth.allowed
    assert sum(_blocks(storage, x) for x in (a, b)) <= keeper.total
    keeper.share = 3 * RING
    append_numbered(storage, b, 100)
    keeper.appended(actors, {b.slot}, 1.0)
    keeper.tick(actors, 2.0)  # a (last appended at 0.6) is idle; b (1.0) is not
    assert a.slot not in keeper.recent and b.slot in keeper.recent
    _check_read(a, 0)
    _check_read(b, b.high_watermark - 1)


def test_the_keeper_counts_what_the_pages_hold_across_many_rings(tmp_path):
    st = make_storage(tmp_path / "data", partitions=20, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      segment_bytes=1 << 20, write_buffer_bytes=64 * 1024)
    try:
        keeper = RingKeeper(share_bytes=1 << 30, idle_s=0.1, warm_bytes=0)
        actors = {x.slot: x for x in st.actors}
        for x in st.actors:
            keeper.add(x.slot, x.writer, 0.0)
        rng = random.Random(2)
        for step in range(400):
            x = rng.choice(st.actors)
            append_numbered(st, x, rng.randint(1, 100))
            keeper.appended(actors, {x.slot}, step / 100)
            if step % 7 == 0:
                st.flusher.do_work()
            keeper.tick(actors, step / 100)
            assert sum(_blocks(st, y) for y in st.actors) <= keeper.total
        st.flusher.do_work()
        keeper.tick(actors, 100.0)
        assert sum(_blocks(st, y) for y in st.actors) <= 20 * 4 * PAGE
        assert keeper.total == sum(keeper.held.values()) and not keeper.recent
    finally:
        st.close()

