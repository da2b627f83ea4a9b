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
from .columns import CREATE_TIME, batches_to_columns
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
        kept = np.flatnonzero(keep)
        out.extend(_make(record_type, part.topic, part.partition, cols, kept, counts[where[kept]]))
        delivered[(part.topic, part.partition)] = cols.offsets[kept]
    return out, delivered


def _make(record_type, topic: str, partition: int, cols, kept: np.ndarray, counts: np.ndarray) -> list:
    """The records at ``kept`` of ``cols``, each made once (``record_type(topic, partition, offset,
    timestamp ms, key, value, headers, timestamp_type, delivery_count)``)."""
    v, vo = cols.values.tobytes(), cols.value_offsets.tolist()
    k, ko, kv = cols.keys.tobytes(), cols.key_offsets.tolist(), cols.key_valid.tolist()
    ts = (cols.timestamps_us // 1000).tolist()
    offs = cols.offsets.tolist()
    hs = cols.headers.lists() if cols.headers is not None else None
    tt = cols.timestamp_types.tolist() if cols.timestamp_types is not None else None
    return [record_type(topic, partition, offs[i], ts[i], k[ko[i]:ko[i + 1]] if kv[i] else None, v[vo[i]:vo[i + 1]],
                        hs[i] if hs is not None else (), tt[i] if tt is not None else CREATE_TIME, c)
            for i, c in zip(kept.tolist(), counts.tolist())]
