"""persistence/index.py: the dense per-partition index (entry of offset o at byte o x 16)."""

from __future__ import annotations

import os

import numpy as np

from tailrace.broker.datadir import INDEX_DIR
from tailrace.persistence.index import ENTRY, ENTRY_BYTES, ENTRY_DTYPE, IndexFile, entries_for, index_path


def test_entries_for_batches_give_every_record_its_batch_position_length_and_relative_offset():
    e = entries_for(np.array([0, 4096]), np.array([100, 60]), np.array([3, 2]))
    assert e["position"].tolist() == [0, 0, 0, 4096, 4096]
    assert e["length"].tolist() == [100, 100, 100, 60, 60]
    assert e["rel"].tolist() == [0, 1, 2, 0, 1]


def test_the_struct_and_the_dtype_encode_an_entry_to_the_same_16_bytes():
    one = np.zeros(1, dtype=ENTRY_DTYPE)
    one[0] = (123456789012, 77, 5)
    assert one.tobytes() == ENTRY.pack(123456789012, 77, 5) and ENTRY_BYTES == 16


def test_an_entry_sits_at_offset_times_16_and_reads_back_from_a_read_only_open(tmp_path):
    w = IndexFile(tmp_path, 7, writable=True)
    assert w.path == index_path(tmp_path, 7) == tmp_path / INDEX_DIR / "7.index"
    w.write(0, entries_for(np.array([0]), np.array([80]), np.array([2])))
    w.write(2, ENTRY.pack(4096, 90, 0) + ENTRY.pack(4096, 90, 1))  # the few-batch path's bytes
    w.sync()
    raw = (tmp_path / INDEX_DIR / "7.index").read_bytes()
    assert len(raw) == 4 * 16
    assert ENTRY.unpack_from(raw, 3 * 16) == (4096, 90, 1)
    r = IndexFile(tmp_path, 7)
    got = r.read(1, 3)
    assert got["position"].tolist() == [0, 4096, 4096] and got["rel"].tolist() == [1, 0, 1]
    w.close()
    r.close()


def test_an_index_file_is_created_by_its_writer_only(tmp_path):
    try:
        IndexFile(tmp_path, 3)
        raise AssertionError("a reader created an index file")
    except FileNotFoundError:
        pass
    IndexFile(tmp_path, 3, writable=True).close()
    assert os.path.exists(index_path(tmp_path, 3))


def test_the_index_is_dense_every_offset_up_to_the_last_written_has_an_entry(tmp_path):
    w = IndexFile(tmp_path, 1, writable=True)
    w.write(5, ENTRY.pack(800, 40, 0))  # offset 5 only: the file still spans offsets 0..5
    assert w.entry_count() == 6 and os.path.getsize(w.path) == 6 * ENTRY_BYTES
    got = w.read(0, 6)
    assert got["position"].tolist() == [0, 0, 0, 0, 0, 800]  # not sparse: unwritten entries read as zeros
    assert w.read(4, 10)["position"].tolist() == [0, 800]  # a read past the end returns what is there
    w.close()


def test_truncate_cuts_entries_and_a_read_only_open_cannot_write(tmp_path):
    w = IndexFile(tmp_path, 2, writable=True)
    w.write(0, entries_for(np.array([0, 96]), np.array([90, 90]), np.array([3, 3])))
    w.truncate(4)
    w.sync()
    assert w.entry_count() == 4 and not w.dirty
    r = IndexFile(tmp_path, 2)
    assert r.entry_count() == 4 and r.read(3, 1)["position"].tolist() == [96]
    try:
        r.write(4, ENTRY.pack(1, 2, 3))
        raise AssertionError("a read-only index accepted a write")
    except OSError:
        pass
    w.close()
    r.close()
