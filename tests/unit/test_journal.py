"""persistence/journal.py: segment files, aligned writes, the latched first error, reads by position."""

from __future__ import annotations

import mmap
import os

import pytest

from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.persistence.journal import BLOCK, Journal, JournalReader, StorageError, check_segments, list_segments

SEG = 64 * 1024


def _buf(fill: bytes, length: int) -> mmap.mmap:
    buf = mmap.mmap(-1, length)  # page aligned: O_DIRECT-safe
    buf[:length] = (fill * (length // len(fill) + 1))[:length]
    return buf


def test_segments_are_named_by_their_start_position_zero_padded_to_20_digits():
    assert segment_name(0) == "00000000000000000000.log"
    assert segment_name(67108864) == "00000000000067108864.log"


def test_opening_a_segment_pre_writes_it_full_size_with_zeros_and_lists_it(tmp_path):
    j = Journal(tmp_path, SEG, direct_io=False)
    j.open_segment(0)
    path = tmp_path / JOURNAL_DIR / segment_name(0)
    assert path.stat().st_size == SEG and path.read_bytes() == bytes(SEG)
    j.close()
    assert 0 in list_segments(tmp_path / JOURNAL_DIR)
    assert not list((tmp_path / JOURNAL_DIR).glob("*.tmp"))


@pytest.mark.parametrize("direct", [False, True])
def test_aligned_writes_land_at_their_positions_and_read_back_by_position(tmp_path, direct):
    j = Journal(tmp_path, SEG, direct_io=direct)
    j.open_segment(0)
    j.write_aligned(_buf(b"a", BLOCK), BLOCK, 0)
    j.write_aligned(_buf(b"bc", 2 * BLOCK), 2 * BLOCK, BLOCK)
    assert j.dirty
    j.sync()
    assert not j.dirty
    j.open_segment(SEG)  # the next segment: positions go on across files
    j.write_aligned(_buf(b"z", BLOCK), BLOCK, SEG)
    j.sync()
    j.close()
    r = JournalReader(tmp_path, SEG)
    assert r.read(0, 10) == b"a" * 10
    assert r.read(BLOCK, 4) == b"bcbc"
    assert r.read(3 * BLOCK, 8) == bytes(8)  # never written: the pre-written zeros
    out = bytearray(5)
    r.read_into(memoryview(out), SEG + 100)
    assert bytes(out) == b"zzzzz"
    r.close()


def test_an_unaligned_write_is_refused_before_it_touches_the_file(tmp_path):
    j = Journal(tmp_path, SEG, direct_io=False)
    j.open_segment(0)
    with pytest.raises(AssertionError):
        j.write_aligned(_buf(b"x", BLOCK), 100, 0)
    with pytest.raises(AssertionError):
        j.write_aligned(_buf(b"x", BLOCK), BLOCK, 512)
    j.close()


def test_the_first_write_error_is_latched_and_every_later_write_and_sync_raises_it(tmp_path):
    j = Journal(tmp_path, SEG, direct_io=False)
    j.open_segment(0)
    os.close(j.fd)  # the next pwrite fails with EBADF, as a dying disk would fail it
    with pytest.raises(StorageError):
        j.write_aligned(_buf(b"x", BLOCK), BLOCK, 0)
    first = j.error
    assert first is not None
    for attempt in (lambda: j.write_aligned(_buf(b"y", BLOCK), BLOCK, BLOCK), j.sync, lambda: j.open_segment(SEG)):
        with pytest.raises(StorageError) as exc:
            attempt()
        assert exc.value.__cause__ is first
    assert j.error is first
    j.fd = -1
    j.close()


def test_a_segment_written_with_another_segment_size_is_refused_and_left_as_it_is(tmp_path):
    d = tmp_path / JOURNAL_DIR
    d.mkdir()
    (d / segment_name(0)).write_bytes(b"x" * (2 * SEG))  # a journal made with segments twice as large
    with pytest.raises(StorageError):
        check_segments(d, SEG)
    assert (d / segment_name(0)).read_bytes() == b"x" * (2 * SEG)
    (d / segment_name(0)).unlink()
    (d / segment_name(SEG // 2)).write_bytes(bytes(SEG))  # a start position off the grid
    with pytest.raises(StorageError):
        check_segments(d, SEG)


def test_a_short_segment_is_padded_back_with_zeros_and_keeps_its_bytes(tmp_path):
    d = tmp_path / JOURNAL_DIR
    d.mkdir()
    (d / segment_name(0)).write_bytes(b"short")
    check_segments(d, SEG)
    assert (d / segment_name(0)).read_bytes() == b"short" + bytes(SEG - 5)


def test_a_short_read_past_the_end_of_a_segment_raises(tmp_path):
    j = Journal(tmp_path, SEG, direct_io=False)
    j.open_segment(0)
    j.close()
    r = JournalReader(tmp_path, SEG)
    with pytest.raises(OSError):
        r.read(SEG - 4, 8)
    r.close()
