"""Run load-generator functions in their own processes, start them together, collect results.

Some facts about multiprocessing and ZeroMQ: a ZeroMQ context must never cross a fork (its I/O
thread does not survive it), and a forked child also inherits the parent's sockets and state.
The *spawn* start method runs a fresh interpreter that imports the target by name, with the
parent's ``sys.path``.

What this means for us: every load generator is a plain top-level function, named as
``"module:function"``, that builds its own client inside the child. It is called as
``fn(spec, ctx)``: it connects and prepares, calls ``ctx.ready()`` (which blocks until every
child is ready and the parent says go), does its work, bumps ``ctx.add(n)`` as it goes for the
progress bar, and returns a dict of counts. The child adds its own timing and CPU figures.

Every child, whatever system it drives, first sets glibc's large-block thresholds
(client/alloc.py ``keep_large_blocks``, as the broker's programs do): without it a Python
client that receives messages of hundreds of kilobytes takes a page fault per 4 KiB of each
(tailrace's consumer read 8 partitions 0.67x as fast), and the figures would measure the
allocator's policy more than the system.

Timing: CLOCK_MONOTONIC is one clock for every process of a host, so the children's start and
end stamps are comparable; throughput is counted from the first child's start to the last
child's end. The time series (``RunResult.series``, progress.Sampler) counts from the parent's
release instead, a few hundred microseconds earlier: it is for pictures, not for the figures.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import queue
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from tailrace.client.alloc import keep_large_blocks

from .procstat import CpuMeter, self_cpu_seconds
from .progress import Progress, Sampler

READY_TIMEOUT_S = 120.0


class LoadgenError(RuntimeError):
    """Raised when a load-generator process fails; carries the child's traceback."""


class Ctx:
    """What a load-generator function gets besides its spec (lives in the child)."""

    def __init__(self, index: int, counters, go, events):
        self.index = index
        self._counters = counters  # every child's multiprocessing Value('q'), in job order
        self._counter = counters[index]  # this child is its only writer
        self._go = go
        self._events = events
        self.t_start = 0.0
        self.cpu_start = 0.0

    def ready(self) -> None:
        self._events.put(("ready", self.index, None))
        self._go.wait()
        self.t_start = time.monotonic()
        self.cpu_start = self_cpu_seconds()

    def add(self, n: int) -> None:
        self._counter.value += n

    def total(self) -> int:
        """Every child's count so far (each written by its child only): the work-queue consumers
        stop once all of them together acknowledged what was loaded."""
        return sum(c.value for c in self._counters)


def _resolve(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(target: str, spec: dict, index: int, counters, go, events) -> None:
    keep_large_blocks()  # every system's driver alike (client/alloc.py): no page fault per large message
    try:
        ctx = Ctx(index, counters, go, events)
        out = _resolve(target)(spec, ctx) or {}
        out["t_start"] = ctx.t_start
        out["t_end"] = time.monotonic()
        out["cpu_s"] = self_cpu_seconds() - ctx.cpu_start
        events.put(("done", index, out))
    except BaseException:
        events.put(("error", index, traceback.format_exc()))


@dataclass
class Job:
    target: str  # "module:function"
    spec: dict


@dataclass
class RunResult:
    results: list[dict]  # one per job, in job order
    wall_s: float  # first child start -> last child end
    broker_cpu: dict[str, dict] = field(default_factory=dict)  # name -> {"pid", "cpu_s", "cpu_pct"}
    loadgen: dict = field(default_factory=dict)  # {"processes", "cpu_s", "cpu_pct"}
    series: list[list[float]] = field(default_factory=list)  # [[seconds since release, count so far], ...]


def run_jobs(jobs: list[Job], *, label: str, total: int, timeout_s: float,
             broker_pids: dict[str, int] | None = None, on_go: Callable[[], Callable[[], None]] | None = None) -> RunResult:
    """Start every job in its own spawned process, release them together, wait for all.

    ``on_go`` is called right after the release and returns a function called once all jobs
    ended (the profiler uses it). Raises LoadgenError if any child fails or time runs out.
    """
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    events = ctx.Queue()
    counters = [ctx.Value("q", 0, lock=False) for _ in jobs]
    procs = [ctx.Process(target=_child, args=(j.target, j.spec, i, counters, go, events), daemon=True,
                         name=f"bench-loadgen-{i}") for i, j in enumerate(jobs)]
    results: list[dict | None] = [None] * len(jobs)

    def done() -> int:  # messages so far, every child's; read by the progress and sampler threads
        return sum(c.value for c in counters)

    sampler = Sampler(done)
    try:
        for p in procs:
            p.start()
        _wait_ready(events, procs, results)
        meter = CpuMeter(broker_pids or {})
        meter.start()
        go.set()
        sampler.start()
        after = on_go() if on_go is not None else None
        deadline = time.monotonic() + timeout_s
        with Progress(label, total, done):
            while any(r is None for r in results):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LoadgenError(f"{label}: load generators still running after {timeout_s:.0f}s")
                try:
                    kind, i, payload = events.get(timeout=min(left, 1.0))
                except queue.Empty:
                    _check_alive(procs, results)
                    continue
                if kind == "error":
                    raise LoadgenError(f"{label}: load generator {i} failed:\n{payload}")
                if kind == "done":
                    results[i] = payload
        broker_cpu = meter.stop()
        series = sampler.stop()
        if after is not None:
            after()
    finally:
        sampler.stop()
        for p in procs:
            if p.pid is None:  # never started
                continue
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    t0 = min(r["t_start"] for r in results)
    t1 = max(r["t_end"] for r in results)
    wall = max(t1 - t0, 1e-9)
    cpu = sum(r["cpu_s"] for r in results)
    return RunResult(results, wall, broker_cpu,
                     {"processes": len(jobs), "cpu_s": round(cpu, 3), "cpu_pct": round(100 * cpu / wall, 1)}, series)


def _wait_ready(events, procs, results) -> None:
    pending = set(range(len(procs)))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LoadgenError(f"load generators {sorted(pending)} not ready in {READY_TIMEOUT_S:.0f}s")
        try:
            kind, i, payload = events.get(timeout=min(left, 1.0))
        except queue.Empty:
            _check_alive(procs, results)
            continue
        if kind == "error":
            raise LoadgenError(f"load generator {i} failed before it was ready:\n{payload}")
        if kind == "ready":
            pending.discard(i)
        elif kind == "done":  # finished without calling ready(): counts as ready and done
            pending.discard(i)
            results[i] = payload


def _check_alive(procs, results) -> None:
    for i, p in enumerate(procs):
        if results[i] is None and p.exitcode is not None:
            raise LoadgenError(f"load generator {i} exited with code {p.exitcode} without a result")
