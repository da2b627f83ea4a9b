"""persistence/log.py: one partition's offsets, index and journal reads, as the worker's fetch,
list-offsets and time lookup use them; and the worker's handlers take contexts, not the worker."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tailrace.client.records import align8, encode_batch, iter_batches
from tailrace.persistence import log as log_mod
from tailrace.persistence.index import ENTRY_DTYPE, index_path
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.log import DiskRead, PartitionLog, active_slots
from tailrace.shm.layout import COL, ROW_WORDS

from tailrace.bench.inprocess import make_storage

ROOT = Path(__file__).resolve().parents[2]


def test_partition_log_reads_the_rows_offsets_and_the_flushed_batches_through_the_index(tmp_path):
    st = make_storage(tmp_path / "data", partitions=1)
    actor = st.actors[0]
    try:
        for i in range(5):
            assert actor.append(encode_batch([b"%d" % i] * 3), 1 << 14)[0] == 0
        st.flusher.do_work()
        plog = PartitionLog(st.flusher.table.rows[actor.slot], st.s.data_dir, actor.slot, st.journal)
        try:
            assert (plog.log_start_offset, plog.high_watermark) == (0, 15)
            assert plog.flushed_offset == 15 and plog.watermark("memory") == 15
            assert plog.watermark("durable") == plog.durable_watermark
            res = plog.read(DiskRead(actor.slot, 3, 1 << 20, 1 << 20, 15))
            views = iter_batches(b"".join(res.parts))
            assert [v.base_offset for v in views] == [3, 6, 9, 12] and res.next_offset == 15 and res.source == "disk"
            first = iter_batches(b"".join(plog.read(DiskRead(actor.slot, 0, 1 << 20, 1 << 20, 15)).parts))[0]
            assert plog.offset_for_time(0, lambda: None) == (0, first.time_key_us)
            assert plog.offset_for_time(views[1].time_key_us, lambda: None)[0] <= 6
            last = views[-1].append_time_us
            assert plog.offset_for_time(last + 1, lambda: None) is None  # all older, and nothing above the index
        finally:
            plog.close()
    finally:
        st.close()


def test_partition_log_opens_the_index_again_once_its_file_was_unlinked(tmp_path):
    """A deleted topic's index goes with its slot (persistence/retire.py); a new topic in the
    slot gets a fresh file, which a descriptor cached by slot alone would never see."""
    st = make_storage(tmp_path / "data", partitions=1)
    actor = st.actors[0]
    try:
        assert actor.append(encode_batch([b"x"]), 1 << 14)[0] == 0
        st.flusher.do_work()
        plog = PartitionLog(st.flusher.table.rows[actor.slot], st.s.data_dir, actor.slot, st.journal)
        try:
            first = plog.index()
            assert plog.index() is first and not plog.index_unlinked()
            path = index_path(st.s.data_dir, actor.slot)
            os.rename(path, str(path) + ".old")
            os.link(str(path) + ".old", path)  # a fresh name in place, then the old file's last link goes
            os.unlink(str(path) + ".old")
            assert not plog.index_unlinked()
            os.unlink(path)
            assert plog.index_unlinked()
            open(path, "wb").close()
            assert plog.index() is not first
        finally:
            plog.close()
    finally:
        st.close()


def test_no_worker_handler_module_takes_or_imports_the_worker():
    """A handler takes a narrow context (actors/context.py and its module's), never the process
    object: no handler module imports actors/worker.py, and no handler parameter is a Worker."""
    for name in ("produce", "fetch", "offsets", "watch", "adopt", "ping", "context", "diskreader"):
        tree = ast.parse((ROOT / "actors" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("worker", "tailrace.actors.worker"), f"actors/{name}.py imports the worker"
                assert not (node.level and node.module is None and any(a.name == "worker" for a in node.names)), name
            if isinstance(node, ast.arg) and node.annotation is not None:
                assert "Worker" not in ast.unparse(node.annotation), f"actors/{name}.py: {node.arg} is a Worker"


# --- the flusher's side (retention) and recovery's ----------------------------------------------


def _five_batches(tmp_path, records=3):
    """A storage with one partition holding five flushed batches of ``records`` records each, of
    different sizes; (storage, actor, the index's entries, the batches as read back)."""
    st = make_storage(tmp_path / "data", partitions=1)
    actor = st.actors[0]
    for i in range(5):
        size = 10 + 90 * i if records < 10 else 1 + i
        assert actor.append(encode_batch([b"v" * size] * records), 1 << 14)[0] == 0
        time.sleep(0.002)  # distinct append times
    st.flusher.do_work()
    entries = np.fromfile(index_path(st.s.data_dir, actor.slot), dtype=ENTRY_DTYPE)
    reader = PartitionLog(st.flusher.table.rows[actor.slot], st.s.data_dir, actor.slot, st.journal)
    views = iter_batches(b"".join(reader.read(DiskRead(actor.slot, 0, 1 << 20, 1 << 20, 5 * records)).parts))
    reader.close()
    return st, actor, entries, views


def test_the_flushers_log_reads_the_row_and_the_index_as_retention_asks(tmp_path):
    st, actor, entries, views = _five_batches(tmp_path)
    f = st.flusher
    reader = JournalReader(st.s.data_dir, st.s.segment_bytes)
    plog = PartitionLog.of_flusher(f.cols, f.indexes, actor.slot, reader)
    try:
        assert plog.index() is f.indexes.get(actor.slot)  # the flusher's own writable file, not a second one
        assert plog.active
        assert plog.topic_id == f.catalog.get("t").topic_id and active_slots(f.cols.rows) == {actor.slot}
        row = f.table.rows[actor.slot]
        assert plog.durable_indexed_end() == min(int(row[COL["durable_offset"]]), 15)
        f.sync()
        assert plog.durable_watermark == 15 and plog.durable_indexed_end() == 15
        f.cols.store(actor.slot, "durable_offset", 7)  # durable behind flushed: the smaller one
        assert plog.durable_indexed_end() == 7
        f.cols.store(actor.slot, "durable_offset", 15)

        starts = [0, 3, 6, 9, 12]
        sizes = [align8(int(entries["length"][o])) for o in starts]
        assert len(set(sizes)) == 5
        for chunk in (2, 3, 1 << 16):  # batches across chunk edges
            log_mod.CHUNK = chunk
            try:
                offs, got = plog.batch_sizes(0, 15)
                assert offs.tolist() == starts and got.tolist() == sizes
                offs, got = plog.batch_sizes(4, 13)  # the batches *starting* in [4, 13)
                assert offs.tolist() == [6, 9, 12] and got.tolist() == sizes[2:]
                assert [plog.next_batch_start(a, 15) for a in (0, 1, 4, 6, 13)] == [0, 3, 6, 6, 15]
                assert plog.next_batch_start(4, 5) == 5  # none before the end: the end
            finally:
                log_mod.CHUNK = 1 << 16
        assert plog.batch_sizes(15, 20)[0].tolist() == []

        positions = [int(entries["position"][o]) for o in starts]
        assert positions == sorted(positions) and len(set(positions)) == 5
        assert [plog.position_of(o) for o in (0, 4, 14)] == [positions[0], positions[1], positions[4]]
        assert plog.position_of(15) is None
        assert plog.first_at_position(0, 15, positions[2]) == 6
        assert plog.first_at_position(0, 15, positions[2] + 1) == 9
        assert plog.first_at_position(7, 15, 0) == 7 and plog.first_at_position(0, 15, 1 << 40) == 15

        times = [v.time_key_us for v in views]
        assert plog.first_indexed_at_or_after(0, 0, 15) == (0, times[0])
        expect = min(v.base_offset for v in views if v.time_key_us >= times[3])
        assert plog.first_indexed_at_or_after(times[3], 0, 15) == (expect, times[expect // 3])
        assert plog.first_indexed_at_or_after(times[3], 0, 9) is None  # only [lo, hi) is searched
        assert plog.first_indexed_at_or_after(times[-1] + 1, 0, 15) is None

        assert plog.kept_end(True) == 15 == plog.kept_end(False)
        f.indexes.get(actor.slot).write(15, entries[:2])  # the index says more than the row
        assert plog.kept_end(True) == 15 and plog.kept_end(False) == 17
        f.indexes.get(actor.slot).truncate(15)
    finally:
        plog.close()
        reader.close()
        st.close()


def test_the_flushers_log_advances_the_log_start_never_down_and_a_readers_cannot(tmp_path):
    st, actor, _entries, _views = _five_batches(tmp_path)
    f = st.flusher
    plog = PartitionLog.of_flusher(f.cols, f.indexes, actor.slot, st.journal)
    reader = PartitionLog(f.table.rows[actor.slot], st.s.data_dir, actor.slot, st.journal)
    try:
        plog.advance_log_start(6)
        assert plog.log_start_offset == 6 == reader.log_start_offset
        plog.advance_log_start(3)
        assert plog.log_start_offset == 6
        with pytest.raises(AssertionError, match="stores nothing"):
            reader.advance_log_start(9)
        with pytest.raises(AssertionError, match="writes no index"):
            reader.write_entries(0, np.zeros(1, ENTRY_DTYPE))
        past = PartitionLog.of_flusher(f.cols, f.indexes, len(f.cols.rows) + 3, st.journal)
        assert not past.active and past.log_start_offset == 0
        past.advance_log_start(5)  # no row to store to: nothing moves
        assert int(np.asarray(f.table.rows)[:, COL["log_start_offset"]].max()) == 6
    finally:
        plog.close()
        reader.close()
        st.close()


def test_the_flushers_log_gives_back_whole_index_pages_below_a_log_start(tmp_path):
    st, actor, entries, _views = _five_batches(tmp_path, records=100)  # 500 entries: a page is 256
    f = st.flusher
    plog = PartitionLog.of_flusher(f.cols, f.indexes, actor.slot, st.journal)
    try:
        assert plog.release_index_below(200)  # not a whole page: nothing freed
        assert (f.indexes.get(actor.slot).read(0, 500) == entries).all()
        if not plog.release_index_below(300):
            pytest.skip("this filesystem cannot punch holes")
        after = f.indexes.get(actor.slot).read(0, 500)
        assert len(after) == 500  # the file keeps its offsets
        assert not after[:256]["position"].any() and not after[:256]["length"].any()
        assert (after[256:] == entries[256:]).all()
    finally:
        plog.close()
        st.close()


def test_recoverys_log_counts_checks_rewrites_and_cuts_its_index(tmp_path):
    st, actor, entries, _views = _five_batches(tmp_path)
    f = st.flusher
    slot, topic_id, seg_bytes = actor.slot, f.catalog.get("t").topic_id, st.s.segment_bytes
    data = Path(st.s.data_dir)
    st.close()
    plog = PartitionLog.at_recovery(data, slot)
    try:
        assert not plog.active and plog.log_start_offset == 0  # no table yet
        assert plog.entry_count() == 15
        positions = [int(entries["position"][o]) for o in (0, 3, 6, 9, 12)]
        assert [plog.entries_below(p) for p in positions] == [0, 3, 6, 9, 12]
        assert plog.entries_below(positions[2] + 1) == 9 and plog.entries_below(1 << 40) == 15
        assert plog.last_entry_matches(15, topic_id, 0, seg_bytes)
        assert plog.last_entry_matches(12, topic_id, 0, seg_bytes)  # batch 9..11 ends at 12
        assert not plog.last_entry_matches(14, topic_id, 0, seg_bytes)  # 13 is inside batch 12..14
        assert not plog.last_entry_matches(15, topic_id + 1, 0, seg_bytes)
        assert not plog.last_entry_matches(15, topic_id, 1, seg_bytes)

        plog.truncate_index(9)
        assert plog.entry_count() == 9 and (plog.index().read(0, 9) == entries[:9]).all()
        plog.write_entries(9, entries[9:])
        plog.truncate_index(15)  # already there: unchanged
        assert index_path(data, slot).read_bytes() == entries.tobytes()
        plog.truncate_index(20)  # a log start above the records left: zeros up to it
        assert plog.entry_count() == 20 and not plog.index().read(15, 5)["length"].any()
        assert plog.index().dirty
        plog.sync_index()
        assert not plog.index().dirty
    finally:
        plog.close()
    with pytest.raises(FileNotFoundError):
        PartitionLog(np.zeros(ROW_WORDS, np.int64), data, slot + 50, None).index()  # a reader makes no file
    made = PartitionLog.at_recovery(data, slot + 50)
    try:
        assert made.entry_count() == 0 and made.entries_below(1 << 40) == 0  # recovery's makes it empty
    finally:
        made.close()
