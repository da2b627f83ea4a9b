"""The records of a SHARE_FETCH reply, for the blocking and the asyncio share consumer alike.

A reply carries, per partition, the acquired offset ranges (with their delivery counts) and the
whole record batches that hold them (client/share_protocol.py). ``share_records`` keeps the
acquired records and drops the rest of each batch, one numpy pass per partition (no Python step
per record until the records are made). It does no I/O: ``ShareConsumer`` (share.py) and
``AsyncShareConsumer`` (aio_share.py) both call it on the reply they got.
"""

from __future__ import annotations

import numpy as np

from . import share_protocol as S
from .columns import batches_to_columns
from .consumer import ConsumerCore
from .views import iter_batches


def share_records(reply: S.ShareFetchReply, data, record_type) -> tuple[list, dict[tuple[str, int], np.ndarray]]:
    """The acquired records of ``reply`` (its body ``data``: bytes, a buffer or a zmq frame), each
    a ``record_type`` (``ShareRecord``: the ``Record`` fields, then ``delivery_count``), in reply
    order; and per (topic, partition) the offsets returned (what implicit mode accepts next)."""
    out: list = []
    delivered: dict[tuple[str, int], np.ndarray] = {}
    buf = memoryview(data.buffer if hasattr(data, "buffer") else (data or b"")).cast("B")
    pos = 0
    for part in reply.partitions:
        chunk, pos = buf[pos: pos + part.body_bytes], pos + part.body_bytes
        if not part.acquired:
            continue
        cols = batches_to_columns(iter_batches(chunk), part.acquired[0].first, part.acquired[-1].last + 1)
        firsts = np.array([a.first for a in part.acquired], np.int64)
        lasts = np.array([a.last for a in part.acquired], np.int64)
        counts = np.array([a.delivery_count for a in part.acquired], np.int64)
        where = np.searchsorted(firsts, cols.offsets, side="right") - 1
        keep = (where >= 0) & (cols.offsets <= lasts[np.maximum(where, 0)])
        recs = ConsumerCore._to_records([(part.topic, part.partition, cols)])
        kept = np.flatnonzero(keep).tolist()
        dc = counts[where[keep]].tolist()
        out.extend(record_type(*recs[i], delivery_count=c) for i, c in zip(kept, dc))
        delivered[(part.topic, part.partition)] = cols.offsets[keep]
    return out, delivered
