"""``tailrace top``: a live view of a running broker, from its Prometheus endpoint.

Every ``--interval`` seconds it scrapes ``--metrics`` (the exporter ``tailrace serve`` starts,
ops/metrics.py), parses the text with prometheus_client's parser and redraws with rich: topics
and their busiest partitions with in/out rates, durable lag and ring fill; consumer groups with
their lag in records and in seconds (the most behind partition's); workers with load,
partitions and heartbeat age; the flusher's fsync p99 over the last interval. ``q`` or Ctrl-C
quits.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
import urllib.request
from collections import defaultdict


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, list[tuple[dict, float]]]:
    """name -> [(labels, value)] of every sample (histogram buckets under ``name_bucket``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        text = r.read().decode()
    out: dict[str, list] = defaultdict(list)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _by(samples, *keys) -> dict:
    return {tuple(lab.get(k, "") for k in keys): v for lab, v in samples}


def quantile_from_buckets(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile (upper bucket bound) of what was observed between two cumulative bucket
    lists [(le, count)], or None if nothing was."""
    prev = dict(before)
    deltas = [(le, c - prev.get(le, 0.0)) for le, c in sorted(after)]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    for le, c in deltas:
        if c >= q * total:
            return le
    return deltas[-1][0]


def _buckets(m: dict, name: str) -> list[tuple[float, float]]:
    return [(float(lab["le"]), v) for lab, v in m.get(name, [])]


class View:
    def __init__(self):
        self.prev: dict | None = None
        self.prev_t = 0.0

    def frame(self, m: dict, now: float):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        dt = now - self.prev_t if self.prev is not None else 0.0
        p = self.prev or {}

        def rate(name, *keys):
            cur, old = _by(m.get(name, []), *keys), _by(p.get(name, []), *keys)
            # a counter that went down was reset (the broker or the exporter restarted): count from 0
            return {k: (v - old.get(k, v) if v >= old.get(k, v) else v) / dt if dt > 0 else 0.0 for k, v in cur.items()}

        in_r = rate("tailrace_partition_records_appended_total", "topic", "partition")
        out_r = rate("tailrace_partition_records_fetched_total", "topic", "partition")
        inb_r = rate("tailrace_partition_bytes_appended_total", "topic", "partition")
        hw = _by(m.get("tailrace_partition_high_watermark", []), "topic", "partition")
        lag = _by(m.get("tailrace_partition_durable_lag_records", []), "topic", "partition")
        used = _by(m.get("tailrace_partition_ring_used_bytes", []), "topic", "partition")
        cap = _by(m.get("tailrace_partition_ring_bytes", []), "topic", "partition")
        owner = _by(m.get("tailrace_partition_owner_worker", []), "topic", "partition")
        p99 = quantile_from_buckets(_buckets(p, "tailrace_flusher_fsync_duration_seconds_bucket"),
                                    _buckets(m, "tailrace_flusher_fsync_duration_seconds_bucket"), 0.99)

        def one(name):
            v = m.get(name)
            return v[0][1] if v else 0.0

        head = Text(f"tailrace top   topics {one('tailrace_topics'):.0f}   partitions {one('tailrace_partitions'):.0f}   "
                    f"journal {one('tailrace_journal_bytes') / 2**20:.0f} MiB   shm {one('tailrace_shm_used_bytes') / 2**20:.0f}"
                    f"/{one('tailrace_shm_budget_bytes') / 2**20:.0f} MiB   fsync p99 "
                    f"{'-' if p99 is None else f'{p99 * 1000:.2f} ms'}   durable lag {one('tailrace_flusher_durable_lag_records'):.0f} records"
                    f"{'   STORAGE FULL: produce refused' if one('tailrace_storage_full') else ''}   (q quits)")
        topics = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0])
        for key, h in hw.items():
            t = topics[key[0]]
            t[0] += 1
            t[1] += in_r.get(key, 0.0)
            t[2] += out_r.get(key, 0.0)
            t[3] += inb_r.get(key, 0.0)
            t[4] += lag.get(key, 0.0)
            t[5] = max(t[5], used.get(key, 0.0) / cap[key] if cap.get(key) else 0.0)
        tt = Table("topic", "partitions", "in msg/s", "out msg/s", "in MB/s", "durable lag", "ring fill", title="topics",
                   title_justify="left")
        for name, (n, i, o, b, lg, fill) in sorted(topics.items()):
            tt.add_row(name, str(n), f"{i:,.0f}", f"{o:,.0f}", f"{b / 1e6:.2f}", f"{lg:,.0f}", f"{fill:.0%}")
        pt = Table("topic", "partition", "worker", "in msg/s", "out msg/s", "high watermark", "durable lag", "ring fill",
                   title="busiest partitions", title_justify="left")
        for key in sorted(hw, key=lambda k: -(in_r.get(k, 0.0) + out_r.get(k, 0.0)))[:10]:
            fill = used.get(key, 0.0) / cap[key] if cap.get(key) else 0.0
            pt.add_row(key[0], key[1], f"{owner.get(key, -1):.0f}", f"{in_r.get(key, 0.0):,.0f}", f"{out_r.get(key, 0.0):,.0f}",
                       f"{hw[key]:,.0f}", f"{lag.get(key, 0.0):,.0f}", f"{fill:.0%}")
        wt = Table("worker", "up", "partitions", "load", "heartbeat age", title="workers", title_justify="left")
        up = _by(m.get("tailrace_worker_up", []), "worker")
        parts = _by(m.get("tailrace_worker_partitions", []), "worker")
        load = _by(m.get("tailrace_worker_load", []), "worker")
        age = _by(m.get("tailrace_worker_heartbeat_age_seconds", []), "worker")
        for key in sorted(up, key=lambda k: int(k[0])):
            wt.add_row(key[0], "yes" if up[key] else "no", f"{parts.get(key, 0):.0f}", f"{load.get(key, 0):.2f}",
                       f"{age.get(key, 0):.1f} s")
        self.prev, self.prev_t = m, now
        return Group(head, tt, pt, group_table(m), wt)


def group_table(m: dict):
    """Consumer groups per topic: partitions, lag in records (summed), lag in seconds (the
    partition furthest behind), from ``tailrace_group_lag_records`` and ``_seconds``."""
    from rich.table import Table

    lag = _by(m.get("tailrace_group_lag_records", []), "group", "topic", "partition")
    secs = _by(m.get("tailrace_group_lag_seconds", []), "group", "topic", "partition")
    rows: dict[tuple[str, str], list] = {}  # (group, topic) -> [partitions, records behind, seconds behind]
    for (g, t, p), n in lag.items():
        r = rows.setdefault((g, t), [0, 0.0, 0.0])
        r[0] += 1
        r[1] += n
        r[2] = max(r[2], secs.get((g, t, p), 0.0))
    gt = Table("group", "topic", "partitions", "lag (records)", "lag (seconds)", title="consumer groups", title_justify="left")
    for (g, t), (n, behind, s) in sorted(rows.items()):
        gt.add_row(g, t, str(n), f"{behind:,.0f}", f"{s:,.1f}")
    return gt


def run(url: str, interval_s: float, iterations: int | None = None) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    view = View()
    console = Console()
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)
        with Live(Text("scraping ..."), console=console, auto_refresh=False, screen=False) as live:
            n = 0
            while iterations is None or n < iterations:
                n += 1
                try:
                    live.update(view.frame(scrape(url), time.monotonic()), refresh=True)
                except OSError as exc:
                    live.update(Text(f"no metrics at {url}: {exc} (is `tailrace serve` running with --metrics-bind?)"),
                                refresh=True)
                if fd is not None:
                    ready, _, _ = select.select([fd], [], [], interval_s)
                    if ready and os.read(fd, 16).lower().startswith(b"q"):
                        return 0
                else:
                    time.sleep(interval_s)
    except KeyboardInterrupt as exc:  # Ctrl-C: 130; SIGTERM, SIGHUP (console.Stopped): 128 + the signal
        return 128 + getattr(exc, "signum", 2)
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    return 0
