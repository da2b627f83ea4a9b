"""A live progress line on stderr, and a throughput time series, fed by counters the
load-generator processes bump.

On a terminal the line is redrawn in place (``\\r``) five times a second; otherwise (CI logs, a
pipe) one plain line is printed every few seconds so logs stay short. It never writes to
stdout: ``--json`` output stays machine-readable.

``Sampler`` reads the same counters at a fixed period (SAMPLE_PERIOD_S, whatever the display
does) for the measured phase; the result rows carry its points as ``series`` and ``--plot``
draws their rate (bench/plot.py).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

BAR_WIDTH = 28
TTY_PERIOD_S = 0.2
PLAIN_PERIOD_S = 5.0
# Fine enough for a measured phase of a quarter second (2M messages batched on this machine
# kind): about a dozen points. Each sample sums a few shared int64s, microseconds, 50 times a
# second. A 120 s phase is 6,000 points; the rows keep at most SERIES_MAX_POINTS of them.
SAMPLE_PERIOD_S = 0.02
SERIES_MAX_POINTS = 300


def _fmt_count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}k"
    return f"{n:.0f}"


class Progress:
    """``with Progress(label, total, done_fn): ...`` draws until the block exits."""

    def __init__(self, label: str, total: int, done: Callable[[], int], stream=None):
        self.label = label
        self.total = max(int(total), 1)
        self.done = done  # returns the count so far; called from the drawing thread
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-progress", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> "Progress":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._draw(final=True)

    def _line(self) -> str:
        n = self.done()
        frac = min(n / self.total, 1.0)
        elapsed = time.monotonic() - self._t0
        rate = n / elapsed if elapsed > 0 else 0.0
        filled = int(frac * BAR_WIDTH)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        return (f"{self.label:<24} [{bar}] {frac * 100:5.1f}% {_fmt_count(n)}/{_fmt_count(self.total)}"
                f" {_fmt_count(rate)}/s {elapsed:5.1f}s")

    def _draw(self, final: bool = False) -> None:
        if self.tty:
            self.stream.write("\r" + self._line() + ("\n" if final else ""))
        else:
            self.stream.write(self._line() + "\n")
        self.stream.flush()

    def _run(self) -> None:
        period = TTY_PERIOD_S if self.tty else PLAIN_PERIOD_S
        while not self._stop.wait(period):
            self._draw()


class Sampler:
    """Records ``(seconds since start(), count)`` every ``period_s`` until ``stop()``.

    Concurrency: one thread samples and appends to ``points``; the caller reads ``points`` only
    after ``stop()`` has joined it. ``done`` must be safe to call from that thread (the loadgen
    counters are int64 shared values, each written by one child; a plain read is enough).
    """

    def __init__(self, done: Callable[[], int], period_s: float = SAMPLE_PERIOD_S):
        self.done = done
        self.period_s = period_s
        self.points: list[tuple[float, int]] = []  # (seconds since start, count so far), ascending
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._t0 = 0.0

    def start(self) -> "Sampler":
        self._t0 = time.monotonic()
        self.points.append((0.0, self.done()))
        self._thread.start()
        return self

    def stop(self) -> list[list[float]]:
        """Stops sampling (idempotent), takes a last sample; the series, at most SERIES_MAX_POINTS."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread.ident is not None:  # started
                self._thread.join()
                self._sample()
        return downsample([[round(t, 3), n] for t, n in self.points], SERIES_MAX_POINTS)

    def _sample(self) -> None:
        self.points.append((time.monotonic() - self._t0, self.done()))

    def _run(self) -> None:
        # Deadlines on the start's grid, not "period after the last sample": a slow wake-up on a
        # busy machine shifts one sample, never the ones after it; grid points it slept through
        # are skipped, not sampled in a burst (near-zero intervals would make rate spikes).
        next_s = self.period_s
        while not self._stop.wait(max(0.0, self._t0 + next_s - time.monotonic())):
            self._sample()
            late_s = (int(self.points[-1][0] / self.period_s) + 1) * self.period_s
            next_s = max(next_s + self.period_s, late_s)


def downsample(points: list, max_points: int) -> list:
    """At most ``max_points`` of ``points``: every k-th (one stride, so the kept points stay
    evenly spaced in time), the first and the last.

    The points are cumulative counts, so dropping some loses resolution, never messages: the
    rate between any two kept points is still exact.
    """
    n = len(points)
    if n <= max_points:
        return list(points)
    stride = -(-(n - 1) // (max_points - 2))  # ceil: (max_points - 1) strided points, then the last
    kept = points[::stride]
    return kept + [points[-1]] if (n - 1) % stride else kept
