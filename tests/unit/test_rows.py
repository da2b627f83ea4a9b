"""shm/rows.py: each cache line of a control-table row has one writer, and that writer is a type."""

from __future__ import annotations

import numpy as np
import pytest

from tailrace.shm import layout
from tailrace.shm.rows import FlusherHeader, FlusherRow, HeaderView, OwnerRow, RowView


def _row() -> np.ndarray:
    return np.zeros(layout.ROW_WORDS, dtype=np.int64)


def test_every_view_reads_every_field_from_its_documented_column():
    words = _row()
    for name, col in layout.COL.items():
        words[col] = 1000 + col
    for view in (RowView(words), OwnerRow(words), FlusherRow(words)):
        for name, col in layout.COL.items():
            if not name.startswith("_"):
                got = getattr(view, name)
                assert got == 1000 + col and type(got) is int, (type(view).__name__, name, got)


def test_the_owner_row_stores_line_1_and_refuses_the_flushers_line():
    words = _row()
    own = OwnerRow(words)
    own.desc_head, own.write_position, own.next_offset = 3, 264, 7
    assert words[layout.C_DESC_HEAD] == 3 and words[88 // 8] == 3  # desc_head at row byte 88
    assert words[layout.C_WRITE_POSITION] == 264 and words[layout.C_NEXT_OFFSET] == 7
    with pytest.raises(AttributeError, match="flushed_offset.*flusher"):
        own.flushed_offset = 1
    with pytest.raises(AttributeError, match="topic_id"):
        own.topic_id = 1
    assert words[layout.C_FLUSHED_OFFSET] == 0


def test_the_flusher_row_stores_line_2_and_refuses_the_owners_line():
    words = _row()
    fl = FlusherRow(words)
    fl.flushed_desc, fl.durable_offset, fl.io_error = 4, 9, 1
    assert words[128 // 8] == 4 and words[152 // 8] == 9 and words[160 // 8] == 1
    with pytest.raises(AttributeError, match="desc_tail.*owning actor"):
        fl.desc_tail = 1
    assert words[layout.C_DESC_TAIL] == 0


def test_a_reader_view_stores_nothing():
    view = RowView(_row())
    for name in ("next_offset", "durable_offset", "slot"):
        with pytest.raises(AttributeError):
            setattr(view, name, 1)


def test_an_owner_describes_a_new_partition_in_an_inactive_row_only():
    words = _row()
    words[:] = 5  # leftovers of nothing: an inactive row is zeroed first
    words[layout.C_ACTIVE] = 0
    OwnerRow(words).init_identity(slot=3, topic_id=2, partition=1, ring_bytes=1 << 16, desc_capacity=512)
    view = RowView(words)
    assert (view.slot, view.topic_id, view.partition, view.active, view.ring_bytes, view.desc_capacity) == (3, 2, 1, 1, 1 << 16, 512)
    assert view.next_offset == view.desc_head == view.flushed_offset == 0
    with pytest.raises(AssertionError, match="active row"):
        OwnerRow(words).init_identity(3, 2, 1, 1 << 16, 512)


def test_a_view_of_a_read_only_mapping_reads():
    ro = np.frombuffer(bytes(layout.ROW_BYTES), dtype=np.int64)
    assert RowView(ro).next_offset == 0


def test_the_storage_full_word_is_stored_by_the_flusher_only_and_read_by_workers_at_offset_72():
    header = np.zeros(layout.TABLE_HEADER_BYTES // 8, dtype=np.int64)
    worker, flusher = HeaderView(header), FlusherHeader(header)
    assert worker.storage_full == 0
    flusher.storage_full = 1
    assert worker.storage_full == 1 and type(worker.storage_full) is int
    assert header.view(np.uint8)[72] == 1 and layout.STORAGE_FULL_AT == 72
    with pytest.raises(AttributeError, match="written only by the flusher"):
        worker.storage_full = 0
