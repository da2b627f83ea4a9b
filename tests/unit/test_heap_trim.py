"""broker/heap.py against this process's own glibc heap: freed memory that stays resident is
given back once the program goes quiet, once per quiet spell, never while it works."""

from __future__ import annotations

import pytest

from tailrace.broker.heap import HeapTrim, resident_bytes

pytestmark = pytest.mark.skipif(not HeapTrim().available, reason="not glibc: nothing to trim")


def _churn(blocks: int = 3000, size: int = 70_000) -> list:
    """Blocks under the mmap threshold (on the heap), every other one freed: free memory the heap
    keeps (its top is held by the live ones, so free() alone returns nothing)."""
    keep = [bytearray(size) for _ in range(blocks)]
    del keep[::2]
    return keep


def test_freed_heap_is_given_back_once_quiet_once_a_spell_and_never_while_working():
    trim = HeapTrim(quiet_s=5.0, free_bytes=16 << 20)
    live = _churn()
    assert trim.free_heap() >= 64 << 20
    t = trim.active_at
    assert not trim.maybe(t + 1, active=True)
    assert not trim.maybe(t + 20, active=True), "working: its free heap is what it reuses next"
    assert not trim.maybe(t + 24, active=False), "quiet for 4 s only"
    before = resident_bytes()
    assert trim.maybe(t + 25.5, active=False)
    assert before - resident_bytes() >= 64 << 20, "the free half of ~200 MiB handed back"
    assert trim.trims == 1 and trim.given_back >= 64 << 20
    assert not trim.maybe(t + 40, active=False), "once a quiet spell"
    live += _churn()
    assert not trim.maybe(t + 41, active=True)
    assert trim.maybe(t + 47, active=False) and trim.trims == 2
    del live


def test_a_quiet_program_with_little_free_heap_is_left_alone():
    trim = HeapTrim(quiet_s=0.0, free_bytes=1 << 40)
    assert not trim.maybe(trim.active_at + 1, active=False) and trim.looked and trim.trims == 0
