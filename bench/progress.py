"""A live progress line on stderr, fed by counters the load-generator processes bump.

On a terminal the line is redrawn in place (``\\r``) five times a second; otherwise (CI logs, a
pipe) one plain line is printed every few seconds so logs stay short. It never writes to
stdout: ``--json`` output stays machine-readable.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

BAR_WIDTH = 28
TTY_PERIOD_S = 0.2
PLAIN_PERIOD_S = 5.0


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
