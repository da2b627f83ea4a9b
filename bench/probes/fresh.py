"""A thousand partitions at default settings: creating the topic, the first write to every
fresh partition, and the same again once they have been written to (docs/BENCHMARKS.md, "A
thousand partitions"; issue 18's targets: the topic made within 2 s, the first pass within 2x of
the steady one).

    python -m tailrace.bench.probes.fresh --partitions 1000 --messages 100000

One broker with the default settings but for its data directory (2 workers): ``topic create``
of ``--partitions`` partitions, timed; then ``--messages`` records of ``--size`` bytes spread
evenly over the partitions, each partition's share sent as one batch (acks=memory, flushed),
timed: the first pass, then the second pass (every ring, actor and index file made by then).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tailrace import Admin, Producer
from tailrace.bench.launcher import Broker


def _pass(b: Broker, o) -> float:
    per = o.messages // o.partitions
    batch = [os.urandom(o.size)] * per
    t0 = time.perf_counter()
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        for part in range(o.partitions):
            p.send_batch("big", batch, partition=part)
        p.flush(300_000)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.fresh")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    o = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tailrace-fresh-") as d:
        b = Broker(Path(d) / "broker", workers=2)
        with b:
            with Admin(b.bootstrap, timeout_ms=120_000) as a:
                t0 = time.perf_counter()
                a.create_topic("big", o.partitions)
                create_s = time.perf_counter() - t0
            first = _pass(b, o)
            second = _pass(b, o)
            third = _pass(b, o)
            budget = b.settings.shm_budget_bytes
    steady = min(second, third)
    print(f"| case ({o.partitions} partitions, {o.messages:,} records of {o.size} B, default settings: "
          f"{budget / 2**30:.1f} GiB shm budget) | seconds |\n|---|---:|")
    print(f"| topic create | {create_s:.2f} |")
    print(f"| first pass (every partition fresh) | {first:.2f} |")
    print(f"| steady pass (best of the next two) | {steady:.2f} |")
    print(f"| first / steady | {first / steady:.2f}x |")


if __name__ == "__main__":
    main()
