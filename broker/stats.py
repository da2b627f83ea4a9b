"""Each broker process's own counters, for the metrics exporter (ops/metrics.py).

A process counts in plain Python ints and lists (no lock, no syscall: about a microsecond a
request) and, at most once a second, writes a snapshot to ``<run dir>/stats/<process>.msgpack``
(write-then-rename: a reader never sees half a file; docs/FORMAT.md, "Process counters"). The
exporter reads these files at each scrape, with the control table, and exposes everything through
prometheus_client. A snapshot carries the process's ``boot_ns``: when a process restarts its
counters start again from zero, and the exporter adds the last snapshot of the old life to them,
so no counter ever goes backwards.

Counters written here are never per record: a produce request adds its record count once.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left

import msgspec

from .datadir import FLUSHER_ROLE, STATS_SUFFIX, stats_dir, stats_file, write_atomic

WRITE_EVERY_S = 1.0
# Latency buckets in seconds (upper bounds; +Inf is added by the exposition): 50 us .. 10 s.
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_BOUNDS_NS = [int(b * 1e9) for b in LATENCY_BUCKETS]


class Histogram:
    """Bucket counts (not cumulative; the last one is +Inf) and the sum, in seconds."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self):
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum_ns = 0

    def observe_ns(self, ns: int) -> None:
        self.counts[bisect_left(_BOUNDS_NS, ns)] += 1
        self.sum_ns += ns

    def snapshot(self) -> dict:
        return {"counts": list(self.counts), "sum": self.sum_ns / 1e9}


class Snapshot(msgspec.Struct, omit_defaults=True):
    """What one process reports. ``counters`` and ``histograms`` only grow within one ``boot_ns``;
    ``gauges`` are values now. Keys are metric names without the ``tailrace_`` prefix, then
    ``|``-joined label values in the order the exporter knows for that name."""

    process: str
    pid: int
    boot_ns: int
    written_ns: int = 0
    counters: dict[str, dict[str, float]] = {}
    gauges: dict[str, dict[str, float]] = {}
    histograms: dict[str, dict[str, dict]] = {}


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Snapshot).decode


class StatsFile:
    """The writer side: ``maybe_write(build)`` calls ``build()`` for a Snapshot's parts and writes
    it when WRITE_EVERY_S has passed (or always, with ``force``)."""

    def __init__(self, run_dir: str, process: str):
        self.dir = stats_dir(run_dir)
        self.path = stats_file(run_dir, process)
        self.process = process
        self.boot_ns = time.time_ns()
        self.next_at = 0.0

    def maybe_write(self, build, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now < self.next_at:
            return False
        self.next_at = now + WRITE_EVERY_S
        counters, gauges, histograms = build()
        snap = Snapshot(self.process, os.getpid(), self.boot_ns, time.time_ns(), counters, gauges, histograms)
        try:
            # the stats folder only, never the run directory above it: a process still writing
            # after its broker removed the run directory would make it again, and its parents
            # (os.makedirs gives every folder but the last the default mode: /run/tailrace 0755,
            # which every later broker then refuses as not private)
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False  # the run directory is going away: the broker is stopping
        try:
            write_atomic(self.path, _encode(snap), sync=False)
        except OSError:
            return False
        return True


def read_all(run_dir: str) -> list[Snapshot]:
    """Every process's last snapshot (unreadable or half-made files are skipped)."""
    out = []
    d = stats_dir(run_dir)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(STATS_SUFFIX):
            continue
        try:
            with open(os.path.join(d, name), "rb") as f:
                out.append(_decode(f.read()))
        except (OSError, msgspec.DecodeError):
            continue
    return out


def label_key(*values) -> str:
    return "|".join(str(v) for v in values)


def flusher_disk(run_dir: str) -> dict:
    """The flusher's disk figures from its last snapshot (at most WRITE_EVERY_S old), for
    ``tailrace status``: ``storage_full``, ``disk_used_ratio`` (-1 without a snapshot) and
    ``records_force_deleted`` (by disk_full_policy=delete_oldest since the flusher started)."""
    try:
        with open(stats_file(run_dir, FLUSHER_ROLE), "rb") as f:
            snap = _decode(f.read())
    except (OSError, msgspec.DecodeError):
        return {"storage_full": False, "disk_used_ratio": -1.0, "records_force_deleted": 0}
    return {"storage_full": bool(snap.gauges.get("storage_full", {}).get("", 0)),
            "disk_used_ratio": float(snap.gauges.get("journal_disk_used_ratio", {}).get("", -1.0)),
            "records_force_deleted": int(snap.counters.get("journal_records_forced", {}).get("", 0))}
