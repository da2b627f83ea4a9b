"""Delayed delivery on the client side: ``Producer.send(..., deliver_after_ms=...)`` (docs/PROTOCOL.md 4.1c).

A record with a delivery time is not sent with the others: it waits in a ``DelayBuffer``,
grouped by (topic, partition, delivery time rounded *up* to ``GRANULARITY_MS``: never early),
and goes out as one ``PRODUCE_DELAYED`` request per group on ``flush``, ``close`` or when a
group reaches ``max_bytes``. The router keeps the batch in its timer topic and appends it to the
partition at that time (router/timer.py). The request is answered once the batch is durable in
the timer topic; the records' offsets on the partition come at delivery.
"""

from __future__ import annotations

import time

import msgspec

from . import protocol as P
from . import records as R

GRANULARITY_MS = 100  # delivery times are rounded up to this (the timer's precision is ~0.1 s)


class DelayedProduceRequest(msgspec.Struct, omit_defaults=True):
    deliver_at_ms: int  # ms since the epoch: the batch is appended to the partition then, not before
    timeout_ms: int = 30_000


class DelayedProduceReply(msgspec.Struct):
    record_count: int
    deliver_at_ms: int  # as the timer keeps it


def due_ms(deliver_at_ms: int | None, deliver_after_ms: int | None) -> int:
    """The delivery time, rounded up to the timer's granularity."""
    at = int(deliver_at_ms) if deliver_at_ms is not None else int(time.time() * 1000) + int(deliver_after_ms)
    return -(-at // GRANULARITY_MS) * GRANULARITY_MS


def delayed_request(values, keys=None, headers=None, deliver_at_ms: int | None = None,
                    deliver_after_ms: int | None = None) -> tuple[bytes, bytes]:
    """A ``send_delayed`` call's request: (header frame, one batch of the records, created now)."""
    if (deliver_at_ms is None) == (deliver_after_ms is None):
        raise ValueError("send_delayed takes one of deliver_at_ms and deliver_after_ms")
    batch = R.encode_batch(list(values), None if keys is None else list(keys), headers=headers,
                           create_time_us=int(time.time() * 1_000_000))
    return P.encode(DelayedProduceRequest(due_ms(deliver_at_ms, deliver_after_ms))), batch


reply_decoder = P.decoder(DelayedProduceReply)


class DelayBuffer:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.groups: dict[tuple[str, int, int], list] = {}  # (topic, partition, due) -> [values, keys, headers, times_us, bytes]

    def add(self, topic: str, partition: int, due: int, value: bytes, key, headers, time_us: int, nbytes: int) -> bool:
        """Queue one record; True when its group should go out now (it reached ``max_bytes``)."""
        g = self.groups.setdefault((topic, partition, due), [[], [], [], [], 0])
        g[0].append(value)
        g[1].append(key)
        g[2].append(headers)
        g[3].append(time_us)
        g[4] += nbytes
        return g[4] >= self.max_bytes

    def take(self) -> list[tuple[str, int, int, int, bytes]]:
        """Every group as (topic, partition, due, record count, batch), and the buffer emptied."""
        out = []
        for (topic, partition, due), (values, keys, headers, times, _n) in self.groups.items():
            ks = None if all(k is None for k in keys) else [k or b"" for k in keys]
            hs = None if all(h is None for h in headers) else headers
            out.append((topic, partition, due, len(values), R.encode_batch(values, ks, headers=hs, timestamps_us=times)))
        self.groups = {}
        return out

    def __len__(self) -> int:
        return sum(len(g[0]) for g in self.groups.values())
