"""Seek by time over a real dense index and a real journal segment (persistence/timesearch.py):
the binary search against a scan of every batch, for random batch sizes and times."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.client.records import STAMP, STAMP_AT
from tailrace.persistence.index import IndexFile, entries_for
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.timesearch import first_at_or_after

SEGMENT = 1 << 20
FRAME = 64  # each test batch takes 64 journal bytes: only its stamp is read


def _write(tmp, counts: list[int], gaps: list[int]) -> tuple[list[int], list[int]]:
    """Batches of ``counts`` records appended ``gaps`` us apart: their base offsets and times."""
    bases = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    times = (1_700_000_000_000_000 + np.cumsum(gaps)).astype(np.int64)
    seg = bytearray(SEGMENT)
    for i, (b, t) in enumerate(zip(bases.tolist(), times.tolist())):
        STAMP.pack_into(seg, i * FRAME + STAMP_AT, b, t, 3, 7)
    (tmp / JOURNAL_DIR).mkdir(exist_ok=True)
    (tmp / JOURNAL_DIR / segment_name(0)).write_bytes(bytes(seg))
    idx = IndexFile(tmp, 5, writable=True)
    idx.truncate(0)
    n = len(counts)
    idx.write(0, entries_for(np.arange(n, dtype=np.int64) * FRAME, np.full(n, FRAME), np.array(counts)))
    idx.close()
    return bases.tolist(), times.tolist()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_search_finds_what_a_scan_finds(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("ts")
    n = data.draw(st.integers(1, 300))
    counts = data.draw(st.lists(st.integers(1, 50), min_size=n, max_size=n))
    gaps = data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))  # 0: batches in one microsecond
    bases, times = _write(tmp, counts, gaps)
    total = sum(counts)
    lo = data.draw(st.integers(0, total - 1))
    hi = data.draw(st.integers(lo, total))
    t = data.draw(st.integers(times[0] - 5, times[-1] + 5))
    index, journal = IndexFile(tmp, 5), JournalReader(tmp, SEGMENT)
    try:
        got = first_at_or_after(index, journal, lo, hi, t)
    finally:
        index.close()
        journal.close()
    want = None
    for b, c, bt in zip(bases, counts, times):  # the scan: the first batch in [lo, hi) at or after t
        if max(b, lo) < min(b + c, hi) and bt >= t:
            want = (max(b, lo), bt)
            break
    assert got == want
