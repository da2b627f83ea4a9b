"""Where a read of many partitions spends its time: CPU and page faults on each side.

    python -m tailrace.bench.probes.wide_consume --partitions 1000 --messages 8000000 [--rounds 9]
        [--keep-large-blocks] [--group-bytes N]

Starts a broker (bench/launcher.py, 2 workers, 4 GiB budget, 512 KiB batches), makes one topic
(1 MiB rings above 8 partitions, 128 MiB at 8 or fewer), fills it with ``--messages`` records of
100 B (batches of 1,000, acks=durable, round robin), then reads the first half of its partitions
from the start once, and then ``--rounds`` times more, in this process, each a fresh ``Consumer``
(direct, 4 MiB max_bytes), turning each reply into columns as the bench's consumer does. It
prints the first read's wall time (the bench's consume-hot times a first read) and the medians
of the others: wall time, this process's CPU, the workers' CPU and both sides' minor page
faults (bench/procstat.py; this process's faults from getrusage), and records/s.
``--keep-large-blocks`` calls client/alloc.py ``keep_large_blocks`` in this process first (the
broker's programs always do); ``--group-bytes`` sets client/fetches.py GROUP_BYTES_IN_FLIGHT.
(docs/BENCHMARKS.md, "Large blocks".)
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tailrace.bench.launcher import Broker
from tailrace.bench.payload import batch_buffers
from tailrace.bench.procstat import cpu_seconds, minor_faults, self_cpu_seconds
from tailrace.client import Admin, Consumer, Producer
from tailrace.client import fetches
from tailrace.client.records import batches_to_columns, iter_batches


def worker_stats(broker: Broker) -> tuple[float, int]:
    """The workers' CPU seconds and minor faults so far."""
    pids = [pid for name, pid in broker.pids().items() if name.startswith("worker")]
    return sum(cpu_seconds(p) or 0.0 for p in pids), sum(minor_faults(p) or 0 for p in pids)


def read_all(bootstrap: str, parts: list[int], expected: int) -> None:
    c = Consumer(bootstrap, max_bytes=4 << 20, max_wait_ms=200, direct=True)
    c.assign("t", parts, start="earliest")
    got = 0
    while got < expected:
        for _a, start, _info, body in c.poll_raw(500):
            got += len(batches_to_columns(iter_batches(body.buffer if hasattr(body, "buffer") else body), start))
    c.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.wide_consume", description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=8_000_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--keep-large-blocks", action="store_true")
    ap.add_argument("--group-bytes", type=int, default=0)
    o = ap.parse_args(argv)
    if o.keep_large_blocks:
        from tailrace.client.alloc import keep_large_blocks  # imported here: the probe also runs on older trees

        keep_large_blocks()
    if o.group_bytes:
        fetches.GROUP_BYTES_IN_FLIGHT = o.group_bytes
    root = Path(tempfile.mkdtemp(prefix="tailrace-wide-"))
    broker = Broker(root / "data", workers=2, shm_budget_bytes=4 << 30, max_batch_bytes=512 * 1024).start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topic("t", o.partitions, ring_bytes=(1 << 20) if o.partitions > 8 else (128 << 20))
        prod = Producer(broker.bootstrap, acks="durable")
        values, offsets = batch_buffers(100, 1000, seed=0)
        for i in range(o.messages // 1000):
            while prod.in_flight >= 64:
                prod.poll(5)
            prod.send_buffers("t", values, offsets, partition=i % o.partitions)
        prod.flush(120_000)
        prod.close()
        parts = list(range(o.partitions // 2))
        expected = o.messages // 1000 // o.partitions * 1000 * len(parts)
        t0 = time.perf_counter()
        read_all(broker.bootstrap, parts, expected)  # the first: the first touch of every ring's pages in a reply
        first = time.perf_counter() - t0
        rows = []
        for _ in range(o.rounds):
            w_cpu, w_faults = worker_stats(broker)
            c_faults, c_cpu, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, self_cpu_seconds(), time.perf_counter()
            read_all(broker.bootstrap, parts, expected)
            wall = time.perf_counter() - t0
            w_cpu2, w_faults2 = worker_stats(broker)
            rows.append((wall, self_cpu_seconds() - c_cpu, w_cpu2 - w_cpu, w_faults2 - w_faults,
                         resource.getrusage(resource.RUSAGE_SELF).ru_minflt - c_faults))
        med = [statistics.median(r[i] for r in rows) for i in range(5)]
        print(f"partitions {o.partitions} (reading {len(parts)}), {expected:,} records a round; first round {first:.3f} s; "
              f"then {o.rounds} rounds, medians: "
              f"wall {med[0]:.3f} s, reader CPU {med[1]:.3f} s, workers' CPU {med[2]:.3f} s, "
              f"workers' faults {med[3]:,.0f}, reader's faults {med[4]:,.0f}, {expected / med[0] / 1e6:.2f}M records/s")
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
