"""Seek by time on a big journal: ``Consumer.offsets_for_times`` latency (docs/BENCHMARKS.md,
"Seek by time"; issue 18 asks for it on a 10 GiB journal).

    python -m tailrace.bench.probes.timeseek --gib 10

Fills one topic (``--partitions``, ``--size``-byte records in batches of ``--batch``, acks=memory,
straight to the workers) until the journal holds ``--gib`` GiB, then asks ``--queries`` times,
at random times between the first and the last append, for every partition at once (one
LIST_OFFSETS by timestamp: a binary search per partition over its dense index and the journal).
Reported: latency p50/p99/max with the journal in the page cache ("warm"), and again after
dropping the page cache ("cold", root only: ``/proc/sys/vm/drop_caches``); each answer is
checked against the records around it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.bench.launcher import Broker
from tailrace.broker.datadir import journal_usage


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _queries(o, b: Broker, lo_ms: int, hi_ms: int, rng: random.Random) -> tuple[list[float], int]:
    """Latencies (ms) of ``o.queries`` questions; checks that every answer is at or after its time
    and that answers never go back as the time goes forward."""
    lat, nones, answers = [], 0, []
    with Consumer(b.bootstrap) as c:
        c.list_offsets("big")  # the connection made before timing
        for _ in range(o.queries):
            t = rng.randint(lo_ms, hi_ms)
            t0 = time.perf_counter()
            got = c.offsets_for_times({("big", p): t for p in range(o.partitions)})
            lat.append((time.perf_counter() - t0) * 1000)
            if o.verbose and lat[-1] > 50:
                print(f"slow question: {lat[-1]:.1f} ms at t={t} ({hi_ms - t} ms before the last append): {got}", flush=True)
            nones += sum(v is None for v in got.values())
            assert all(v is None or v.timestamp_ms >= t for v in got.values()), (t, got)
            answers.append((t, [got[("big", p)].offset if got[("big", p)] else 1 << 62 for p in range(o.partitions)]))
    answers.sort()
    for (_t1, a1), (_t2, a2) in zip(answers, answers[1:]):
        assert all(x <= y for x, y in zip(a1, a2)), "an answer went back as the time went forward"
    return lat, nones


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.timeseek")
    ap.add_argument("--gib", type=float, default=10.0, help="journal size to fill, GiB")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--verbose", action="store_true", help="print questions slower than 50 ms")
    ap.add_argument("--dir", default=None, help="where the broker's data directory goes (default: a temporary one)")
    o = ap.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="tailrace-timeseek-", dir=o.dir) as d:
        b = Broker(Path(d) / "broker", workers=2, segment_bytes=1 << 30)
        with b:
            with Admin(b.bootstrap) as a:
                a.create_topic("big", o.partitions)
            batch = [os.urandom(o.size)] * o.batch
            target = int(o.gib * (1 << 30))
            t_first = int(time.time() * 1000)
            t0 = time.perf_counter()
            with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
                i = 0
                while True:
                    for _ in range(200):
                        p.send_batch("big", batch, partition=i % o.partitions)
                        i += 1
                    p.flush()
                    if i * o.batch * o.size >= target:
                        break
            t_last = int(time.time() * 1000)
            fill_s = time.perf_counter() - t0
            with Admin(b.bootstrap) as a:  # questions once the flusher has written and indexed it all
                deadline = time.monotonic() + 600
                while any(po.durable_watermark < po.high_watermark for po in a.list_offsets("big")):
                    assert time.monotonic() < deadline, "the flusher did not catch up"
                    time.sleep(0.5)
            settle_s = time.perf_counter() - t0 - fill_s
            journal = i * o.batch * o.size  # record values; the journal holds them with batch headers
            on_disk = journal_usage(b.data_dir)[1]
            records = i * o.batch
            print(f"filled {journal / (1 << 30):.2f} GiB of records ({on_disk / (1 << 30):.2f} GiB of journal files), {records:,} records in {i:,} batches "
                  f"over {o.partitions} partitions, in {fill_s:.0f} s (all durable {settle_s:.0f} s later)", flush=True)
            warm, nones = _queries(o, b, t_first, t_last, rng)
            cold = []
            if _drop_caches():
                for _ in range(min(o.queries, 20)):  # each after a drop: every read from the disk
                    _drop_caches()
                    lat, _ = _queries(argparse.Namespace(**{**vars(o), "queries": 1}), b, t_first, t_last, rng)
                    cold += lat
    per = lambda xs: f"p50 {statistics.median(xs):.2f} ms, p99 {_pct(xs, 0.99):.2f} ms, max {max(xs):.2f} ms"  # noqa: E731
    print(f"\n| case ({journal / (1 << 30):.1f} GiB journal, {records / 1e6:.1f}M records, {o.partitions} partitions per question) | latency |")
    print("|---|---|")
    print(f"| warm: {len(warm)} questions at random times | {per(warm)} |")
    if cold:
        print(f"| cold: {len(cold)} questions, each after dropping the page cache | {per(cold)} |")
    print(f"(partitions with no record that recent: {nones})")


if __name__ == "__main__":
    main()
