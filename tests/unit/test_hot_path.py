"""No Python step per message on the produce, flush or fetch path.

Counts the Python lines executed (sys.settrace) for the same operation on a batch of 10 records
and of 5,000 records. A per-message Python loop would make the count grow with the records;
numpy and C (crc32c, memcpy) run no traced lines.
"""

from __future__ import annotations

import gc
import sys

from tailrace.client.records import encode_batch

from tailrace.bench.inprocess import make_storage


def _lines(fn) -> int:
    """Lines ``fn`` runs, with the cycle collector held off: a collection that falls inside the
    call may run finalizers of whatever an earlier test left, lines that are not the path's own
    (a full run once counted 93 lines for 10 records and 102 for 5,000 on the disk read)."""
    n = 0

    def tracer(frame, event, arg):
        nonlocal n
        if event == "line":
            n += 1
        return tracer

    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
        gc.enable()
    return n


def test_produce_flush_and_fetch_run_the_same_python_lines_for_10_or_5000_records(tmp_path, monkeypatch):
    from tailrace.persistence import flusher as flusher_mod

    # The flusher's once-a-second full rescan (RESCAN_NS) is per-second work, not per-message: when
    # a second ran out inside one traced cycle it added 17 lines to that one alone (a flaky failure).
    monkeypatch.setattr(flusher_mod, "RESCAN_NS", 1 << 62)
    st = make_storage(tmp_path / "data", partitions=1, ring_bytes=4 << 20, max_batch_bytes=1 << 20,
                      write_buffer_bytes=4 << 20, segment_bytes=16 << 20,
                      flush_interval_ms=10**7, flush_bytes=1 << 40, checkpoint_interval_ms=10**9)
    actor = st.actors[0]
    counts = {}
    try:
        for n in (10, 5000, 10, 5000):
            frame = encode_batch([b"m" * 100] * n)
            base = actor.high_watermark
            c_append = _lines(lambda: actor.append(frame, 1 << 20))
            c_ring = _lines(lambda: actor.read(base, 1 << 20, 1 << 20, "memory"))
            c_flush = _lines(st.flusher.do_work)
            # force the disk path: read below the ring start by asking the disk reader directly
            c_disk = _lines(lambda: actor._read_disk(base, 1 << 20, 1 << 20, actor.high_watermark))
            counts.setdefault(n, []).append((c_append, c_ring, c_flush, c_disk))
        small, big = counts[10][1], counts[5000][1]
        for name, s, b in zip(("append", "ring read", "flush", "disk read"), small, big):
            assert b <= s + 3, f"{name}: {s} lines for 10 records but {b} for 5000: a per-message loop?"
    finally:
        st.close()


def test_keyed_send_batch_partitions_by_key_hash_with_the_same_python_lines_for_10_or_5000_records():
    import zlib

    from tailrace.client.producer import ProducerCore

    core = ProducerCore(acks="memory")  # the default partitioner: the key hash
    counts = {}
    for n in (10, 5000, 10, 5000):
        keys = [b"user-%d" % i for i in range(n)]
        values = [b"v" * 50] * n
        out = []
        counts.setdefault(n, []).append(_lines(lambda: out.extend(core._split_batch("t", values, keys, 8))))
        placed = {k: p for p, _vs, ks, _hs, _ts in out for k in ks}
        assert all(placed[k] == zlib.crc32(k) % 8 for k in keys)
    assert max(counts[5000]) <= min(counts[10]) + 3, f"{counts}: a per-record loop?"


def test_a_v2_batch_with_headers_times_and_a_codec_is_built_and_read_with_the_same_python_lines_for_10_or_5000():
    """Format v2's promise (docs/FORMAT.md 1.2): headers, per-record times and compression add
    no Python step per record, building (from per-record header lists) or reading (to columns)."""
    from tailrace.client import codecs
    from tailrace.client.records import STAMP, STAMP_AT, batches_to_columns, encode_batch, iter_batches

    counts: dict[int, list[int]] = {}
    for _ in range(3):
        for n in (10, 5000):
            values = [b"v%d" % i for i in range(n)]
            headers = [[("trace", b"%d" % i), ("kind", None)] if i % 3 else None for i in range(n)]
            times = list(range(n))
            built = []
            lines = _lines(lambda: built.append(encode_batch(values, headers=headers, timestamps_us=times,
                                                            compression=codecs.ZSTD)))
            frame = bytearray(built[0])
            STAMP.pack_into(frame, STAMP_AT, 0, 1, 0, 1)
            cols = []
            lines += _lines(lambda: cols.append(batches_to_columns(iter_batches(bytes(frame)), 0)))
            assert len(cols[0]) == n and cols[0].headers is not None
            counts.setdefault(n, []).append(lines)
    assert max(counts[5000]) <= min(counts[10]) + 3, f"{counts}: a per-record loop?"
