"""Quotas under load: a principal producing at 10x its quota, and another beside it
(docs/BENCHMARKS.md, "Quotas"; issue 20's target: the first gets at most 1.1x its quota over
10 s, the second's throughput stays within noise of running alone).

    python -m tailrace.bench.probes.quota --repeat 3

One broker with ``--auth curve`` per run, two principals: ``slow`` (``producer_byte_rate`` =
``--quota``) and ``other`` (no quota). Each producer is a process of its own (no shared GIL),
sends ``--size``-byte records in batches of ``--batch`` to ``--partitions`` partitions on 2
workers (acks=memory), with at most ``--buffer`` bytes unacked, as a producer's buffer would.
``slow`` is paced to offer ``--offer`` x its quota. Phase 1: ``other`` alone for ``--seconds``;
phase 2: both for ``--seconds``. Reported: bytes acked inside each phase's window, per second.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tailrace import Admin, Producer
from tailrace.bench.launcher import Broker
from tailrace.broker.auth import auth_dir, default_allow_dir, generate_keys


def _produce(name: str, bootstrap: str, client: dict, o, offer_bps: float, start_at: float, out) -> None:
    """Produce from ``start_at`` for ``o.seconds``; put (name, value bytes/s acked in the window,
    ms held, bytes/s offered)."""
    batch = [os.urandom(o.size)] * o.batch
    with Producer(bootstrap, acks="memory", linger_ms=0, **client) as p:
        while time.time() < start_at:
            time.sleep(0.001)
        t0 = time.monotonic()
        cpu0 = time.process_time()
        end = t0 + o.seconds
        sent = i = 0
        while (now := time.monotonic()) < end:
            paced = offer_bps > 0 and sent * o.size >= offer_bps * (now - t0)
            if paced:
                p.poll(1)
                continue
            if (sent - p.acked_records) * o.size >= o.buffer:  # the buffer is full: wait for an ack
                p.poll(20)
                continue
            p.send_batch("t", batch, partition=i % o.partitions)
            i += 1
            sent += o.batch
            p.poll(0)
        acked = p.acked_records * o.size
        cpu = time.process_time() - cpu0
        p.flush(120_000)
        out.put((name, acked / o.seconds, p.throttle_ms, sent * o.size / o.seconds, cpu / o.seconds))


def _phase(b: Broker, o, clients: dict[str, tuple[dict, float]]) -> dict[str, tuple]:
    q: mp.Queue = mp.Queue()
    start_at = time.time() + 1.0
    procs = [mp.Process(target=_produce, args=(name, b.bootstrap, c, o, offer, start_at, q))
             for name, (c, offer) in clients.items()]
    for pr in procs:
        pr.start()
    results = {}
    for _ in procs:
        name, *rest = q.get(timeout=o.seconds + 180)
        results[name] = tuple(rest)
    for pr in procs:
        pr.join(10)
    return results


def _one(o, root: Path) -> dict:
    b = Broker(root / "broker", workers=2, auth="curve")
    keys = root / "keys"
    os.makedirs(default_allow_dir(str(b.data_dir)), exist_ok=True)
    server = os.path.join(auth_dir(str(b.data_dir)), "server.key")
    clients = {}
    for name in ("slow", "other"):
        generate_keys(str(keys), name)
        shutil.copy(keys / f"{name}.key", default_allow_dir(str(b.data_dir)))
        clients[name] = {"key_file": str(keys / f"{name}.key_secret"), "server_key": server}
    b.client = clients["other"]
    subprocess.run([sys.executable, "-m", "tailrace", "quota", "set", "slow", "--producer-byte-rate", str(o.quota),
                    "--data-dir", str(b.data_dir)], check=True, capture_output=True)
    with b:
        with Admin(b.bootstrap, **b.client) as a:
            a.create_topic("t", o.partitions)
        time.sleep(1.0)
        alone = _phase(b, o, {"other": (clients["other"], 0)})
        both = _phase(b, o, {"slow": (clients["slow"], o.offer * o.quota), "other": (clients["other"], 0)})
    return {"other_alone": alone["other"][0], "other_with": both["other"][0], "slow": both["slow"][0],
            "slow_offered": both["slow"][2], "slow_held_ms": both["slow"][1], "other_held_ms": both["other"][1],
            "slow_cpu": both["slow"][3]}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.quota")
    ap.add_argument("--quota", type=int, default=5_000_000, help="slow's producer_byte_rate (bytes/s)")
    ap.add_argument("--offer", type=float, default=10.0, help="slow offers this many times its quota")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--buffer", type=int, default=8 << 20, help="unacked bytes a producer keeps at most")
    ap.add_argument("--repeat", type=int, default=3)
    o = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="tailrace-quota-") as d:
        for r in range(o.repeat):
            runs.append(_one(o, Path(d) / f"run{r}"))
            x = runs[-1]
            print(f"run {r + 1}: slow offered {x['slow_offered'] / o.quota:.1f}x, got {x['slow'] / o.quota:.3f}x its quota "
                  f"(held {x['slow_held_ms']} ms, its process {x['slow_cpu']:.0%} of a core); other alone {x['other_alone'] / 1e6:.1f} MB/s, beside slow "
                  f"{x['other_with'] / 1e6:.1f} MB/s ({x['other_with'] / x['other_alone']:.2f}x, held {x['other_held_ms']} ms)",
                  flush=True)

    def med(k):
        v = [x[k] for x in runs]
        return statistics.median(v), min(v), max(v)

    s, s0, s1 = (v / o.quota for v in med("slow"))
    a, a0, a1 = (v / 1e6 for v in med("other_alone"))
    w, w0, w1 = (v / 1e6 for v in med("other_with"))
    ratios = [x["other_with"] / x["other_alone"] for x in runs]
    print(f"\n| measure ({o.seconds:g} s windows, {o.size} B records, batches of {o.batch}, median of {o.repeat}) | value |\n|---|---:|")
    sent = statistics.median(x["slow_offered"] for x in runs) / o.quota
    print(f"| slow: acked / quota ({o.quota / 1e6:g} MB/s; paced to {o.offer:g}x, sent {sent:.1f}x: its buffer of "
          f"{o.buffer >> 20} MiB unacked fills) | {s:.3f}x [{s0:.3f}-{s1:.3f}] |")
    print(f"| other alone | {a:.1f} MB/s [{a0:.1f}-{a1:.1f}] |")
    print(f"| other beside slow | {w:.1f} MB/s [{w0:.1f}-{w1:.1f}] |")
    print(f"| other beside / alone | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |")


if __name__ == "__main__":
    main()
