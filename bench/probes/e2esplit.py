"""Where e2e latency goes: send -> append -> receive, through the asyncio client.

    python -m tailrace.bench.probes.e2esplit [--transport same-host|zmq] [--rate 5000] [--seconds 10]

The e2e-latency workload's shape (a fresh broker, 8 partitions, gen_aio's paced producer at
``--rate``, acks memory, one AsyncConsumer tailing every partition with ``poll_columns``), but
the consumer splits each record's latency in two with the append time the broker stamps into
every batch (CLOCK_REALTIME, taken back to CLOCK_MONOTONIC once at start, so the split is good
to a few microseconds):

- send -> append: the producer's send, the request's hop, the worker's append;
- append -> receive: the rest of the worker's turn, the wake-up of the reader, its read and
  decode into columns.

Prints p50/p90/p99 of each and of the total, the consumer's CPU per record
(user and system, ``os.times``), and the broker's and the load generators' CPU %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np

from tailrace.bench.loadgen import Job, run_jobs
from tailrace.bench.payload import value_stamps
from tailrace.bench.systems import TailraceSystem
from tailrace.client.aio import AsyncConsumer

PARTITIONS = 8


def consume(spec: dict, ctx) -> dict:
    return asyncio.run(_consume(spec, ctx))


async def _consume(spec: dict, ctx) -> dict:
    realtime_minus_mono_us = (time.time_ns() - time.monotonic_ns()) // 1000
    sent, appended, received = [], [], []
    got = 0
    async with AsyncConsumer(spec["endpoint"], max_wait_ms=500, same_host=spec["same_host"]) as cons:
        await cons.assign(spec["topic"], None, start="latest")
        ctx.ready()
        t0 = os.times()
        deadline = ctx.t_start + spec["max_seconds"]
        while got < spec["expected"] and time.monotonic() < deadline:
            for _t, _p, cols in await cons.poll_columns(200):
                now = time.monotonic_ns() // 1000
                sent.append(value_stamps(cols.values, cols.value_offsets) // 1000)
                appended.append(cols.timestamps_us - realtime_minus_mono_us)
                received.append(np.full(len(cols), now, dtype=np.int64))
                got += len(cols)
        t1 = os.times()
        user_s, sys_s = t1.user - t0.user, t1.system - t0.system
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return {"consumed": got, "user_s": user_s, "sys_s": sys_s, "sent": cat(sent), "appended": cat(appended), "received": cat(received)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tailrace.bench.probes.e2esplit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", choices=("same-host", "zmq"), default="same-host")
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    system = TailraceSystem(workers=args.workers, client="async")
    system.start("e2esplit")
    try:
        system.create_topic("split", PARTITIONS)
        system.warm("split", PARTITIONS)
        total = int(args.rate * args.seconds)
        common = {"endpoint": system.endpoint, "direct": True, "same_host": args.transport == "same-host",
                  "topic": "split", "partitions": PARTITIONS, "size": 100, "max_seconds": args.seconds * 3 + 10}
        jobs = [Job("tailrace.bench.probes.e2esplit:consume", {**common, "expected": total}),
                Job("tailrace.bench.gen_aio:e2e_produce", {**common, "rate": args.rate, "messages": total, "acks": "memory"})]
        run = run_jobs(jobs, label=f"e2esplit {args.transport}", total=total, timeout_s=args.seconds * 3 + 130,
                       broker_pids=system.pids())
    finally:
        system.stop()
    r = run.results[0]
    sent, appended, received = r["sent"], r["appended"], r["received"]
    print(f"{args.transport}, {args.rate} msg/s, {r['consumed']} records consumed")
    for name, x in (("send -> append", appended - sent), ("append -> receive", received - appended),
                    ("total", received - sent)):
        p50, p90, p99 = np.percentile(x, [50, 90, 99]) if len(x) else (0, 0, 0)
        print(f"  {name:18s} p50 {p50:7.0f}  p90 {p90:7.0f}  p99 {p99:7.0f} us")
    per = 1e6 / max(r["consumed"], 1)
    print(f"  consumer CPU per record: user {r['user_s'] * per:.0f} us, system {r['sys_s'] * per:.0f} us; "
          f"broker CPU % {({k: round(v['cpu_pct']) for k, v in run.broker_cpu.items()})}; "
          f"load generators {run.loadgen.get('cpu_pct', 0):.0f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
