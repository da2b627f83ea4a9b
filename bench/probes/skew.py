"""Skewed load: one hot partition and 63 cool ones on 2 workers, rebalancing off vs on.

    python -m tailrace.bench.probes.skew [--warmup 15] [--seconds 20] [--rate 1000] [--repeats 1] [--json FILE]

For each setting (``rebalance=0``, then ``rebalance=1``) a fresh broker with 2 workers gets a
64-partition topic (placement puts partition 0, the hot one, and the 31 even cool partitions on
worker 0). A hot generator process produces batches of 100 B records to partition 0 as fast as
it can, several batches in flight; a probe process sends one 100 B message at a time
(acks=memory, waited for) at ``--rate`` per second, round robin over partitions 1..63, and
records each latency. The first ``--warmup`` seconds are left out of the figures (that is where
the rebalancer moves the cool partitions off the hot worker, one every
``rebalance_interval_ms``); the P50/P99 of the cool partitions over the next ``--seconds``
seconds are reported, with the hot partition's throughput and the moves made.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from tailrace.bench.loadgen import Job, run_jobs
from tailrace.bench.systems import TailraceSystem
from tailrace.bench.workloads import latency_summary

PARTITIONS = 64


def one_run(rebalance: int, o) -> dict:
    system = TailraceSystem(workers=2, settings={"rebalance": rebalance, "rebalance_interval_ms": o.interval_ms})
    system.start("skew")
    try:
        topic = "skew"
        system.create_topic(topic, PARTITIONS, 4 << 20)
        system.warm(topic, PARTITIONS)
        total_s = o.warmup + o.seconds
        hot = Job("tailrace.bench.gen_tailrace:produce", {
            "endpoint": system.endpoint, "direct": True, "topic": topic, "partitions": [0], "messages": 10**10,
            "size": 100, "batch": o.hot_batch, "acks": "memory", "in_flight": o.hot_in_flight, "max_outstanding": 64,
            "max_seconds": total_s})
        probe = Job("tailrace.bench.gen_tailrace:paced", {
            "endpoint": system.endpoint, "direct": True, "topic": topic, "partitions": list(range(1, PARTITIONS)),
            "rate": o.rate, "size": 100, "acks": "memory", "seconds": total_s})
        run = run_jobs([hot, probe], label=f"skew rebalance={rebalance}", total=int(o.rate * total_s),
                       timeout_s=total_s + 180, broker_pids=system.pids())
        with_admin = Admin(system.endpoint)
        status = with_admin.status()
        owners = [p.worker for p in with_admin.describe_topic(topic).partitions]
        with_admin.close()
        h, p = run.results
        keep = p["at_s"] >= o.warmup
        lat = latency_summary(p["latency_ns"][keep])
        # where each cool partition was at the end: with the hot one (worker of partition 0) or not
        with_hot = np.array([owners[int(x)] == owners[0] for x in p["partition"]], dtype=bool)
        return {
            "rebalance": rebalance,
            "cool_latency": lat,
            "cool_latency_with_hot": latency_summary(p["latency_ns"][keep & with_hot]),
            "cool_latency_apart": latency_summary(p["latency_ns"][keep & ~with_hot]),
            "cool_errors": p["errors"],
            "hot_msgs_per_s": round(h["acked"] / run.wall_s, 1),
            "moves": len(status["moves"]),
            "cool_on_hot_worker_at_end": sum(1 for part, w in enumerate(owners) if part and w == owners[0]),
            "broker_cpu": run.broker_cpu,
        }
    finally:
        system.stop()


def _med(rs: list[dict], key: str) -> str:
    vals = [x[key]["p99_us"] for x in rs if x[key].get("count")]
    return f"{statistics.median(vals):.0f}" if vals else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tailrace.bench.probes.skew", description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="cool probe messages per second")
    ap.add_argument("--hot-batch", type=int, default=1000)
    ap.add_argument("--hot-in-flight", type=int, default=8)
    ap.add_argument("--interval-ms", type=int, default=250, help="rebalancer: at most one move per this")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    o = ap.parse_args(argv)
    rows = []
    for r in range(o.repeats):
        for rebalance in (0, 1):
            rows.append(one_run(rebalance, o))
    print(f"\nskewed load, 1 hot + {PARTITIONS - 1} cool partitions, 2 workers; cool probe {o.rate:.0f} msg/s; "
          f"figures after a {o.warmup:.0f} s warm-up over {o.seconds:.0f} s; {o.repeats} run(s), medians")
    print(f"{'rebalance':>9} {'cool p50 us':>11} {'cool p99 us':>11} {'cool p99.9':>10} {'hot msg/s':>11} {'moves':>5} "
          f"{'cool left on hot worker':>23} {'p99 with hot / apart':>21}")
    summary = {}
    for rebalance in (0, 1):
        rs = [x for x in rows if x["rebalance"] == rebalance]
        med = {k: statistics.median(x["cool_latency"].get(k, float("nan")) for x in rs) for k in ("p50_us", "p99_us", "p999_us")}
        hot = statistics.median(x["hot_msgs_per_s"] for x in rs)
        summary[rebalance] = {**med, "hot_msgs_per_s": hot}
        print(f"{'on' if rebalance else 'off':>9} {med['p50_us']:>11.0f} {med['p99_us']:>11.0f} {med['p999_us']:>10.0f} "
              f"{hot:>11.0f} {statistics.median(x['moves'] for x in rs):>5.0f} "
              f"{statistics.median(x['cool_on_hot_worker_at_end'] for x in rs):>23.0f} "
              f"{_med(rs, 'cool_latency_with_hot'):>10} / {_med(rs, 'cool_latency_apart'):<8}")
    if summary[1]["p99_us"]:
        print(f"cool P99 off/on: {summary[0]['p99_us'] / summary[1]['p99_us']:.2f}x")
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=2, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
