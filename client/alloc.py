"""Keep large blocks in the process's heap: glibc malloc settings for a process that moves
hundreds of kilobytes per message.

By default glibc serves an allocation above 128 KiB (a threshold it raises as such blocks are
freed, up to 32 MiB) with a fresh ``mmap`` and unmaps it when freed, and gives the top of the
heap back to the kernel once 128 KiB of it is free. A fetch reply copied out of a ring, or a
message ZeroMQ receives, is such a block: every one of them then costs a page fault per 4 KiB
page touched (the kernel zeroes each page), which measured here as a copy at ~1.5 GB/s where a
copy into warm pages runs at several times that (docs/BENCHMARKS.md, "Large blocks").

``keep_large_blocks`` sets the two thresholds (``M_MMAP_THRESHOLD`` 32 MiB, the most glibc
accepts, and ``M_TRIM_THRESHOLD`` 64 MiB): blocks up to 32 MiB come from the heap, and up to
64 MiB of freed heap stays mapped for the next one. The cost is memory that stays resident
after a burst (at most the trim threshold of free heap per arena). Every broker program calls
it at start; a client process may call it too (``tailrace.client.keep_large_blocks()``): it is
process-wide, so the client never calls it on its own. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD_BYTES = 64 << 20


def keep_large_blocks(mmap_threshold: int = MMAP_THRESHOLD_BYTES, trim_threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap and trim thresholds for this process; True if both were taken."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
