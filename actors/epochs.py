"""Leader epochs along a partition's log (issue 34): which epoch wrote a batch, and where an
epoch ends. What a failover's divergence check needs (Kafka's KIP-101/279/320), with no epoch
cache of its own.

Every v2 batch carries the leader epoch of the broker that led the partition when it was
appended (the leader stamps it, followers copy it verbatim: docs/FORMAT.md 1.1), and epochs only
grow along a log. So the log itself is the epoch cache: where epoch ``e`` ends is the first
offset whose batch has a larger epoch, found by a binary search over offsets, each probe one
batch header read from the ring (a descriptor search) or from the journal through the dense
index (one 16-byte entry and one header, as seek-by-time does: persistence/timesearch.py). About
2 x log2(n) reads, asked once per follower per leader change (the leader keeps its answers for
epochs below its own: they cannot change while it leads). Kafka keeps a leader-epoch-checkpoint
file per partition beside the log instead, written at every epoch change; a log that is its own
cache cannot disagree with itself after a crash or a cut. A v1 batch (no epoch field) counts as
epoch 0.
"""

from __future__ import annotations

from tailrace.client.records import PREFIX_BYTES, STAMP_V2, STAMP_V2_AT, VERSION_2, VERSION_AT


def epoch_at(actor, offset: int) -> int:
    """The leader epoch of the batch holding ``offset`` (which the log holds)."""
    row, ring = actor.owner_row, actor.ring
    if offset >= row.ring_start_offset and row.desc_head > row.desc_tail:
        seq = ring.find_seq(row.desc_tail, row.desc_head, offset)
        if seq >= row.desc_tail:
            pos = int(ring.descriptors(seq, seq + 1)["position"][0]) % ring.ring_bytes
            mv = ring.mv
            return STAMP_V2.unpack_from(mv, pos + STAMP_V2_AT)[0] if mv[pos + VERSION_AT] == VERSION_2 else 0
    e = actor.log.index().read(offset, 1)
    if len(e) != 1:
        raise OSError(f"slot {actor.slot}: no index entry for offset {offset}")
    pos = int(e["position"][0])
    head = actor.journal.read(pos, PREFIX_BYTES)
    if head[VERSION_AT] != VERSION_2:
        return 0
    return STAMP_V2.unpack(actor.journal.read(pos + STAMP_V2_AT, STAMP_V2.size))[0]


def last_epoch(actor) -> int:
    """The epoch of the log's last batch, -1 for an empty log."""
    row = actor.owner_row
    end = row.next_offset
    return -1 if end <= row.log_start_offset else epoch_at(actor, end - 1)


def end_of_epoch(actor, epoch: int) -> tuple[int, int]:
    """Kafka's OffsetsForLeaderEpoch over this log: (the largest epoch at or below ``epoch`` that
    the log holds, the first offset past it), i.e. where a copy whose last batch is of ``epoch``
    stops agreeing with this log. (-1, log start) if every batch is of a later epoch; (epoch,
    log end) if the log's last batch is of ``epoch`` or earlier."""
    row = actor.owner_row
    lo, hi = row.log_start_offset, row.next_offset
    if hi <= lo:
        return -1, lo
    if epoch_at(actor, hi - 1) <= epoch:
        return epoch_at(actor, hi - 1), hi
    if epoch_at(actor, lo) > epoch:
        return -1, lo
    a, b = lo, hi - 1  # epoch_at(a) <= epoch < epoch_at(b): find the first offset past ``epoch``
    while b - a > 1:
        mid = (a + b) // 2
        if epoch_at(actor, mid) <= epoch:
            a = mid
        else:
            b = mid
    return epoch_at(actor, a), b
