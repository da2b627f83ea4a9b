"""Round trip of one single-record produce, client to the owning worker and back, nothing else
running: the floor under the single-message and e2e workloads.

    python -m tailrace.bench.probes.rtt --acks memory --messages 10000 --rate 5000

One request at a time at ``--rate`` per second to partition 0 (8 partitions), each waited for;
prints p50/p90/p99 in microseconds. Stops by itself after ``--messages``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tailrace.client import protocol as P
from tailrace.client.connection import Connection

from tailrace.bench.gen_tailrace import OneRecordFrame, owner_endpoints
from tailrace.bench.systems import TailraceSystem


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--acks", default="memory", choices=sorted(P.ACKS_BY_NAME))
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=5000, help="requests per second (one in flight)")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args(argv)
    system = TailraceSystem()
    system.start("rtt")
    try:
        system.create_topic("rtt", 8)
        eps = owner_endpoints({"endpoint": system.endpoint, "topic": "rtt"}, [0])
        header = P.encode(P.ProduceRequest(acks=P.ACKS_BY_NAME[o.acks]))
        frame = OneRecordFrame(100)
        conn = Connection(eps[0])
        lat = np.zeros(o.messages, dtype=np.int64)
        errors = 0
        t0 = time.monotonic()
        for i in range(o.messages):
            wait = t0 + i / o.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            t = time.perf_counter_ns()
            r = conn.request(P.Op.PRODUCE, "rtt", 0, header, frame.stamp())
            lat[i] = time.perf_counter_ns() - t
            errors += r.code != P.ErrorCode.OK
        conn.close()
    finally:
        system.stop()
    p50, p90, p99 = (float(x) / 1000 for x in np.percentile(lat, [50, 90, 99]))
    out = {"acks": o.acks, "messages": o.messages, "rate": o.rate, "errors": errors,
           "p50_us": round(p50, 1), "p90_us": round(p90, 1), "p99_us": round(p99, 1)}
    print(json.dumps(out) if o.json else
          f"produce round trip, acks={o.acks}, {o.messages} at {o.rate}/s: p50 {p50:,.0f} / p90 {p90:,.0f} / p99 {p99:,.0f} us, {errors} errors")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
