"""Ten thousand partitions on one broker at the default settings, with the same workload over
8, 100 and 1,000 partitions in the same run (docs/BENCHMARKS.md "Ten thousand partitions").

    python -m tailrace.bench.probes.many_partitions --partitions 8,100,1000,10000 --messages 2000000

    python -m tailrace.bench.probes.many_partitions --topics-loop 2000 --rounds 3

One broker at the defaults but for its data directory and ``ring_idle_ms`` (2 workers, 8 MiB
rings, the default shared-memory budget and slots). For each partition count N (one topic
each, made in turn, all alive together):

- ``topic create`` of N partitions, timed;
- produce ``--messages`` records of ``--size`` bytes spread evenly over the N partitions, in
  batches of ``--batch`` records (the same batches for every N: what changes is how many
  partitions they land on), acks=memory, three passes: the first over fresh partitions, then
  the steady pass (the better of the next two);
- consume all three passes back (one consumer assigned every partition from the earliest,
  columnar polls), timed;

then, with every topic idle for ``ring_idle_ms`` and more: the broker's shared memory in use (its
regions' tmpfs blocks) and the proportional set size (PSS) of all its processes, per idle
partition against a broker with no topics; the CPU each program spends over 10 s of that idle;
a Prometheus scrape, timed; and the time from
kill -9 of every program (and supervisord) to a broker that answers again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.bench import procstat
from tailrace.bench.launcher import Broker
from tailrace.shm import region


def pss_bytes(b: Broker) -> int:
    """The proportional set size of every program of the broker (shared pages split)."""
    total = 0
    for pid in b.pids().values():
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except FileNotFoundError:
            pass
    return total


def produce_pass(b: Broker, topic: str, n: int, o) -> float:
    per = o.messages // n
    value = os.urandom(o.size)
    chunks = [(part, min(o.batch, per - at)) for at in range(0, per, o.batch) for part in range(n)]
    batches = {k: [value] * k for k in {k for _p, k in chunks}}
    t0 = time.perf_counter()
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        for part, k in chunks:
            p.send_batch(topic, batches[k], partition=part)
        p.flush(600_000)
    return time.perf_counter() - t0


def consume_all(b: Broker, topic: str, n: int, o, passes: int) -> float:
    want = (o.messages // n) * n * passes
    t0 = time.perf_counter()
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign(topic, start="earliest")
        got, deadline = 0, time.monotonic() + 600
        while got < want and time.monotonic() < deadline:
            got += sum(len(cols) for _t, _p, cols in c.poll_columns(500))
    took = time.perf_counter() - t0
    if got < want:
        raise RuntimeError(f"{topic}: read {got} of {want}")
    return took


def topics_loop(b: Broker, topics: int, parts: int, rounds: int) -> list[tuple[int, float, float, float, int, int]]:
    """``--topics-loop``: ``rounds`` times, ``topics`` topics of ``parts`` partitions created,
    one batch produced to every partition, all deleted; after each round (deleted slots cleared:
    the flusher's retirer), the broker's shared memory in use, its programs' PSS and the slots
    the catalog has ever handed out (next_slot: a round that reuses the slots freed leaves it)."""
    from tailrace.broker.catalog import Catalog
    out = []
    batch = [b"t" * 100] * 10
    for r in range(rounds):
        t0 = time.perf_counter()
        with Admin(b.bootstrap, timeout_ms=600_000) as a:
            for i in range(topics):
                a.create_topic(f"loop{i}", parts)
        with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
            for i in range(topics):
                for part in range(parts):
                    p.send_batch(f"loop{i}", batch, partition=part)
            p.flush(600_000)
        with Admin(b.bootstrap, timeout_ms=600_000) as a:
            for i in range(topics):
                a.delete_topic(f"loop{i}")
        took = time.perf_counter() - t0
        cat = Catalog(str(b.settings.data_dir))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the retirer clears the deleted slots' rows, rings and index files
            cat.reload()
            if region.resident_bytes(b.settings.instance) < 64 << 20 and len(region.list_instance_regions(b.settings.instance)) <= 1:
                break
            time.sleep(0.5)
        out.append((r, took, region.resident_bytes(b.settings.instance) / 2**20, pss_bytes(b) / 2**20,
                    cat.data.next_slot, len(cat.data.retired)))
        print(f"round {r}: {took:.1f} s, shm {out[-1][2]:.0f} MiB, PSS {out[-1][3]:.0f} MiB, "
              f"next_slot {out[-1][4]}, retired {out[-1][5]}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.many_partitions", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="8,100,1000,10000")
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=200, help="records a batch (every partition count alike)")
    ap.add_argument("--idle-ms", type=int, default=5000, help="the broker's ring_idle_ms")
    ap.add_argument("--scrapes", type=int, default=9)
    ap.add_argument("--topics-loop", type=int, default=0, help="only the many-topics loop: this many topics a round")
    ap.add_argument("--loop-partitions", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    o = ap.parse_args(argv)
    if o.topics_loop:
        with tempfile.TemporaryDirectory(prefix="tailrace-many-") as d:
            with Broker(Path(d) / "broker", workers=2, shm_budget_bytes=0, ring_idle_ms=o.idle_ms) as b:
                time.sleep(2)
                print(f"empty broker: shm {region.resident_bytes(b.settings.instance) / 2**20:.0f} MiB, "
                      f"PSS {pss_bytes(b) / 2**20:.0f} MiB", flush=True)
                topics_loop(b, o.topics_loop, o.loop_partitions, o.rounds)
        return 0
    counts = [int(x) for x in o.partitions.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tailrace-many-") as d:
        b = Broker(Path(d) / "broker", workers=2, shm_budget_bytes=0, ring_idle_ms=o.idle_ms)
        with b:
            time.sleep(2)
            base_pss, base_shm = pss_bytes(b), region.resident_bytes(b.settings.instance)
            for n in counts:
                topic = f"t{n}"
                with Admin(b.bootstrap, timeout_ms=600_000) as a:
                    t0 = time.perf_counter()
                    a.create_topic(topic, n)
                    create_s = time.perf_counter() - t0
                passes = [produce_pass(b, topic, n, o) for _ in range(3)]
                consume_s = consume_all(b, topic, n, o, len(passes))
                rows.append((n, create_s, passes[0], min(passes[1:]), consume_s))
                print(f"{n}: create {create_s:.2f}s produce {passes[0]:.2f}/{min(passes[1:]):.2f}s consume {consume_s:.2f}s",
                      flush=True)
            total = sum(counts)
            time.sleep(o.idle_ms / 1000 + 10)  # every ring idle, given back (MAX_RELEASES a tick)
            idle_pss, idle_shm = pss_bytes(b), region.resident_bytes(b.settings.instance)
            pids = b.pids()
            cpu0 = {k: procstat.cpu_seconds(p) for k, p in pids.items()}
            time.sleep(10)
            idle_cpu = {k: (procstat.cpu_seconds(p) or 0) - (cpu0[k] or 0) for k, p in pids.items()}
            times = []
            for _ in range(o.scrapes):
                t0 = time.perf_counter()
                body = urllib.request.urlopen(b.metrics_url, timeout=60).read()
                times.append(time.perf_counter() - t0)
            killed = b.hard_kill_all()
            b.spawn()
            b.wait_ready(120)
            with Admin(b.bootstrap, timeout_ms=60_000) as a:
                a.list_offsets(f"t{counts[-1]}")
            recovery_s = time.monotonic() - killed
    ref = rows[0]
    print(f"\n| partitions | topic create (s) | first pass (s) | steady pass (s) | produce vs {ref[0]} | "
          f"first / steady | consume (s) | consume vs {ref[0]} |\n|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, create_s, first, steady, consume_s in rows:
        print(f"| {n:,} | {create_s:.2f} | {first:.2f} | {steady:.2f} | {ref[3] / steady:.2f}x | {first / steady:.2f}x "
              f"| {consume_s:.2f} | {ref[4] / consume_s:.2f}x |")
    print(f"\n{total:,} partitions idle ({o.messages:,} x {o.size} B x 3 passes written to each topic): "
          f"shared memory in use {idle_shm / 2**20:.0f} MiB (empty broker {base_shm / 2**20:.0f} MiB); "
          f"PSS of all programs {idle_pss / 2**20:.0f} MiB (empty {base_pss / 2**20:.0f} MiB): "
          f"{(idle_pss - base_pss) / total / 1024:.1f} KiB per idle partition; "
          f"scrape median {statistics.median(times) * 1000:.0f} ms (max {max(times) * 1000:.0f} ms, {len(body):,} B); "
          f"kill -9 of everything to answering again {recovery_s:.1f} s; CPU of each program over 10 s idle: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(idle_cpu.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
