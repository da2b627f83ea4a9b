"""Batch compression: Kafka's four codecs, from one library (cramjam: Rust bindings, wheels for
every platform, the same library for all four), never written here.

A v2 batch (client/records.py) compresses its record section as one block: the header stays
plain, so the broker stamps, indexes and checks the CRC without touching the codec. The ids are
Kafka's (the attribute's low three bits): 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. The formats
are the standard containers, so any language's library reads them: gzip (RFC 1952), snappy's raw
block format (no framing: the batch header holds the size), the LZ4 frame format, zstd frames
(RFC 8878).

Decompression is bounded: the caller gives the size the header declares (``records_bytes``, at
most the broker's ``max_batch_bytes``), the codec writes into a buffer of exactly that size and
fails if the data would overflow it (a zip bomb) or falls short (truncated): both raise
``CodecError``, never a partial section.
"""

from __future__ import annotations

import cramjam
import numpy as np

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
IDS = {name: cid for cid, name in NAMES.items()}
IDS["uncompressed"] = NONE  # Kafka's topic-level spelling of "none"
CODEC_MASK = 0x07
# Each codec's level when the producer names none: zstd 3 (zstd's and Kafka's default), gzip 6
# (zlib's), lz4 1 (the fast mode: the frame's higher levels cost 5x the time for 15% less here);
# snappy has no levels.
DEFAULT_LEVELS = {GZIP: 6, LZ4: 1, ZSTD: 3}
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


def compress(codec: int, data, level: int | None = None) -> memoryview:
    """``data`` (bytes-like) as one compressed block of ``codec``."""
    if codec == ZSTD:
        out = cramjam.zstd.compress(data, level=DEFAULT_LEVELS[ZSTD] if level is None else level)
    elif codec == LZ4:
        out = cramjam.lz4.compress(data, level=DEFAULT_LEVELS[LZ4] if level is None else level)
    elif codec == SNAPPY:
        out = cramjam.snappy.compress_raw(data)
    elif codec == GZIP:
        out = cramjam.gzip.compress(data, level=DEFAULT_LEVELS[GZIP] if level is None else level)
    else:
        raise ValueError(f"codec id {codec}: none of {sorted(NAMES)}")
    return memoryview(out)


def decompress(codec: int, data, size: int) -> np.ndarray:
    """``data`` inflated into a new uint8 array of exactly ``size`` bytes, or CodecError."""
    out = np.empty(size, dtype=np.uint8)
    if size == 0:
        return out
    try:
        if codec == ZSTD:
            n = cramjam.zstd.decompress_into(data, out)
        elif codec == LZ4:
            n = cramjam.lz4.decompress_into(data, out)
        elif codec == SNAPPY:
            n = cramjam.snappy.decompress_raw_into(data, out)
        elif codec == GZIP:
            n = cramjam.gzip.decompress_into(data, out)
        else:
            raise CodecError(f"codec id {codec}: none of {sorted(NAMES)}")
    except (cramjam.DecompressionError, ValueError, OSError) as exc:  # corrupt, or more than declared
        raise CodecError(f"{NAMES.get(codec, codec)} data does not inflate to the declared {size} bytes: {exc}") from None
    if n != size:
        raise CodecError(f"{NAMES[codec]} data inflates to {n} bytes, the batch declares {size}")
    return out
