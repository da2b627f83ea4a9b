"""Delayed delivery at scale (docs/BENCHMARKS.md "Delayed delivery"), one run:

    python -m tailrace.bench.delay_bench [--records 2000000] [--after-s 60] [--spread-s 60] [--data-root DIR]

One broker (2 workers, settings default), a topic of 8 partitions. A blocking producer sends
``--records`` records of 100 B, each with ``deliver_at_ms`` spread evenly over ``[t0 + after,
t0 + after + spread)`` (its value starts with that time, 13 ASCII digits), and flushes: the rate
at which the timer takes them, and the router's resident memory before and after (the index is
numpy arrays: the question is what millions pending cost). Then the broker is stopped and started
again (a clean stop: every process ends) and the time until the timer answers is taken (it reads
its topic back). Then a consumer reads the topic as columns until every record came or the
last one is 30 s overdue: how late each record came (arrival minus its time; a poll's records
share the poll's arrival), how many came early (must be 0), and duplicates. Prints JSON and a
markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tailrace.client import Admin, Consumer, Producer
from tailrace.client.errors import NotReadyError

from .launcher import Broker

VALUE_BYTES = 100
PARTITIONS = 8


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def produce(b: Broker, n: int, first_ms: int, spread_ms: int) -> float:
    pad = b"x" * (VALUE_BYTES - 13)
    dues = first_ms + (np.arange(n, dtype=np.int64) * spread_ms) // n
    t0 = time.perf_counter()
    with Producer(b.bootstrap, acks="durable") as p:
        for i, due in enumerate(dues.tolist()):  # one send per record: Producer.send is the API measured
            p.send("delayed", b"%013d" % due + pad, partition=i % PARTITIONS, deliver_at_ms=due)
        p.flush()
    return time.perf_counter() - t0


def timer_ready_s(b: Broker) -> float:
    """From a start until a delayed produce is taken (the timer has read its topic back)."""
    t0 = time.perf_counter()
    with Producer(b.bootstrap) as p:
        while True:
            try:
                p.send("probe", b"p", partition=0, deliver_after_ms=0)
                p.flush_delayed()
                return time.perf_counter() - t0
            except NotReadyError:
                time.sleep(0.05)


def drain(b: Broker, n: int, last_due_ms: int) -> dict:
    late_ms = []
    seen = np.zeros(0, np.int64)
    count = 0
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("delayed")
        while count < n and time.time() * 1000 < last_due_ms + 30_000:
            for _t, p, cols in c.poll_columns(200):
                arrived = int(time.time() * 1000)
                if not len(cols):
                    continue
                v = cols.values.reshape(-1, VALUE_BYTES)[:, :13]
                due = ((v - ord("0")).astype(np.int64) * (10 ** np.arange(12, -1, -1, dtype=np.int64))).sum(axis=1)
                late_ms.append(arrived - due)
                seen = np.concatenate([seen, cols.offsets + (p << 40)])
                count += len(cols)
    late = np.concatenate(late_ms) if late_ms else np.zeros(0, np.int64)
    return {"delivered": int(count), "distinct": int(len(np.unique(seen))), "early": int((late < 0).sum()),
            "late_p50_ms": float(np.percentile(late, 50)) if len(late) else None,
            "late_p99_ms": float(np.percentile(late, 99)) if len(late) else None,
            "late_max_ms": int(late.max()) if len(late) else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--after-s", type=float, default=60.0, help="the first record is due this long after the start of sending")
    ap.add_argument("--spread-s", type=float, default=60.0, help="records are due evenly over this long")
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tailrace-delay-", dir=args.data_root))
    b = Broker(root / "broker", workers=2)
    out: dict = {"records": args.records}
    try:
        b.start()
        with Admin(b.bootstrap) as a:
            a.create_topic("delayed", PARTITIONS)
            a.create_topic("probe", 1)
        router = b.pids()["router"]
        out["router_rss_mib_before"] = round(rss_mib(router), 1)
        first = int(time.time() * 1000 + args.after_s * 1000)
        spread = int(args.spread_s * 1000)
        secs = produce(b, args.records, first, spread)
        out["produce_s"] = round(secs, 2)
        out["produce_records_per_s"] = round(args.records / secs)
        out["router_rss_mib_after"] = round(rss_mib(router), 1)
        stopped = time.perf_counter()
        b.stop()
        b.start()
        out["restart_s"] = round(time.perf_counter() - stopped, 2)
        out["timer_ready_after_start_s"] = round(timer_ready_s(b), 2)
        out["router_rss_mib_after_restart"] = round(rss_mib(b.pids()["router"]), 1)
        if time.time() * 1000 > first:
            out["warning"] = "the first records were due before the restart ended: raise --after-s"
        out.update(drain(b, args.records, first + spread))
        time.sleep(2)  # the last done records and the floor written (a heartbeat or two)
        b.stop()
        b.start()  # again, everything delivered: a start reads from the floor, not the whole topic
        out["timer_ready_after_drained_restart_s"] = round(timer_ready_s(b), 2)
        out["drained_restart_read_back"] = (b.data_dir / "logs" / "router.log").read_text().rsplit("timer ready: ", 1)[-1].splitlines()[0]
    finally:
        b.stop()
        b.cleanup_shm()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))
    print("| records | produce rec/s | router RSS MiB before / after / after restart | timer ready after start | "
          "delivered / distinct | early | late p50 / p99 / max ms |")
    print(f"| {out['records']:,} | {out['produce_records_per_s']:,} | {out['router_rss_mib_before']} / "
          f"{out['router_rss_mib_after']} / {out['router_rss_mib_after_restart']} | {out['timer_ready_after_start_s']} s | "
          f"{out['delivered']:,} / {out['distinct']:,} | {out['early']} | {out['late_p50_ms']} / {out['late_p99_ms']} / "
          f"{out['late_max_ms']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
