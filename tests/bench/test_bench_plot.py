"""``--plot``: the bench draws a real PNG of the figure's size, and its rows carry what it drew.

The first test runs ``tailrace bench`` through the CLI in a subprocess with tiny sizes, as the
smoke tests do; the others draw rows built here (the drawing is a pure function of the rows) and
run the CLI without matplotlib.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

from tailrace.bench import plot, report
from tailrace.bench.progress import SAMPLE_PERIOD_S, SERIES_MAX_POINTS, downsample
from tailrace.bench.workloads import CDF_QUANTILES, CDF_TAIL, latency_cdf
from tests.bench.test_bench_smoke import ROOT, by_case, run_bench

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a PNG must have first, right after the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"not a PNG: {head[:8]!r}"
    length, kind = struct.unpack(">I4s", head[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", head[16:24])


def assert_series_counts_up_to(series: list, last: int) -> None:
    assert 2 <= len(series) <= SERIES_MAX_POINTS
    t, n = np.asarray(series, dtype=np.float64).T
    assert t[0] == 0.0 and np.all(np.diff(t) > 0), series
    assert np.all(np.diff(n) >= 0) and n[-1] == last, series


def test_bench_plot_draws_a_png_of_the_figure_size_and_rows_carry_series_and_cdf(tmp_path):
    out = tmp_path / "bench.png"
    doc = run_bench("produce", "e2e-latency", "--messages", "20000", "--batch", "1000", "--partitions", "2",
                    "--ring-bytes", str(4 << 20), "--rate", "500", "--duration", "1", "--transports", "zmq",
                    "--plot", str(out))
    assert png_size(out) == plot.figure_size_px(2)  # both panels: throughput and latency
    import matplotlib.image

    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[:2] == plot.figure_size_px(2)[::-1] and pixels.std() > 0.05  # drawn on, not blank

    rows = by_case(doc)
    produced, e2e = rows["produce/memory"], rows["e2e/500"]
    assert_series_counts_up_to(produced["series"], produced["counts"]["acked"])
    assert "latency_cdf" not in produced
    assert_series_counts_up_to(e2e["series"], e2e["counts"]["sent"])  # the producer bumps the counter
    steps = np.diff(np.asarray(e2e["series"])[:-1, 0])  # the last sample is taken at the end, off the grid
    assert len(e2e["series"]) >= 10 and SAMPLE_PERIOD_S / 2 <= np.median(steps) <= 10 * SAMPLE_PERIOD_S  # a loaded 2-core box wakes late

    cdf = np.asarray(e2e["latency_cdf"])
    assert 10 <= len(cdf) <= CDF_QUANTILES + len(CDF_TAIL) + 1
    assert np.all(np.diff(cdf[:, 0]) >= 0) and np.all(np.diff(cdf[:, 1]) > 0)
    assert cdf[-1, 1] == 1.0 and cdf[-1, 0] == e2e["latency"]["max_us"]
    assert 0 < cdf[0, 1] <= 0.5 and cdf[0, 0] <= e2e["latency"]["p50_us"]
    raw = {r["case"]: r for r in doc["raw"]}
    assert raw["e2e/500"]["latency_cdf"] == e2e["latency_cdf"]


def test_latency_cdf_gives_the_fraction_at_or_below_each_point_with_ties():
    lat_ns = np.array([3000, 1000, 1000, 1000, 9000])
    assert latency_cdf(lat_ns) == [[1.0, 0.6], [3.0, 0.8], [9.0, 1.0]]
    many = latency_cdf(np.random.default_rng(1).lognormal(12, 1, 100_000))
    assert len(many) == CDF_QUANTILES + len(CDF_TAIL) + 1
    fractions = [f for _, f in many]
    assert fractions[0] == 1e-05 and {0.5, 0.99, 0.999, 0.9999, 1.0} <= set(fractions)


def test_downsample_keeps_first_and_last_and_one_stride():
    for n in (1, 2, SERIES_MAX_POINTS, SERIES_MAX_POINTS + 1, 6001):
        kept = downsample(list(range(n)), SERIES_MAX_POINTS)
        assert len(kept) <= SERIES_MAX_POINTS and kept[0] == 0 and kept[-1] == n - 1
        assert len({b - a for a, b in zip(kept, kept[1:-1])}) <= 1, kept


def fake_run(case: str, rate: float, seconds: float = 2.0, lat_us: float | None = None) -> dict:
    t = np.arange(0.0, seconds + 1e-9, SAMPLE_PERIOD_S)
    row = {"case": case, "system": "tailrace", "msgs_per_s": rate, "latency": None,
           "series": [[round(x, 3), int(x * rate)] for x in t]}
    if lat_us is not None:
        lat_ns = np.random.default_rng(int(rate)).lognormal(np.log(lat_us * 1000), 0.5, 5000)
        row["latency"] = {"count": 5000, "p50_us": lat_us, "p99_us": lat_us, "p999_us": lat_us, "max_us": lat_us}
        row["latency_cdf"] = latency_cdf(lat_ns)
    return row


@pytest.mark.parametrize("with_latency", [False, True])
def test_plot_of_repeated_runs_has_one_panel_per_kind_present(tmp_path, with_latency):
    lat = 500.0 if with_latency else None
    raw = [fake_run("produce/memory", r) for r in (1e6, 2e6, 3e6)] + \
          [fake_run("e2e/5000", r, lat_us=lat) for r in (4990, 5000, 5010)]
    rows = report.aggregate(raw, judge=False)
    panels = 2 if with_latency else 1
    assert plot.kinds(rows) == ([plot.THROUGHPUT, plot.LATENCY] if with_latency else [plot.THROUGHPUT])
    out = tmp_path / "p.png"
    machine = {"nproc": 2, "cpu_model": "test", "mem_gib": 1.0, "kernel": "k", "python": "3", "pyzmq": "z", "libzmq": "z"}
    assert plot.write_plot(str(out), rows, raw, machine, "repeat") == plot.figure_size_px(panels)
    assert png_size(out) == plot.figure_size_px(panels)


def test_plot_rate_is_the_slope_of_the_counts():
    t, y = plot.rate([[0.0, 0], [0.5, 500], [1.0, 1000], [1.5, 1500], [2.0, 2000]])
    assert len(t) > 0 and np.allclose(y, 1000.0)


def test_bench_without_matplotlib_runs_and_plot_is_refused_before_any_run(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None  # any import of it fails\n"
            "from tailrace.bench import runner, workloads, loadgen, report\n"
            "assert runner.load_plotter(None, 'x') is None\n"
            "sys.exit(runner.main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "produce", "--plot", str(tmp_path / "b.png")], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "tailrace[plot]" in proc.stderr, proc.stderr
    assert "-- tailrace: produce" not in proc.stderr  # refused before the broker started
    assert not (tmp_path / "b.png").exists()
    missing = subprocess.run([sys.executable, "-m", "tailrace", "bench", "produce", "--plot",
                              str(tmp_path / "no" / "b.png")], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no folder" in missing.stderr, missing.stderr
