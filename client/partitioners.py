"""Partitioners: which partition a record without one goes to.

A partitioner is ``(key, partitions, counter) -> partition``: ``counter`` counts the producer's
choices, 1 at the first. ``ProducerCore`` takes one by name (``PARTITIONERS``) or any callable;
``hash_partition`` is THE key hash every client uses.
"""

from __future__ import annotations

import zlib
from typing import Callable, Sequence

import numpy as np

__all__ = ["PARTITIONERS", "STICKY_RECORDS", "Partitioner", "hash_partition", "hash_partitions", "key_hash",
           "round_robin", "sticky"]

Partitioner = Callable[[bytes | None, int, int], int]  # (key, partitions, counter) -> partition


def round_robin(key: bytes | None, partitions: int, counter: int) -> int:
    return counter % partitions


def hash_partition(key: bytes, partitions: int) -> int:
    """THE key hash (docs/PROTOCOL.md section 10): CRC-32/ISO-HDLC of the key bytes (``zlib.crc32``,
    unsigned) modulo the partition count. Every client uses it: ``Producer``, ``AsyncProducer``
    and ``tailrace produce --key`` (through ``Producer``), so a key lands on one partition whoever
    sends it."""
    return zlib.crc32(key) % partitions


def hash_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """``hash_partition`` of every key as int64[n]: ``zlib.crc32`` mapped in C into numpy, no
    Python step per key (send_batch's hot path)."""
    crcs = np.fromiter(map(zlib.crc32, keys), dtype=np.uint32, count=len(keys))
    return crcs.astype(np.int64) % partitions


def key_hash(key: bytes | None, partitions: int, counter: int) -> int:
    """The default: a keyed record by ``hash_partition``, an unkeyed one round robin (Kafka's
    rule: the key's hash when there is a key)."""
    if key is None:
        return counter % partitions
    return zlib.crc32(key) % partitions


STICKY_RECORDS = 128  # unkeyed records in a row to one partition (Kafka's 16 KiB batch.size at ~128 B)


def sticky(key: bytes | None, partitions: int, counter: int) -> int:
    """Kafka's default partitioner (KIP-480, KIP-794): a keyed record by its key's hash, unkeyed
    records ``STICKY_RECORDS`` in a row to one partition, then to the next. Over time as even as
    round robin; at any moment few partitions take the unkeyed records, so their batches are
    fuller: single sends awaited one at a time (one batch in flight per partition) make one
    batch of many records instead of many batches of a few (docs/BENCHMARKS.md, "The asyncio
    client")."""
    if key is not None:
        return zlib.crc32(key) % partitions  # hash_partition, inline: once per send
    return ((counter - 1) // STICKY_RECORDS) % partitions  # (the counter is 1 at the first choice)


PARTITIONERS = {"round_robin": round_robin, "key_hash": key_hash, "sticky": sticky}
