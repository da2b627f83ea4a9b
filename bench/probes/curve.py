"""What CurveZMQ costs: the same client work against a broker without auth and one with
``--auth curve``, alternated in one run (docs/BENCHMARKS.md, "Authentication").

    python -m tailrace.bench.probes.curve --repeat 3

Per broker and run: batched produce (``Producer.send_batch`` of ``--batch`` records of
``--size`` bytes, acks=memory, ``--messages`` in all, direct to the workers), then a consume of
them all from earliest (``Consumer.poll_columns``), then ``--singles`` single-message durable
produces, one at a time, each awaited (``send`` + ``flush``). Prints msgs/s medians [min-max]
and curve/none ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.bench.launcher import Broker
from tailrace.broker.auth import auth_dir, default_allow_dir, generate_keys


def _one(o, auth: str, root: Path) -> dict:
    b = Broker(root / f"broker-{auth}", workers=2, auth=auth)
    if auth == "curve":
        if not (root / "keys" / "bench.key").exists():
            generate_keys(str(root / "keys"), "bench")
        os.makedirs(default_allow_dir(str(b.data_dir)), exist_ok=True)
        shutil.copy(root / "keys" / "bench.key", default_allow_dir(str(b.data_dir)))
        b.client = {"key_file": str(root / "keys" / "bench.key_secret"),
                    "server_key": os.path.join(auth_dir(str(b.data_dir)), "server.key")}
    with b:  # starts it; stops it and its shared memory at the end
        with Admin(b.bootstrap, **b.client) as a:
            a.create_topic("t", o.partitions)
        batch = [os.urandom(o.size) for _ in range(o.batch)]
        with Producer(b.bootstrap, acks="memory", linger_ms=0, **b.client) as p:
            p.send_batch("t", batch[:10], partition=0)
            p.flush()
            t0 = time.perf_counter()
            for i in range(o.messages // o.batch):
                p.send_batch("t", batch, partition=i % o.partitions)
            p.flush()
            produce = (o.messages // o.batch) * o.batch / (time.perf_counter() - t0)
        expect = (o.messages // o.batch) * o.batch + 10
        with Consumer(b.bootstrap, max_wait_ms=50, **b.client) as c:
            c.assign("t", start="earliest")
            got, t0 = 0, time.perf_counter()
            while got < expect and time.perf_counter() - t0 < 60:
                got += sum(len(cols) for _t, _p, cols in c.poll_columns(500))
            consume = got / (time.perf_counter() - t0)
        with Producer(b.bootstrap, acks="durable", linger_ms=0, **b.client) as p:
            t0 = time.perf_counter()
            for i in range(o.singles):
                p.send("t", batch[0], partition=i % o.partitions)
                p.flush()
            single = o.singles / (time.perf_counter() - t0)
    return {"produce": produce, "consume": consume, "single": single}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.curve")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    o = ap.parse_args()
    runs: dict[str, list[dict]] = {"none": [], "curve": []}
    with tempfile.TemporaryDirectory(prefix="tailrace-curve-") as d:
        for r in range(o.repeat):
            for auth in ("none", "curve"):
                runs[auth].append(_one(o, auth, Path(d) / f"run{r}"))
                print(f"run {r + 1} {auth}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in runs[auth][-1].items()), flush=True)
    print(f"\n| case | no auth | CURVE | CURVE / no auth |\n|---|---:|---:|---:|")
    for k, label in (("produce", f"batched produce ({o.batch} x {o.size} B, acks=memory)"),
                     ("consume", "consume from earliest"), ("single", "single-message durable produce, one at a time")):
        a = [x[k] for x in runs["none"]]
        c = [x[k] for x in runs["curve"]]
        print(f"| {label} | {statistics.median(a):,.0f} [{min(a):,.0f}-{max(a):,.0f}] | "
              f"{statistics.median(c):,.0f} [{min(c):,.0f}-{max(c):,.0f}] | {statistics.median(c) / statistics.median(a):.2f}x |")


if __name__ == "__main__":
    main()
