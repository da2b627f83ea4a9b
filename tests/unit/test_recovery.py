"""Recovery from torn and corrupt journal tails and from indexes that disagree with the journal."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from tailrace.client.records import align8, encode_batch
from tailrace.persistence.index import ENTRY_DTYPE, index_path
from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.persistence.journal import list_segments
from tailrace.persistence.recovery import recover, write_checkpoint

from tailrace.bench.inprocess import make_storage


def _fill(st, batches=40, seed=1):
    rng = random.Random(seed)
    layout = []  # (slot, count) in append order
    for i in range(batches):
        a = st.actors[i % len(st.actors)]
        n = rng.randint(1, 60)
        code, _m, base, count, _t = a.append(encode_batch([bytes([i % 256]) * rng.randint(1, 300) for _ in range(n)]), 1 << 16)
        assert code == 0
        layout.append((a.slot, count))
        if i % 7 == 0:
            st.flusher.do_work()
    st.flusher.do_work()
    st.flusher.sync()
    return layout


@pytest.fixture
def filled(tmp_path):
    st = make_storage(tmp_path / "data")
    layout = _fill(st)
    data = Path(st.s.data_dir)
    slots = [a.slot for a in st.actors]
    ends = {slot: int(st.actors[i].high_watermark) for i, slot in enumerate(slots)}
    st.close()
    write_checkpoint(data, 0)  # as if the host crashed before any checkpoint
    pristine = tmp_path / "pristine"
    shutil.copytree(data, pristine)
    return data, pristine, layout, ends


def _batches_in_journal(data: Path):
    """(position, frame size, slot) of every batch, from the pristine indexes."""
    out = []
    for p in sorted((data / "index").glob("*.index")):
        ent = np.fromfile(p, dtype=ENTRY_DTYPE)
        starts = ent[ent["rel"] == 0]
        out += [(int(e["position"]), align8(int(e["length"])), int(p.stem)) for e in starts]
    return sorted(out)


def _restore(pristine: Path, data: Path):
    shutil.rmtree(data)
    shutil.copytree(pristine, data)


def test_recovery_of_an_intact_journal_keeps_everything(filled):
    data, _pristine, _layout, ends = filled
    rec = recover(data, 1 << 20, 64 * 1024)
    assert rec.next_offsets == ends and rec.cut_bytes == 0


def test_torn_tail_at_random_byte_positions_is_cut_at_the_first_bad_batch(filled):
    data, pristine, _layout, ends = filled
    batches = _batches_in_journal(pristine)
    end = batches[-1][0] + batches[-1][1]
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(1, end), 25)) + [batches[3][0], batches[3][0] + 1]
    for cut in cuts:
        _restore(pristine, data)
        seg = data / JOURNAL_DIR / segment_name(0)
        raw = bytearray(seg.read_bytes())
        raw[cut:end] = bytes(end - cut)
        seg.write_bytes(bytes(raw))
        rec = recover(data, 1 << 20, 64 * 1024)
        survivors = [b for b in batches if b[0] + b[1] <= cut or (b[0] < cut and _nonzero_after(raw, b, cut))]
        survivors = [b for b in batches if b[0] + b[1] <= cut]
        expect = {slot: 0 for slot in ends}
        for pos, size, slot in batches:
            if pos + size <= cut:
                expect[slot] = expect[slot]  # counts come from the indexes below
        kept_idx = {slot: np.fromfile(index_path(data, slot), dtype=ENTRY_DTYPE) for slot in ends}
        kept_positions = {int(p) for e in kept_idx.values() for p in e["position"]}
        assert kept_positions <= {b[0] for b in survivors}, f"cut={cut}: index points past the cut"
        for slot in ends:
            assert rec.next_offsets[slot] == len(kept_idx[slot])
        torn = [b for b in batches if b[0] < cut < b[0] + b[1]]
        assert rec.end_position == (torn[0][0] if torn else max([b[0] + b[1] for b in survivors] or [0]))
        assert rec.cut_bytes <= cut - rec.end_position
        # the surviving prefix is exactly the batches before the cut
        assert len(kept_positions) == len(survivors)


def _nonzero_after(raw, b, cut):
    return False


def test_flipped_bytes_in_the_last_records_truncate_there(filled):
    data, pristine, _layout, ends = filled
    batches = _batches_in_journal(pristine)
    victim = batches[-3]
    seg = data / JOURNAL_DIR / segment_name(0)
    raw = bytearray(seg.read_bytes())
    raw[victim[0] + victim[1] - 9] ^= 0xFF  # inside the CRC range of the third-to-last batch
    seg.write_bytes(bytes(raw))
    rec = recover(data, 1 << 20, 64 * 1024)
    assert rec.end_position == victim[0]
    assert rec.cut_bytes > 0
    positions = {int(p) for slot in ends for p in np.fromfile(index_path(data, slot), dtype=ENTRY_DTYPE)["position"]}
    assert positions == {b[0] for b in batches[:-3]}
    # the cut is permanent: the bytes are zero now, a second recovery finds nothing to cut
    again = recover(data, 1 << 20, 64 * 1024)
    assert again.cut_bytes == 0 and again.end_position == victim[0]


def test_an_index_that_disagrees_with_the_journal_is_rebuilt_from_it(filled):
    data, pristine, _layout, ends = filled
    write_checkpoint(data, _batches_in_journal(pristine)[-1][0])  # checkpoint near the end
    victim_slot = min(ends)
    index_path(data, victim_slot).write_bytes(b"\x00" * 16 * 3)  # garbage, too short
    rec = recover(data, 1 << 20, 64 * 1024)
    assert rec.full_rescan and rec.next_offsets == ends
    for slot in ends:
        assert (index_path(data, slot).read_bytes() == (pristine / "index" / f"{slot}.index").read_bytes())


def test_later_segments_after_a_torn_tail_are_dropped(tmp_path):
    st = make_storage(tmp_path / "data", segment_bytes=256 * 1024, write_buffer_bytes=128 * 1024, max_batch_bytes=32 * 1024)
    for i in range(30):
        a = st.actors[i % 2]
        assert a.append(encode_batch([bytes(1000)] * 20), 1 << 15)[0] == 0
        st.flusher.do_work()
    st.flusher.sync()
    data = Path(st.s.data_dir)
    st.close()
    segs = list_segments(data / JOURNAL_DIR)
    assert len(segs) >= 2
    first = data / JOURNAL_DIR / segment_name(segs[0])
    raw = bytearray(first.read_bytes())
    raw[100] ^= 0xFF
    first.write_bytes(bytes(raw))
    write_checkpoint(data, 0)
    rec = recover(data, 256 * 1024, 32 * 1024)
    assert rec.end_position == 0 and rec.cut_bytes > 0
    assert list_segments(data / JOURNAL_DIR) == [0]
    assert all(v == 0 for v in rec.next_offsets.values())


def test_lowering_max_batch_bytes_never_cuts_older_valid_batches(tmp_path):
    st = make_storage(tmp_path / "data", max_batch_bytes=64 * 1024)
    big = encode_batch([bytes(50_000)])  # valid under the old limit
    assert st.actors[0].append(big, 64 * 1024)[0] == 0
    st.flusher.do_work()
    st.flusher.sync()
    data = Path(st.s.data_dir)
    st.close()
    write_checkpoint(data, 0)
    rec = recover(data, 1 << 20, 16 * 1024)  # today's limit is lower than the stored batch
    assert rec.cut_bytes == 0 and rec.next_offsets[min(rec.next_offsets)] == 1
