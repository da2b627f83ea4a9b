"""Cutting a partition's log back to an offset (actors/truncate.py, persistence/truncation.py):
the real actor, flusher, journal, index and recovery in one process (bench/inprocess.py), on
real shared memory and files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tailrace.actors.truncate import cut_target, truncate
from tailrace.bench.inprocess import make_storage
from tailrace.broker.datadir import CHECKPOINT_FILE, JOURNAL_DIR
from tailrace.client.records import STAMP, STAMP_AT, STAMP_V2, STAMP_V2_AT, encode_batch, iter_batches, now_us
from tailrace.persistence.index import ENTRY_DTYPE, index_path
from tailrace.persistence.recovery import read_checkpoint, recover, write_checkpoint
from tailrace.persistence.truncation import read_truncations, truncations_path

BATCH = 3  # records per batch: boundaries at 0, 3, 6, ...


def _append(st, actor, tag: str, batches: int) -> None:
    for _ in range(batches):
        base = actor.high_watermark
        code, msg, got, _n, _t = actor.append(encode_batch([f"{tag}-{base + i}".encode() for i in range(BATCH)]), 1 << 16)
        assert code == 0 and got == base, (code, msg)
    st.flusher.do_work()


def _cut(st, actor, target: int, turns: int = 20) -> int:
    """Call truncate as a worker would, giving the flusher a loop turn between calls."""
    for _ in range(turns):
        end = truncate(actor, target)
        if end >= 0:
            return end
        st.flusher.do_work()
        st.flusher.cutter.poll(st.flusher.slots)
    raise AssertionError(f"no cut to {target} in {turns} turns")


def _values(res_parts, start: int) -> list[tuple[int, bytes]]:
    out = []
    for v in iter_batches(b"".join(bytes(p) for p in res_parts)):
        out += [(v.base_offset + i, v.value(i)) for i in range(v.record_count) if v.base_offset + i >= start]
    return out


def _read_all(actor, isolation: str = "memory", disk: bool = False) -> list[tuple[int, bytes]]:
    out, at = [], 0
    end = actor.watermark(isolation)
    while at < end:
        res = actor._read_disk(at, 1 << 20, 1 << 20, end) if disk else actor.read(at, 1 << 20, 1 << 20, isolation)
        assert res.code == 0 and res.parts, (at, res)
        got = _values(res.parts, at)
        out += got
        at = got[-1][0] + 1
    return out


def _expected(old_end: int, cut: int, new_end: int) -> list[tuple[int, bytes]]:
    return [(o, f"old-{o}".encode()) for o in range(cut)] + [(o, f"new-{o}".encode()) for o in range(cut, new_end)]


@pytest.fixture
def st(tmp_path):
    s = make_storage(tmp_path / "data", partitions=1)
    yield s
    s.close()


def test_a_cut_at_a_batch_boundary_then_new_batches_read_back_as_the_old_prefix_and_the_new_tail(st):
    actor = st.actors[0]
    _append(st, actor, "old", 10)  # offsets 0..29
    st.flusher.sync()
    row = actor.owner_row
    assert truncate(actor, 30) == 30 and truncate(actor, 99) == 30  # at or past the end: nothing to cut
    assert _cut(st, actor, 15) == 15
    assert (row.next_offset, row.ring_start_offset, row.flushed_offset, row.truncate_request) == (15, 15, 15, 0)
    assert row.truncated_to == 16  # the acknowledgement stays up until the flusher sees the request gone
    st.flusher.cutter.poll(st.flusher.slots)
    assert row.truncated_to == 0
    assert row.durable_offset <= 15 and row.desc_tail == row.desc_head
    assert truncate(actor, 15) == 15  # idempotent: asked again, nothing more to cut
    marks = read_truncations(st.s.data_dir)[actor.slot]
    assert [t for _p, t in marks.cuts] == [15]
    assert read_checkpoint(st.s.data_dir)[1][actor.slot] == 15  # a normal restart starts after the cut
    assert np.fromfile(index_path(st.s.data_dir, actor.slot), dtype=ENTRY_DTYPE).size == 15
    _append(st, actor, "new", 4)  # offsets 15..26
    assert actor.high_watermark == 27
    assert _read_all(actor) == _expected(30, 15, 27)  # 0..14 from disk, 15.. from the ring
    st.flusher.sync()
    assert actor.watermark("durable") == 27
    assert _read_all(actor, "durable") == _expected(30, 15, 27)
    assert _read_all(actor, disk=True) == _expected(30, 15, 27)  # every offset through the index
    # the producer state forgot the cut batches; the max time is the new last batch's
    assert all(e[2] < 27 for q in actor.producers.by_pid.values() for e in q)


def test_a_cut_inside_a_batch_lands_on_its_base_and_below_the_log_start_is_refused(st):
    actor = st.actors[0]
    _append(st, actor, "old", 6)  # 0..17
    assert _cut(st, actor, 10) == 9  # offset 10 is in the batch 9..11
    assert actor.high_watermark == 9
    st.flusher.cols.advance_log_starts([actor.slot], [6])  # as retention would
    with pytest.raises(ValueError, match="below the log start"):
        truncate(actor, 5)
    assert actor.owner_row.truncate_request == 0  # nothing asked
    assert _cut(st, actor, 7) == 6  # 7 is in 6..8: cut at its base, the log start: an empty log at 6
    assert actor.high_watermark == 6 and actor.owner_row.log_start_offset == 6


def test_appends_wait_while_a_cut_is_asked_and_durable_waiters_past_it_are_answered_first(st):
    actor = st.actors[0]
    _append(st, actor, "old", 4)  # 0..11, staged
    actor.durable_waiters.append((12, ["reply"], 0))  # a durable ack waiting for 12
    assert truncate(actor, 6) == -1 and actor.owner_row.truncate_request == 0  # the waiter is answered first
    actor.durable_waiters.clear()  # (the worker answers it after the sync the -1 asked for)
    assert truncate(actor, 6) == -1 and actor.owner_row.truncate_request == 7
    code, msg, *_ = actor.append(encode_batch([b"x"]), 1 << 16)
    assert code != 0 and "cut" in msg  # NOT_READY while the cut is asked
    st.flusher.cutter.poll(st.flusher.slots)
    code, _msg, base, *_ = actor.append(encode_batch([b"new-6"]), 1 << 16)  # the append finishes the cut itself
    assert code == 0 and base == 6 and actor.owner_row.truncate_request == 0


def _cut_and_refill(st) -> tuple[int, str]:
    actor = st.actors[0]
    _append(st, actor, "old", 10)  # 0..29
    assert _cut(st, actor, 12) == 12
    _append(st, actor, "new", 5)  # 12..26
    st.flusher.checkpoint()
    _append(st, actor, "new", 2)  # 27..32, after the checkpoint: scanned at recovery
    st.flusher.sync()
    return actor.slot, st.s.data_dir


@pytest.mark.parametrize("checkpoint", ["kept", "deleted", "past-the-end"])
def test_recovery_honours_the_marker_from_a_checkpoint_and_in_a_full_rescan(tmp_path, checkpoint):
    """``deleted``: a scan of the whole journal from position 0; ``past-the-end``: a checkpoint
    recovery cannot use, so a full rescan from the first segment."""
    st = make_storage(tmp_path / "data", partitions=1)
    slot, data = _cut_and_refill(st)
    st.close()  # shared memory gone: what a host crash leaves (the journal was synced)
    if checkpoint == "deleted":
        (Path(data) / JOURNAL_DIR / CHECKPOINT_FILE).unlink()
    elif checkpoint == "past-the-end":
        write_checkpoint(data, 1 << 40, {slot: 1000})
    rec = recover(data, 1 << 20, 64 * 1024)
    assert rec.next_offsets[slot] == 33 and rec.cut_bytes == 0
    assert rec.full_rescan == (checkpoint == "past-the-end")
    st = make_storage(tmp_path / "data", partitions=1)  # boots on it: recovery again, rows from the journal
    try:
        actor = st.actors[0]
        assert actor.high_watermark == 33
        assert _read_all(actor) == _expected(30, 12, 33)
    finally:
        st.close()


@pytest.mark.parametrize("stage", ["marker", "index", "checkpoint"])
def test_a_flusher_stopped_anywhere_after_the_marker_leaves_the_cut_log(tmp_path, stage):
    """The flusher's steps are undone one by one from a completed cut: whatever followed the
    marker (the cut index, the checkpoint after it) recovery gets the cut log; without the
    marker, the old one."""
    st = make_storage(tmp_path / "data", partitions=1)
    actor = st.actors[0]
    slot = actor.slot
    _append(st, actor, "old", 10)  # 0..29
    st.flusher.checkpoint()
    data = Path(st.s.data_dir)
    before = tmp_path / "before"
    (before / "index").mkdir(parents=True)
    shutil.copy(data / JOURNAL_DIR / CHECKPOINT_FILE, before / CHECKPOINT_FILE)  # names 30 entries
    _append(st, actor, "old", 2)  # 30..35, past that checkpoint: a partial scan reads them
    shutil.copy(index_path(data, slot), index_path(before, slot))  # 36 entries, as just before the cut
    assert _cut(st, actor, 12) == 12
    st.close()
    if stage in ("marker", "index"):  # stopped before the checkpoint: the old one
        shutil.copy(before / CHECKPOINT_FILE, data / JOURNAL_DIR / CHECKPOINT_FILE)
    if stage == "marker":  # ... and before the index was cut
        shutil.copy(index_path(before, slot), index_path(data, slot))
    rec = recover(data, 1 << 20, 64 * 1024)
    assert rec.next_offsets[slot] == 12 and not rec.full_rescan
    assert np.fromfile(index_path(data, slot), dtype=ENTRY_DTYPE).size == 12
    truncations_path(data).unlink()  # and with no marker at all: the old log
    shutil.copy(before / CHECKPOINT_FILE, data / JOURNAL_DIR / CHECKPOINT_FILE)
    shutil.copy(index_path(before, slot), index_path(data, slot))
    assert recover(data, 1 << 20, 64 * 1024).next_offsets[slot] == 36


def test_markers_go_with_the_segments_below_them_and_with_their_topic(st):
    actor = st.actors[0]
    _append(st, actor, "old", 4)
    assert _cut(st, actor, 6) == 6
    t = st.flusher.retention.truncations
    (p, _t), = t.marks[actor.slot].cuts
    t.prune(p - 1)
    assert actor.slot in read_truncations(st.s.data_dir)
    t.prune(p)  # every segment holding a byte below P is gone
    assert read_truncations(st.s.data_dir) == {}
    assert _cut(st, actor, 3) == 3
    st.flusher.retention.forget([actor.slot])  # its topic deleted (persistence/retire.py)
    assert json.loads(truncations_path(st.s.data_dir).read_text()) == {"truncations": {}}


def test_a_copy_is_cut_where_its_own_batches_of_the_diverging_epoch_end_if_that_is_lower(st):
    """REPLICA_APPEND's ``truncate_epoch`` (actors/truncate.py ``cut_target``): the leader says
    its log ends epoch 1 at 12; this copy's epoch-1 batches end at 9 (its 9.. are epoch 2)."""
    actor = st.actors[0]
    frames = []
    for i in range(6):  # 0..17: epoch 1 up to 8, epoch 2 from 9
        frame = bytearray(encode_batch([b"c-%d" % (BATCH * i + j) for j in range(BATCH)]))
        STAMP.pack_into(frame, STAMP_AT, BATCH * i, now_us(), 0, 0)
        STAMP_V2.pack_into(frame, STAMP_V2_AT, 1 if i < 3 else 2, now_us())
        frames.append(bytes(frame))
    assert actor.append_replica(b"".join(frames), 1 << 16) == (0, "")
    assert cut_target(actor, 12, -1) == 12 and cut_target(actor, 12, 2) == 12
    assert cut_target(actor, 12, 1) == 9
    assert _cut(st, actor, cut_target(actor, 12, 1)) == 9
    assert cut_target(actor, 12, 1) == 9  # asked again on the cut copy: the same end, nothing more to cut
    assert truncate(actor, cut_target(actor, 12, 1)) == 9
