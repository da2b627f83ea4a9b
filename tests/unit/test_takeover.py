"""A writer killed at any point of an append leaves a ring the next owner can continue densely."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tailrace.actors.partition import PartitionActor
from tailrace.client.records import encode_batch, iter_batches
from tailrace.persistence.recovery import scan
from tailrace.shm.rows import OwnerRow

from tailrace.bench.inprocess import make_storage


class Killed(BaseException):
    pass


@pytest.mark.parametrize("die_at", range(12))
def test_takeover_after_a_writer_dies_at_any_store_keeps_offsets_dense(tmp_path, die_at, monkeypatch):
    st = make_storage(tmp_path / "data", partitions=1, ring_bytes=64 * 1024, max_batch_bytes=16 * 1024,
                      write_buffer_bytes=64 * 1024)
    rng = random.Random(die_at)
    actor = st.actors[0]
    try:
        def append_some(a, k):
            for _ in range(k):
                n = rng.randint(1, 30)
                base = a.high_watermark
                if a.append(encode_batch([b"%d" % (base + i) for i in range(n)]), 1 << 14)[0] != 0:
                    st.flusher.do_work()
                if rng.random() < 0.3:
                    st.flusher.do_work()

        append_some(actor, 200)
        # Die at the die_at-th shared-memory store of the next append.
        writer_row = actor.writer.row
        stores = {"n": 0}

        class DyingCells:
            """The row's words as the writer stores them, dying at the die_at-th store."""

            def __init__(self, cells):
                self.cells = cells

            def __getitem__(self, key):
                return self.cells[key]

            def __setitem__(self, key, value):
                stores["n"] += 1
                if stores["n"] > die_at:
                    raise Killed
                self.cells[key] = value

        dying = OwnerRow(writer_row.words)
        dying.cells = DyingCells(dying.cells)  # every store of the writer goes through it
        actor.writer.row = dying
        try:
            actor.append(encode_batch([b"doomed"] * 3), 1 << 14)
        except Killed:
            pass
        actor.writer.row = writer_row
        actor.lock.close()  # the dead process's lock goes with it
        fresh = PartitionActor(st.flusher.table, st.s.instance, actor.slot, actor.topic_id, 0, 64 * 1024, 2,
                               st.s.data_dir, st.journal, str(tmp_path / "data"))
        st.actors[0] = fresh
        append_some(fresh, 300)
        for _ in range(50):
            if not st.flusher.do_work():
                break
        st.flusher.sync()
        res = scan(tmp_path / "data" / "journal", st.s.segment_bytes, 0, 1 << 20)
        bases, counts = np.array(res.base_offset), np.array(res.count)
        bad = np.flatnonzero(bases[1:] != bases[:-1] + counts[:-1])
        assert bases[0] == 0 and not bad.size, f"journal offsets not dense: {[(int(bases[i]), int(counts[i]), int(bases[i + 1])) for i in bad[:3]]}"
        assert int(bases[-1] + counts[-1]) == fresh.high_watermark
        # every offset reads back as itself, from ring or disk
        off = 0
        while off < fresh.high_watermark:
            res_ = fresh.read(off, 1 << 20, 1 << 20, "memory")
            for v in iter_batches(b"".join(res_.parts)):
                for i in range(v.record_count):
                    o = v.base_offset + i
                    if o >= off:
                        assert v.value(i) in (b"%d" % o, b"doomed"), (o, v.value(i))
            off = res_.next_offset
    finally:
        st.close()
