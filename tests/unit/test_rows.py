"""shm/rows.py: each cache line of a control-table row has one writer, and that writer is a type."""

from __future__ import annotations

import numpy as np
import pytest

from tailrace.shm import layout
from tailrace.shm.rows import FlusherColumns, FlusherHeader, FlusherRow, HeaderView, OwnerRow, RowView


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


# --- FlusherColumns: the flusher's view of the whole table ---------------------------------

def _table(slots: int = 4) -> np.ndarray:
    return np.zeros((slots, layout.ROW_WORDS), dtype=np.int64)


def test_the_flushers_columns_store_line_2_of_many_rows_at_once_and_one_word_at_a_time():
    table = _table()
    cols = FlusherColumns(table)
    table[:, layout.C_FLUSHED_OFFSET] = [5, 6, 7, 8]
    cols.set([0, 2], "durable_offset", table[[0, 2], layout.C_FLUSHED_OFFSET])
    assert table[:, layout.C_DURABLE_OFFSET].tolist() == [5, 0, 7, 0]
    cols.set(table[:, layout.C_FLUSHED_OFFSET] > 6, "io_error", 1)  # a mask, as _fail passes
    assert table[:, layout.C_IO_ERROR].tolist() == [0, 0, 1, 1]
    cols.store(1, "io_error", 0)
    cols.publish_flushed(3, position=4096, desc=12, offset=99)
    assert (table[3, layout.C_FLUSHED_POSITION], table[3, layout.C_FLUSHED_DESC], table[3, layout.C_FLUSHED_OFFSET]) == (4096, 12, 99)


def test_a_store_to_another_processs_column_through_the_flushers_columns_raises_naming_its_writer():
    table = _table()
    cols = FlusherColumns(table)
    with pytest.raises(AttributeError, match="desc_head.*owning actor"):
        cols.set([0, 1], "desc_head", 1)
    with pytest.raises(AttributeError, match="owner_epoch.*owning actor"):
        cols.store(0, "owner_epoch", 1)
    with pytest.raises(AttributeError, match="active.*line 0"):
        cols.set([0], "active", 0)
    with pytest.raises(AttributeError, match="log_start_offset.*advance_log_starts"):
        cols.store(0, "log_start_offset", 3)
    with pytest.raises(AttributeError, match="no control-table column"):
        cols.store(0, "flushed", 3)
    assert not table.any()


def test_the_flushers_rows_are_read_only_so_a_raw_store_cannot_go_around_the_view():
    table = _table()
    cols = FlusherColumns(table)
    table[1, layout.C_NEXT_OFFSET] = 4
    assert cols.rows[1, layout.C_NEXT_OFFSET] == 4  # the same words
    with pytest.raises(ValueError, match="read-only"):
        cols.rows[1, layout.C_DURABLE_OFFSET] = 1
    with pytest.raises(ValueError, match="read-only"):
        cols.rows[1][:] = 0


def test_init_row_describes_a_recovered_partition_with_active_last_and_every_line_at_its_offset():
    table = _table()
    table[2] = 7  # whatever a discarded table left
    FlusherColumns(table).init_row(2, topic_id=9, partition=1, ring_bytes=1 << 16, desc_capacity=512, next_offset=40)
    view = RowView(table[2])
    assert (view.slot, view.topic_id, view.partition, view.active, view.ring_bytes, view.desc_capacity) == (2, 9, 1, 1, 1 << 16, 512)
    assert view.next_offset == view.ring_start_offset == view.flushed_offset == view.durable_offset == 40
    assert view.desc_head == view.flushed_desc == view.log_start_offset == view.owner_epoch == 0


def test_log_starts_advance_through_the_documented_exception_and_never_move_down():
    table = _table()
    cols = FlusherColumns(table)
    table[:, layout.C_LOG_START_OFFSET] = [10, 10, 10, 10]
    cols.advance_log_starts([0, 1, 3], [15, 5, 10])
    assert table[:, layout.C_LOG_START_OFFSET].tolist() == [15, 10, 10, 10]
    cols.advance_log_starts([], [])  # a pass that moved nothing


def test_a_retired_row_is_cleared_only_with_its_owner_lock_held(tmp_path):
    from tailrace.shm.fence import OwnerLock

    table = _table()
    table[1] = 3
    table[1, layout.C_ACTIVE] = 1
    cols = FlusherColumns(table)
    lock = OwnerLock(str(tmp_path / "slot-1.lock"))
    try:
        with pytest.raises(AssertionError, match="owner lock"):
            cols.clear_retired(1, lock)  # not acquired
        assert table[1, layout.C_ACTIVE] == 1
        assert lock.try_acquire()
        cols.clear_retired(1, lock)
        assert not table[1].any() and table[0].sum() == 0
    finally:
        lock.close()


def _raw_table_rows(source: str) -> list[int]:
    """Lines of ``source`` that reach a control table's rows (``<x>table.rows``) other than to
    build the flusher's view of them (``FlusherColumns(<x>table.rows)``)."""
    import ast

    tree = ast.parse(source)
    allowed = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
               and getattr(call.func, "id", getattr(call.func, "attr", "")) == "FlusherColumns"}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "rows" and id(node) not in allowed:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name.endswith("table"):
                hits.append(node.lineno)
    return hits


def test_persistence_reaches_the_control_table_rows_only_through_the_flushers_columns():
    from pathlib import Path

    import tailrace.persistence as persistence

    assert _raw_table_rows("self.table.rows[s, 3] = 0\nf.table.rows[0]") == [1, 2]  # the check bites
    assert _raw_table_rows("cols = FlusherColumns(self.table.rows)\ncols.rows[0]") == []
    root = Path(persistence.__path__[0])
    found = {p.name: _raw_table_rows(p.read_text()) for p in sorted(root.glob("*.py"))}
    assert not {name: lines for name, lines in found.items() if lines}, found
    assert "FlusherColumns(self.table.rows)" in (root / "flusher.py").read_text()
