"""Tallies: byte counters by key, one column of writers per process, summed by any of them.

``/tailrace-<id>-tally`` (shm/region.py names it; it goes with the instance's other regions at a
clean shutdown and at a full boot)::

    +-----------------+------------------------------------------------------------------+
    | header (64 B)   | writer 0: KEYS cells x 32 B | writer 1: ... | writer WRITERS-1   |
    +-----------------+------------------------------------------------------------------+

    cell: key (int64, nonzero; 0 = free) | count[0..COUNTS) | mark[0..COUNTS)   (int64 each)

Each writer (a worker, by its id) stores only into its own block, so no two processes ever store
to one word and no lock is needed (the single-writer principle of the control table). A key's
cell in a block is found by open addressing from ``key % KEYS`` with linear probing; a writer
claims a free cell by storing the key, its counters start at zero and only grow. A reader sums a
key's counters over every block, probing each the same way: loads of another writer's words may
be stale, never torn (aligned int64). The counters are cumulative since the region was made: a
writer restarted after a crash finds its cells where it left them and counts on. Beside each
counter a writer keeps a mark, a number it last stored (``mark``); ``latest`` is the largest mark
of a key over every writer (quotas keep a time there, so a worker that first meets a principal
learns how far the others have already moved its clock).

What the counters mean is the caller's (broker/quota.py: bytes produced and fetched per
principal); this module knows keys and numbers only.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import posix_ipc

from .region import NAME_PREFIX, Region

TALLY_MAGIC = 0x54524C59_00000002  # "TRLY" + layout version
WRITERS = 256  # one block per worker id (router/liveness.py MAX_WORKERS)
KEYS = 512  # distinct keys one writer can count (principals with a quota)
COUNTS = 2
CELL_WORDS = 1 + 2 * COUNTS  # key, counters, marks
HEADER_WORDS = 8
REGION_BYTES = (HEADER_WORDS + WRITERS * KEYS * CELL_WORDS) * 8


def tally_name(instance: str) -> str:
    return f"/{NAME_PREFIX}{instance}-tally"


def key_of(name: str) -> int:
    """A stable, nonzero 63-bit key for a name (the same in every process)."""
    k = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)
    return k or 1


class TableFull(Exception):
    """A writer's block has no free cell for another key."""


class Tally:
    """The tally region as one process sees it: ``add`` into its own block, ``total`` over all."""

    def __init__(self, instance: str, writer: int):
        if not 0 <= writer < WRITERS:
            raise ValueError(f"writer {writer} out of 0..{WRITERS - 1}")
        self.region = _create_or_attach(tally_name(instance))
        words = np.frombuffer(self.region.buf, dtype=np.int64, count=REGION_BYTES // 8)
        self.header = words[:HEADER_WORDS]
        self.cells = words[HEADER_WORDS:].reshape(WRITERS, KEYS, CELL_WORDS)
        self.writer = writer
        self.mine = self.cells[writer]
        self._where: dict[int, int] = {}  # key -> its cell index in our block

    def _cell(self, block: np.ndarray, key: int, claim: bool) -> int:
        i = key % KEYS
        for _ in range(KEYS):
            k = int(block[i, 0])
            if k == key:
                return i
            if k == 0:
                if not claim:
                    return -1
                block[i, 1:] = 0
                block[i, 0] = key  # the key last: a reader that finds it finds zeroed counters
                return i
            i = (i + 1) % KEYS
        if claim:
            raise TableFull(f"no free tally cell for another key (at most {KEYS} per writer)")
        return -1

    def add(self, key: int, which: int, n: int) -> None:
        """Count ``n`` more for ``key`` in counter ``which`` of our block."""
        i = self._where.get(key)
        if i is None:
            i = self._where[key] = self._cell(self.mine, key, claim=True)
        self.mine[i, 1 + which] += n

    def mark(self, key: int, which: int, value: int) -> None:
        """Store ``value`` as our mark ``which`` of ``key``."""
        i = self._where.get(key)
        if i is None:
            i = self._where[key] = self._cell(self.mine, key, claim=True)
        self.mine[i, 1 + COUNTS + which] = value

    def latest(self, key: int, which: int) -> int:
        """The largest mark ``which`` of ``key`` over every writer (0 if none)."""
        return self._over_blocks(key, 1 + COUNTS + which, np.max, max, 0)

    def total(self, key: int, which: int) -> int:
        """Counter ``which`` of ``key`` summed over every writer's block."""
        return self._over_blocks(key, 1 + which, np.sum, lambda a, b: a + b, 0)

    def _over_blocks(self, key: int, col: int, reduce, combine, empty: int) -> int:
        start = key % KEYS
        # fast path: most keys sit in their home cell in every block (one vectorised look)
        home = self.cells[:, start, :]
        at_home = home[:, 0] == key
        found = home[at_home, col]
        result = int(reduce(found)) if len(found) else empty
        for w in np.flatnonzero((home[:, 0] != key) & (home[:, 0] != 0)):  # displaced: probe that block
            i = self._cell(self.cells[w], key, claim=False)
            if i >= 0:
                result = combine(result, int(self.cells[w, i, col]))
        return result

    def close(self) -> None:
        self.header = self.cells = self.mine = None
        self.region.close()


def _create_or_attach(name: str) -> Region:
    try:
        r = Region.create(name, REGION_BYTES)
        words = np.frombuffer(r.buf, dtype=np.int64, count=HEADER_WORDS)
        words[1] = REGION_BYTES
        words[0] = TALLY_MAGIC  # last: attachers wait for it
        return r
    except posix_ipc.ExistentialError:
        pass
    deadline = time.monotonic() + 2.0
    while True:  # another process is making it: wait until it is sized and stamped
        try:
            r = Region.attach(name)
        except posix_ipc.ExistentialError:  # unlinked between our tries (a full boot): make it
            return _create_or_attach(name)
        if r.size >= REGION_BYTES and int(np.frombuffer(r.buf, dtype=np.int64, count=1)[0]) == TALLY_MAGIC:
            return r
        r.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"shared memory {name} exists but was never initialised")
        time.sleep(0.01)
