"""Batch compression: Kafka's four codecs, from well-kept libraries with wheels for every
platform, never written here: zstd from ``zstandard`` (python-zstandard, libzstd's bindings, a
compression context kept per thread and level), lz4 from ``lz4`` (python-lz4, the LZ4 frame
format), snappy and gzip from ``cramjam``. Measured on 100 KB of 100-byte log lines, the first two
are 1.5-2x faster than cramjam's zstd and lz4, which build a context per call (docs/BENCHMARKS.md
"Record format v2").

A v2 batch (client/records.py) compresses its record section as one block: the header stays
plain, so the broker stamps, indexes and checks the CRC without touching the codec. The ids are
Kafka's (the attribute's low three bits): 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. The formats
are the standard containers, so any language's library reads them: gzip (RFC 1952), snappy's raw
block format (no framing: the batch header holds the size), the LZ4 frame format, zstd frames
(RFC 8878).

Decompression is bounded: the caller gives the size the header declares (``records_bytes``, at
most the broker's ``max_batch_bytes``); the codec is asked for at most one byte more than that,
whatever the compressed data claims about itself, and anything but exactly that size (a zip bomb,
truncated or corrupt data) raises ``CodecError``, never a partial section.
"""

from __future__ import annotations

import threading

import cramjam
import lz4.frame
import numpy as np
import zstandard

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
IDS = {name: cid for cid, name in NAMES.items()}
IDS["uncompressed"] = NONE  # Kafka's topic-level spelling of "none"
CODEC_MASK = 0x07
# Each codec's level when the producer names none: zstd 1 (Kafka's is 3: on 100-byte log lines
# level 1 stores 0.325x for about 30% less CPU than level 3's 0.314x, and on two cores the producer
# is CPU-bound: docs/BENCHMARKS.md "Record format v2"), gzip 6 (zlib's), lz4 0 (the fast mode:
# the frame's higher levels cost 5x the time for 15% less here); snappy has no levels.
DEFAULT_LEVELS = {GZIP: 6, LZ4: 0, ZSTD: 1}
LEVEL_RANGES = {GZIP: (1, 9), LZ4: (0, 16), ZSTD: (-7, 22)}


class CodecError(ValueError):
    """Compressed bytes that do not inflate to exactly the declared size (corrupt, truncated,
    or larger than declared)."""


def codec_id(name: str | None) -> int:
    """The id of a codec name (``None``/"none" -> 0); ValueError names the choices."""
    if name is None:
        return NONE
    try:
        return IDS[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"compression={name!r}: one of {', '.join(sorted(IDS))}") from None


def check_level(codec: int, level: int | None) -> int | None:
    """``level`` if the codec takes it (None: the codec's default), else ValueError."""
    if level is None or codec in (NONE, SNAPPY):
        return None if codec in (NONE, SNAPPY) else DEFAULT_LEVELS[codec]
    lo, hi = LEVEL_RANGES[codec]
    if not lo <= level <= hi:
        raise ValueError(f"compression_level={level} for {NAMES[codec]}: {lo}..{hi}")
    return level


_local = threading.local()  # zstd contexts: not to be shared between threads


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level)  # writes the content size in the frame
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def compress(codec: int, data, level: int | None = None) -> memoryview:
    """``data`` (bytes-like) as one compressed block of ``codec``."""
    if codec == ZSTD:
        out = _zstd_compressor(DEFAULT_LEVELS[ZSTD] if level is None else level).compress(data)
    elif codec == LZ4:
        out = lz4.frame.compress(data, compression_level=DEFAULT_LEVELS[LZ4] if level is None else level)
    elif codec == SNAPPY:
        out = cramjam.snappy.compress_raw(data)
    elif codec == GZIP:
        out = cramjam.gzip.compress(data, level=DEFAULT_LEVELS[GZIP] if level is None else level)
    else:
        raise ValueError(f"codec id {codec}: none of {sorted(NAMES)}")
    return memoryview(out)


def decompress(codec: int, data, size: int) -> np.ndarray:
    """``data`` inflated: a uint8 array of exactly ``size`` bytes, or CodecError."""
    try:
        if codec == ZSTD:
            with _zstd_decompressor().stream_reader(data) as r:  # one frame, at most size + 1 bytes
                out = r.read(size + 1)
        elif codec == LZ4:
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=size + 1)
            if not d.eof and len(out) <= size:
                raise CodecError(f"lz4 data ends before its frame does ({len(out)} of {size} bytes)")
        elif codec in (SNAPPY, GZIP):  # into a buffer of the declared size: one byte more fails the call
            out = np.empty(max(size, 1), dtype=np.uint8)
            into = cramjam.snappy.decompress_raw_into if codec == SNAPPY else cramjam.gzip.decompress_into
            out = out[: into(data, out)]
        else:
            raise CodecError(f"codec id {codec}: none of {sorted(NAMES)}")
    except CodecError:
        raise
    except (cramjam.DecompressionError, zstandard.ZstdError, RuntimeError, ValueError, OSError) as exc:
        raise CodecError(f"{NAMES.get(codec, codec)} data does not inflate to the declared {size} bytes: {exc}") from None
    if len(out) != size:
        raise CodecError(f"{NAMES[codec]} data inflates to {'more than ' if len(out) > size else ''}{len(out)} bytes, "
                         f"the batch declares {size}")
    return out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)
