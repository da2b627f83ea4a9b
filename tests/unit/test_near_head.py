"""shm/ring.py ``near_head``: the plain-Python read of the newest batches (the worker's fetch and
the same-host reader both take it first) returns exactly what the numpy search and cut return."""

from __future__ import annotations

import types

from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace.shm import layout
from tailrace.shm.ring import NEAR_HEAD, READ_WINDOW, Ring, cut_batches, near_head

RING_BYTES = 1 << 17  # holds the most the test lays out (24 frames of up to 3,000 bytes): no lap over a live batch


def _ring(batches: list[tuple[int, int]], first_seq: int, first_base: int):
    """A ring in a bytearray holding ``batches`` (length, count) laid out as the writer lays
    them (a batch never straddles the end: it skips to the next lap), each frame's bytes a
    pattern of its own; returns (ring, tail, head)."""
    ring = Ring(types.SimpleNamespace(buf=bytearray(layout.ring_region_bytes(RING_BYTES))), 0, RING_BYTES)
    pos, base = 3 * RING_BYTES, first_base  # some laps in already
    for i, (length, count) in enumerate(batches):
        frame = layout.align_frame(length)
        if pos % RING_BYTES + frame > RING_BYTES:
            pos += RING_BYTES - pos % RING_BYTES
        at = pos % RING_BYTES
        ring.data[at : at + frame] = (first_seq + i) % 251
        ring.desc[(first_seq + i) % ring.desc_capacity] = (pos, base, length, count)
        pos, base = pos + frame, base + count
    return ring, first_seq, first_seq + len(batches)


def _numpy_read(ring: Ring, tail: int, head: int, offset: int, max_bytes: int, max_records: int, hw: int):
    seq = ring.find_seq(tail, head, offset)
    descs = ring.descriptors(seq, min(head, seq + READ_WINDOW))
    take = descs[: cut_batches(descs, offset, max_bytes, max_records, hw)]
    body = b"".join(ring.copy_batches(take))
    nxt = int(take[-1]["base_offset"]) + int(take[-1]["count"])
    return seq, body, int(take[0]["base_offset"]), int(take[0]["count"]), nxt


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(72, 3000), st.integers(1, 40)), min_size=1, max_size=NEAR_HEAD + 8),
    first_seq=st.integers(0, 5000),
    first_base=st.integers(0, 10**6),
    data=st.data(),
)
def test_near_head_reads_what_the_numpy_search_and_cut_read(batches, first_seq, first_base, data):
    ring, tail, head = _ring(batches, first_seq, first_base)
    end = first_base + sum(c for _l, c in batches)
    offset = data.draw(st.integers(first_base, end - 1), label="offset")
    hw = data.draw(st.integers(offset + 1, end), label="hw")
    newest = [first_base + sum(c for _l, c in batches[:i]) for i in range(len(batches))]
    j = sum(1 for b in newest if b <= offset) - 1  # the batch holding offset
    sums = [sum(layout.align_frame(length) for length, _c in batches[j:i]) for i in range(j + 1, len(batches) + 1)]
    max_bytes = data.draw(st.integers(1, 40_000) | st.sampled_from(sums), label="max_bytes")  # and exact fits
    max_records = data.draw(st.integers(1, hw - offset), label="max_records")
    got = near_head(ring, tail, head, offset, max_bytes, max_records, hw)
    if j < len(batches) - NEAR_HEAD:  # offset below the NEAR_HEAD newest batches
        assert got is None
        return
    assert got is not None
    assert got == _numpy_read(ring, tail, head, offset, max_bytes, max_records, hw)
