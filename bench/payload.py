"""Message payloads for every system alike: pre-joined batches and latency-stamped values.

A stamped value starts with CLOCK_MONOTONIC in ns (int64, little-endian) at the moment it was
sent; CLOCK_MONOTONIC is one clock for all processes of a host, so a consumer on the same host
subtracts it from its own reading to get produce-to-consume latency.
"""

from __future__ import annotations

import struct
import time

import numpy as np

STAMP = struct.Struct("<q")


def batch_buffers(size: int, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` values of ``size`` bytes back to back (uint8) and their int32 offsets [count + 1]."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 256, size=size * count, dtype=np.uint8)
    offsets = np.arange(count + 1, dtype=np.int32) * size
    return values, offsets


def value_list(size: int, count: int, seed: int = 0) -> list[bytes]:
    """The same values as a list of bytes objects (for clients that take one value per call)."""
    values, _ = batch_buffers(size, count, seed)
    raw = values.tobytes()
    return [raw[i * size : (i + 1) * size] for i in range(count)]


def stamped_value(buf: bytearray) -> bytes:
    """``buf`` (at least 8 bytes) with the current CLOCK_MONOTONIC ns written at its start."""
    STAMP.pack_into(buf, 0, time.monotonic_ns())
    return bytes(buf)


def stamp_of(value: bytes) -> int:
    return STAMP.unpack_from(value, 0)[0]


def value_stamps(values: np.ndarray, value_offsets: np.ndarray) -> np.ndarray:
    """The stamps of every value in a column set (numpy gather, no Python per message)."""
    starts = value_offsets[:-1].astype(np.int64)
    if len(starts) == 0:
        return np.zeros(0, np.int64)
    idx = starts[:, None] + np.arange(STAMP.size)
    return np.ascontiguousarray(values[idx]).view("<i8").ravel()



ID = STAMP  # a work-queue message starts with its id: int64, little-endian, 0 .. N-1


def id_batch(size: int, first_id: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` values of ``size`` bytes (at least 8) back to back, value i starting with the id
    ``first_id + i`` (the rest zero), and their int32 offsets [count + 1] (send_buffers' shape)."""
    size = max(size, ID.size)
    values = np.zeros((count, size), np.uint8)
    values[:, : ID.size] = np.arange(first_id, first_id + count, dtype="<i8").view(np.uint8).reshape(count, ID.size)
    return values.ravel(), np.arange(count + 1, dtype=np.int32) * size


def id_values(size: int, first_id: int, count: int) -> list[bytes]:
    """The same values as a list of bytes objects (clients that take one value per call)."""
    values, _ = id_batch(size, first_id, count)
    raw, size = values.tobytes(), max(size, ID.size)
    return [raw[i * size : (i + 1) * size] for i in range(count)]


def id_of(value: bytes) -> int:
    return ID.unpack_from(value, 0)[0]


def ack_summary(ids: list[int], stamps: list[int], **extra) -> dict:
    """What a work-queue consumer returns: the ids it acknowledged (in order), the gaps between its
    consecutive acknowledgements (ns, CLOCK_MONOTONIC), and its first and last acknowledgement."""
    t = np.asarray(stamps, np.int64)
    return {"acked": len(ids), "ids": np.asarray(ids, np.int64), "gaps_ns": np.diff(t),
            "first_ack_ns": int(t[0]) if len(t) else 0, "last_ack_ns": int(t[-1]) if len(t) else 0, **extra}
