"""How long one scrape of the metrics endpoint takes on a broker with many partitions.

    python -m tailrace.bench.probes.scrape --partitions 1000 --scrapes 30

Starts a broker (bench/launcher.py, 2 workers) with one topic of ``--partitions`` partitions
(64 KiB rings), produces one batch to every partition and fetches it back (so every per-partition
series exists, fetch counters included), waits for the processes' counters, then times
``--scrapes`` scrapes end to end (HTTP GET of /metrics, body read) and prints the median, p90 and
max with the series count. Stops the broker by itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.bench.launcher import Broker


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tailrace-scrape-") as tmp:
        b = Broker(Path(tmp) / "data", workers=2, max_batch_bytes=16 * 1024, shm_budget_bytes=1 << 30,
                   segment_bytes=16 << 20)
        b.start()
        try:
            with Admin(b.bootstrap, timeout_ms=60_000) as admin:
                admin.create_topic("many", a.partitions, ring_bytes=64 * 1024)
            with Producer(b.bootstrap, acks="memory") as prod:
                for p in range(a.partitions):
                    prod.send_batch("many", [b"m" * 20] * 10, partition=p)
                prod.flush()
            with Consumer(b.bootstrap, max_wait_ms=50) as c:
                c.assign("many", start="earliest")
                got, until = 0, time.monotonic() + 60
                while got < 10 * a.partitions and time.monotonic() < until:
                    got += sum(len(cols) for _t, _p, cols in c.poll_columns(200))
            time.sleep(2.5)  # every process writes its counters once a second
            times, size = [], 0
            for _ in range(a.scrapes):
                t0 = time.perf_counter()
                with urllib.request.urlopen(b.metrics_url, timeout=30) as r:
                    body = r.read()
                times.append(time.perf_counter() - t0)
                size = len(body)
                time.sleep(0.1)
            series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        finally:
            b.stop()
            b.cleanup_shm()
    times.sort()
    out = {"partitions": a.partitions, "scrapes": a.scrapes, "series": series, "bytes": size,
           "p50_ms": round(1000 * statistics.median(times), 1), "p90_ms": round(1000 * times[int(0.9 * (len(times) - 1))], 1),
           "max_ms": round(1000 * times[-1], 1)}
    print(json.dumps(out) if a.json else
          f"{a.partitions} partitions: {series} series, {size} bytes; scrape p50 {out['p50_ms']} ms, "
          f"p90 {out['p90_ms']} ms, max {out['max_ms']} ms over {a.scrapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
