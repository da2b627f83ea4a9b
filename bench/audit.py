"""A produce workload whose every record can be audited, and the audit.

Record ``i`` of partition ``p`` is 32 bytes: ``p`` (u32), ``i`` (u64) and a 20-byte pattern of
both. The producer sends records of each partition in order, one batch in flight per partition,
with idempotence; it counts, per partition, how many records were acknowledged. Because batches
of a partition are acknowledged in order, the acknowledged records of ``p`` are exactly records
``0 .. acked[p]-1``. The audit reads each partition from offset 0 and requires the log to be
records ``0 .. M-1`` in order, each once, with ``M >= acked[p]``: no acknowledged record lost,
none duplicated, offsets dense, bytes identical.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tailrace import Consumer, Producer
from tailrace.client.errors import TailraceError

REC = 32


def records(partition: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    seq = np.arange(start, start + count, dtype=np.uint64)
    out = np.zeros((count, REC), dtype=np.uint8)
    out[:, 0:4] = np.full(count, partition, dtype=np.uint32).view(np.uint8).reshape(count, 4)
    out[:, 4:12] = seq.view(np.uint8).reshape(count, 8)
    out[:, 12:] = ((seq[:, None] * 7 + partition + np.arange(REC - 12, dtype=np.uint64)) % 253).astype(np.uint8)
    return out.reshape(-1), np.arange(count + 1, dtype=np.int32) * REC


@dataclass
class Produced:
    sent: dict = field(default_factory=dict)  # partition -> records handed to the producer
    acked: dict = field(default_factory=dict)  # partition -> records acknowledged
    errors: list = field(default_factory=list)


def produce_until(bootstrap: str, topic: str, partitions: int, acks: str, stop: threading.Event,
                  batch: int = 200, out: Produced | None = None, max_records: int | None = None,
                  producer=Producer) -> Produced:
    """``producer``: the Producer class, or anything with its API (the tests run the asyncio
    client through it too)."""
    out = out or Produced()
    out.sent = dict.fromkeys(range(partitions), 0)
    out.acked = dict.fromkeys(range(partitions), 0)

    def on_ack(_t, p, _base, n):
        out.acked[p] += n

    prod = producer(bootstrap, acks=acks, on_ack=on_ack, request_timeout_ms=1500, delivery_timeout_ms=90_000,
                    retry_backoff_ms=20)
    rng = random.Random(1)
    try:
        while not stop.is_set() and (max_records is None or sum(out.sent.values()) < max_records):
            p = rng.randrange(partitions)
            n = rng.randint(1, batch)
            values, offsets = records(p, out.sent[p], n)
            prod.send_buffers(topic, values, offsets, partition=p)
            out.sent[p] += n
            while prod.in_flight >= partitions:
                prod.poll(20)
        prod.flush(120_000)
    except TailraceError as exc:
        out.errors.append(exc)
    finally:
        prod.pool.close()
        if hasattr(prod, "_close_loop"):
            prod._close_loop()
    return out


@dataclass
class Audit:
    found: dict
    lost: dict
    duplicated: dict
    out_of_order: dict

    @property
    def ok(self) -> bool:
        return not any(self.lost.values()) and not any(self.duplicated.values()) and not any(self.out_of_order.values())


def tail_until(bootstrap: str, topic: str, stop: threading.Event, out: dict, errors: list, consumer=Consumer) -> None:
    """A live consumer from offset 0: fills ``out[p]`` with column chunks until ``stop`` is set
    and it has caught up with the high watermarks at that moment."""
    try:
        with consumer(bootstrap, max_wait_ms=100) as cons:
            cons.assign(topic, start="earliest")
            ends = None
            counts: dict[int, int] = {}
            while True:
                for _t, p, cols in cons.poll_columns(200):
                    out.setdefault(p, []).append(cols)
                    counts[p] = counts.get(p, 0) + len(cols)
                if stop.is_set():
                    if ends is None:
                        ends = {po.partition: po.high_watermark for po in cons.list_offsets(topic)}
                        give_up = time.monotonic() + 60
                    if all(counts.get(p, 0) >= e for p, e in ends.items()) or time.monotonic() > give_up:
                        return
    except TailraceError as exc:
        errors.append(exc)


def check(chunks: dict[int, list], partitions, produced: Produced) -> Audit:
    """The audit's verdict on what a consumer read: chunks[p] = its column chunks of partition p."""
    found, lost, dup, ooo = {}, {}, {}, {}
    for p in partitions:
        if chunks.get(p):
            offsets = np.concatenate([c.offsets for c in chunks[p]])
            vals = np.concatenate([c.values for c in chunks[p]]).reshape(-1, REC)
        else:
            offsets, vals = np.zeros(0, np.int64), np.zeros((0, REC), np.uint8)
        seqs = vals[:, 4:12].copy().view(np.uint64)[:, 0].astype(np.int64)
        parts = vals[:, 0:4].copy().view(np.uint32)[:, 0]
        expect, _ = records(p, 0, len(seqs))
        found[p] = len(seqs)
        dup[p] = int(len(seqs) - len(np.unique(seqs)))
        ooo[p] = int(np.count_nonzero(offsets != np.arange(len(offsets)))) + int(np.count_nonzero(parts != p)) + \
            int(not np.array_equal(vals.reshape(-1), expect))
        lost[p] = max(0, produced.acked.get(p, 0) - len(np.unique(seqs[seqs < produced.acked.get(p, 0)])))
    return Audit(found, lost, dup, ooo)


def audit(bootstrap: str, topic: str, produced: Produced, isolation: str = "memory", timeout_s: float = 60) -> Audit:
    with Consumer(bootstrap, max_wait_ms=100, isolation=isolation) as cons:
        ends = {po.partition: (po.durable_watermark if isolation == "durable" else po.high_watermark)
                for po in cons.list_offsets(topic)}
        cons.assign(topic, start="earliest")
        chunks: dict[int, list] = {p: [] for p in ends}
        counts = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + timeout_s
        while any(counts[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for _t, p, cols in cons.poll_columns(300):
                chunks[p].append(cols)
                counts[p] += len(cols)
    return check(chunks, ends, produced)
