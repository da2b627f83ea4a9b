"""The byte count behind retention.bytes over a real index file, read through the partition's
``PartitionLog`` (persistence/retention.py ``ByteCount``, persistence/log.py): followed as
batches arrive and the start moves, it always equals a recount, and
the start it picks is the first batch start from which the kept batches fit the limit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace.client.records import align8
from tailrace.persistence import log as plog_mod
from tailrace.persistence.index import IndexFile, entries_for
from tailrace.persistence.log import PartitionLog
from tailrace.persistence.retention import ByteCount


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_count_follows_arrivals_and_moves_and_the_start_fits_the_limit(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("rb")
    plog_mod.CHUNK = data.draw(st.sampled_from([3, 7, 64, 1 << 16]))  # small chunks: batches across chunk edges
    n = data.draw(st.integers(1, 120))
    counts = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    lengths = data.draw(st.lists(st.integers(60, 5000), min_size=n, max_size=n))
    bases = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    idx = IndexFile(tmp, 1, writable=True)
    idx.truncate(0)
    idx.write(0, entries_for(np.arange(n, dtype=np.int64) * 8192, np.array(lengths), np.array(counts)))
    plog = PartitionLog.at_recovery(tmp, 1)  # no row: only its index is read
    total = int(sum(counts))
    by_start = dict(zip(bases.tolist(), (align8(x) for x in lengths)))

    def recount(a: int, b: int) -> int:
        return sum(size for off, size in by_start.items() if a <= off < b)

    c = ByteCount(0)
    start = end = 0
    try:
        for _ in range(data.draw(st.integers(1, 12))):
            end = data.draw(st.integers(end, total))
            start = data.draw(st.integers(start, end))
            c.moved_to(plog, start, end)
            assert (c.start, c.end, c.bytes) == (start, end, recount(start, end))
            limit = data.draw(st.integers(0, 40_000))
            new = c.start_within(plog, limit)
            assert start <= new <= end
            assert recount(new, end) <= limit
            if new > start:  # the first start that fits: one batch earlier would not
                assert new == end or new in by_start
                earlier = max(off for off in by_start if off < new)
                assert recount(max(earlier, start), end) > limit or earlier < start
            c.moved_to(plog, new, end)
            start = new
            assert c.bytes == recount(start, end)
    finally:
        plog.close()
        idx.close()
        plog_mod.CHUNK = 1 << 16
