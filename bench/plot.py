"""``--plot FILE.png``: one picture of a bench run, throughput over time and latency CDFs.

Imported only when ``--plot`` is given (runner.py, compare.py): matplotlib is an optional extra
(``pip install 'tailrace[plot]'``) and the suite runs without it. Drawing uses the Agg canvas
directly, never pyplot: no display, no backend choice, no global figure state.

One PNG, one panel per kind of data the rows carry, side by side when both are there:

- **throughput**: every row with a ``series`` (``[[seconds, messages so far], ...]``, sampled
  every 20 ms by progress.Sampler): the rate over a sliding window of SMOOTH_STEPS samples or
  SMOOTH_FRACTION of the phase, whichever is longer (difference of counts over difference of
  times, so the smoothing has no edge effect), drawn at the window's middle, against seconds
  since the measured phase started;
- **latency**: every row with a ``latency_cdf`` (``[[us, fraction <= us], ...]``,
  workloads.latency_cdf): the CDF, log x axis.

Each case has one colour in both panels (and one line style per system, for compare.py). With
``--repeat``, the run that stands for the case (report.aggregate: the median) is drawn solid and
the other runs faintly. The machine line (procstat.machine_info) is the caption.

The size in pixels is fixed: PANEL_WIDTH_IN per panel by HEIGHT_IN, at DPI (``figure_size_px``),
so the docs' images keep their shape from one run to the next.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter

DPI = 100
PANEL_WIDTH_IN = 6.4
HEIGHT_IN = 4.8
SMOOTH_STEPS = 3  # the rate's window: at least this many sample intervals (counters move by batches)
SMOOTH_FRACTION = 1 / 60  # and at least this share of the phase: about 60 independent windows
FAINT_ALPHA = 0.3
LOG_RATE_SPREAD = 50  # cases whose peak rates differ more than this share a log y axis
STYLES = ("-", "--", ":", "-.")  # per system, in order of appearance

THROUGHPUT, LATENCY = "throughput", "latency"


def figure_size_px(panels: int) -> tuple[int, int]:
    """(width, height) in pixels of a picture with ``panels`` panels."""
    return round(PANEL_WIDTH_IN * panels * DPI), round(HEIGHT_IN * DPI)


def kinds(rows: list[dict]) -> list[str]:
    """The panels the rows call for, in drawing order."""
    out = []
    if any(len(r.get("series") or []) >= 2 for r in rows):
        out.append(THROUGHPUT)
    if any(r.get("latency_cdf") for r in rows):
        out.append(LATENCY)
    return out


def rate(series: list) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, messages/s) from cumulative ``[[seconds, count], ...]`` over sliding windows
    (SMOOTH_STEPS, SMOOTH_FRACTION), each drawn at its middle."""
    pts = np.asarray(series, dtype=np.float64).reshape(-1, 2)
    t, n = pts[:, 0], pts[:, 1]
    if len(t) < 2:
        return np.empty(0), np.empty(0)
    step_s = float(np.median(np.diff(t)))
    window_s = max(SMOOTH_STEPS * step_s, SMOOTH_FRACTION * (t[-1] - t[0]))
    w = int(min(max(1, round(window_s / step_s)) if step_s > 0 else 1, len(t) - 1))
    dt = t[w:] - t[:-w]
    ok = dt > 0
    return ((t[w:] + t[:-w]) / 2)[ok], ((n[w:] - n[:-w]) / np.where(ok, dt, 1.0))[ok]


def machine_line(machine: dict) -> str:
    return (f"{machine.get('nproc')} cores {machine.get('cpu_model') or '?'}, {machine.get('mem_gib')} GiB,"
            f" Linux {machine.get('kernel')}, Python {machine.get('python')},"
            f" pyzmq {machine.get('pyzmq')} / libzmq {machine.get('libzmq')}")


def write_plot(path: str, rows: list[dict], raw: list[dict], machine: dict, title: str) -> tuple[int, int]:
    """Draws ``rows`` (aggregated, one per case) and ``raw`` (every run) into the PNG ``path``;
    returns its (width, height) in pixels. With nothing to draw, one panel says so."""
    panels = kinds(rows) or [THROUGHPUT]
    fig = Figure(figsize=(PANEL_WIDTH_IN * len(panels), HEIGHT_IN), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = dict(zip(panels, fig.subplots(1, len(panels), squeeze=False)[0]))
    keys = list(dict.fromkeys((r["system"], r["case"]) for r in rows))
    colours = {k: f"C{i % 10}" for i, k in enumerate(keys)}
    systems = list(dict.fromkeys(s for s, _ in keys))
    styles = {s: STYLES[i % len(STYLES)] for i, s in enumerate(systems)}
    label = (lambda s, c: c) if len(systems) == 1 else (lambda s, c: f"{s} {c}")
    runs: dict[tuple[str, str], list[dict]] = {}  # (system, case) -> every run's row
    peaks: list[float] = []  # each case's highest rate, to choose the throughput axis scale
    for r in raw:
        runs.setdefault((r["system"], r["case"]), []).append(r)

    for r in rows:
        key = (r["system"], r["case"])
        style = {"color": colours[key], "linestyle": styles[r["system"]]}
        others = [o for o in runs.get(key, []) if o.get("series") != r.get("series")]  # r is one of them
        if THROUGHPUT in axes and len(r.get("series") or []) >= 2:
            ax = axes[THROUGHPUT]
            for o in others:
                _line(ax, *rate(o.get("series") or []), alpha=FAINT_ALPHA, **style)
            t, y = rate(r["series"])
            _line(ax, t, y, label=label(*key), **style)
            peaks += [float(y.max())] if len(y) and y.max() > 0 else []
        if LATENCY in axes and r.get("latency_cdf"):
            ax = axes[LATENCY]
            for o in others:
                if o.get("latency_cdf"):
                    _cdf(ax, o["latency_cdf"], alpha=FAINT_ALPHA, **style)
            _cdf(ax, r["latency_cdf"], label=label(*key), **style)

    _dress(axes, len(raw) > len(rows), peaks)
    fig.suptitle(title)
    fig.text(0.005, 0.008, machine_line(machine), fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, format="png", dpi=DPI)
    return figure_size_px(len(panels))


def _line(ax, t, y, **kw) -> None:
    if len(t) == 0:
        return
    ax.plot(t, y, marker="o" if len(t) < 3 else None, markersize=3, **kw)


def _cdf(ax, points: list, **kw) -> None:
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    ax.step(np.maximum(pts[:, 0], 0.1), pts[:, 1], where="post", **kw)  # log axis: no zero


def _dress(axes: dict, repeated: bool, peaks: list[float]) -> None:
    faint = " (other runs faint)" if repeated else ""
    log_rate = len(peaks) > 1 and max(peaks) > LOG_RATE_SPREAD * min(peaks)
    if THROUGHPUT in axes:
        ax = axes[THROUGHPUT]
        ax.set_title("throughput over time" + faint)
        ax.set_xlabel("seconds")
        ax.set_ylabel("messages/s")
        ax.set_xlim(left=0)
        if log_rate:
            ax.set_yscale("log")
            ax.set_ylabel("messages/s (log)")
        elif peaks:  # room above the lines for the legend: two columns, 5% of the height a row
            legend_rows = -(-len(peaks) // (2 if len(peaks) > 4 else 1))
            ax.set_ylim(0, max(peaks) / (0.94 - 0.055 * legend_rows))
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    if LATENCY in axes:
        ax = axes[LATENCY]
        ax.set_title("latency CDF" + faint)
        ax.set_xscale("log")
        ax.set_xlabel("latency (us)")
        ax.set_ylabel("fraction <= x")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.set_ylim(0, 1.0)
    for ax in axes.values():
        ax.grid(True, which="major", alpha=0.3)
        handles = ax.get_legend_handles_labels()[0]
        if handles:
            ax.legend(fontsize=7, ncol=2 if len(handles) > 4 and ax is axes.get(THROUGHPUT) else 1,
                      loc="lower right" if ax is axes.get(LATENCY) else "upper left", framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "nothing measured", ha="center", va="center", transform=ax.transAxes, color="0.5")
