"""persistence/log.py: one partition's offsets, index and journal reads, as the worker's fetch,
list-offsets and time lookup use them; and the worker's handlers take contexts, not the worker."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tailrace.client.records import encode_batch, iter_batches
from tailrace.persistence.index import index_path
from tailrace.persistence.log import DiskRead, PartitionLog

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
            assert plog.offset_for_time(0, lambda: None) == (0, first.append_time_us)
            assert plog.offset_for_time(views[1].append_time_us, lambda: None)[0] <= 6
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
