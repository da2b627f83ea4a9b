"""Cluster mode's costs, in one run (docs/BENCHMARKS.md "Cluster (issue 33)"). Every topic it makes
has one replica, stated (a cluster's default is 3 since issue 34): these are the cluster issue's
figures; replication's are bench/replication_bench.py's.

    python -m tailrace.bench.cluster_bench [--messages 1000000] [--rounds 3] [--quick] [--data-root DIR]

1. **One broker in cluster mode against one without.** Both run side by side for the whole step
   (2 workers each, segment_bytes 64 MiB, other settings default); the cluster one is broker 0 of
   a cluster of its own on one loopback etcd (fsync on). Each round measures both, the order
   alternating (single first in even rounds, cluster first in odd ones), each on fresh topics of
   8 partitions: batched produce (one blocking producer, 1,000 records of 100 B per
   ``send_buffers``, acks memory, 4 in flight per partition: bench/format_bench.py's), the
   consume of those records from the earliest offset (``poll_columns``), and end-to-end latency
   (the ``e2e-latency`` workload's probe, bench/gen_tailrace.py: one-record produce requests
   stamped with CLOCK_MONOTONIC at ``--e2e-rate`` for ``--e2e-seconds``, acks memory, a consumer
   tailing the 8 partitions with long polls; latency = receive time - the stamp). Figures are
   medians over rounds; each cluster/single ratio is the median of the per-round ratios.
1b. **Consume alone** (``step_consume``): the same pair of brokers, each given one topic of
   ``--messages`` records once, then ``--read-rounds`` reads of it from the earliest offset on each,
   alternating, with nothing between them.
2. **Metadata of many partitions.** A 3-broker cluster (1 worker each, max_slots 16,384, 2 MiB
   rings with the default 1 MiB max batch, a shared-memory budget that counts every partition:
   rings are only made when used), ``--meta-partitions`` partitions in topics of at most 1,000;
   then, 5 times, a fresh client learns every partition's leader: a new ``Admin`` describing every
   topic (the bootstrap broker rotating over the three), and a new ``Producer`` taking in every
   topic's routes (``partitions_for``, what it does before its first send).
3. **Failure detection.** For each ``--ttls`` (the brokers' ``cluster_ttl_s``) and each of
   ``--deaths`` repetitions, a fresh 3-broker cluster with a topic of 6 partitions: a broker that
   is not the controller is killed (every program kill -9 with supervisord and ``tailrace serve``
   frozen: nothing is told anything), and the time from the kills to etcd's assignments showing
   each of its partitions without a leader (``NO_LEADER``) is taken; then the controller is killed
   the same way and the time to another broker holding the controller key is taken. Both are
   polled in etcd every 20 ms.

Everything runs on loopback under one temporary directory (under ``--data-root``), removed at the
end; every broker and etcd is stopped by pid. Prints a JSON summary, then a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tailrace.bench.format_bench import consume, log_lines
from tailrace.bench.launcher import Broker
from tailrace.bench.loadgen import Job, run_jobs
from tailrace.client.admin import Admin
from tailrace.client.errors import TailraceError
from tailrace.client.producer import Producer
from tailrace.cluster.etcd import Etcd
from tailrace.cluster.etcd_server import EtcdServer
from tailrace.cluster.metadata import NO_LEADER, Keys, read_assignments, read_controller
from tailrace.shm.layout import ring_region_bytes

PARTITIONS = 8
BATCH = 1000
SIZE = 100
MiB = 1 << 20
TOPIC_MAX = 1000  # partitions per topic in the metadata step (router/topics.py MAX_PARTITIONS is 1024)
META_RING = 2 * MiB  # >= 2 x the default max_batch_bytes (1 MiB)
POLL_S = 0.02
TARGETS = {"produce": 0.95, "consume": 0.95, "e2e_p50": 1.10, "metadata_s": 1.0}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- step 1: single vs cluster ------------------------------------------------------------------

def produce(bootstrap: str, topic: str, values, offsets, n: int) -> float:
    """bench/format_bench.py's produce (variant none): msg/s to the last acknowledgement."""
    step = BATCH * SIZE
    batches = n // BATCH
    with Producer(bootstrap, acks="memory", linger_ms=0, max_in_flight_per_partition=4) as p:
        t0 = time.perf_counter()
        for i in range(batches):
            a = (i * step) % (len(values) - step + 1)
            p.send_buffers(topic, values[a : a + step], offsets[: BATCH + 1], partition=i % PARTITIONS)
        p.flush()
        took = time.perf_counter() - t0
        if p.errors:
            raise RuntimeError(f"produce to {topic}: {len(p.errors)} errors, first {p.errors[0]!r}")
        if p.acked_records != batches * BATCH:
            raise RuntimeError(f"produce to {topic}: {p.acked_records} acknowledged of {batches * BATCH}")
    return batches * BATCH / took


def e2e(b: Broker, topic: str, rate: int, seconds: float, max_wait_ms: int = 500) -> dict:
    """The e2e-latency workload's probe (bench/workloads.py ``_e2e_case``) on topic ``topic``."""
    with Producer(b.bootstrap, acks="memory") as p:  # warm: every owner adopts its partition
        for part in range(PARTITIONS):
            p.send(topic, b"warm", partition=part)
        p.flush()
    total = int(rate * seconds)
    common = {"endpoint": b.bootstrap, "direct": True, "same_host": False, "topic": topic, "partitions": PARTITIONS,
              "size": SIZE, "max_seconds": seconds * 3 + 10}
    jobs = [Job("tailrace.bench.gen_tailrace:e2e_consume", {**common, "expected": total, "max_wait_ms": max_wait_ms}),
            Job("tailrace.bench.gen_tailrace:e2e_produce", {**common, "rate": rate, "messages": total, "acks": "memory"})]
    run = run_jobs(jobs, label=f"e2e {topic}", total=total, timeout_s=seconds * 3 + 130)
    cons, prod = run.results
    lat_ms = np.asarray(cons["latency_ns"], dtype=np.float64) / 1e6
    if cons["consumed"] != total or prod["acked"] != total:
        raise RuntimeError(f"e2e on {topic}: sent {prod['sent']}, acked {prod['acked']}, consumed {cons['consumed']} of {total}")
    return {"p50_ms": float(np.percentile(lat_ms, 50)), "p99_ms": float(np.percentile(lat_ms, 99)),
            "count": int(len(lat_ms)), "rate_achieved": round(prod["rate_achieved"], 1)}


@contextlib.contextmanager
def broker_pair(root: Path, etcd: EtcdServer, tag: str):
    """A broker without ``--cluster`` and one that is broker 0 of a cluster of its own (name
    ``bench-<pid>-<tag>``) on ``etcd``, both 2 workers and 64 MiB segments, running side by side:
    {"single": Broker, "cluster": Broker}; both stopped by pid and their shared memory removed."""
    common = dict(workers=2, segment_bytes=64 << 20)
    brokers = {"single": Broker(root / f"single-{tag}", **common),
               "cluster": Broker(root / f"cluster-{tag}", cluster=f"etcd://{etcd.endpoint}", broker_id=0,
                                 cluster_name=f"bench-{os.getpid()}-{tag}", **common)}
    try:
        for b in brokers.values():
            b.spawn()
        for b in brokers.values():
            b.wait_ready(90)
        yield brokers
    finally:
        tell_to_stop(brokers.values())
        for b in brokers.values():
            b.stop()
        for b in brokers.values():
            b.cleanup_shm()


def tell_to_stop(brokers) -> None:
    """SIGTERM every running broker's ``tailrace serve`` at once, so that their clean stops run
    side by side (``Broker.stop`` then waits for each; ``serve`` acts on the first signal only).
    One after the other they took 2-3 s each."""
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.send_signal(signal.SIGTERM)


def step_single_vs_cluster(root: Path, etcd: EtcdServer, args) -> dict:
    n = args.messages // BATCH * BATCH
    values, offsets = log_lines(min(n, 200_000))
    runs: dict[str, list[dict]] = {"single": [], "cluster": []}
    with broker_pair(root, etcd, "one") as brokers:
        for r in range(args.rounds):
            order = ("single", "cluster") if r % 2 == 0 else ("cluster", "single")
            for mode in order:
                b = brokers[mode]
                topic, etopic = f"cb-{r}", f"cb-e2e-{r}"
                with Admin(b.bootstrap, timeout_ms=30_000) as a:
                    a.create_topic(topic, PARTITIONS, replication_factor=1)
                    a.create_topic(etopic, PARTITIONS, replication_factor=1)
                row = {"produce": produce(b.bootstrap, topic, values, offsets, n)}
                row["consume"] = consume(b.bootstrap, topic, n)
                row["e2e"] = e2e(b, etopic, args.e2e_rate, args.e2e_seconds)
                row["e2e_p50_ms"] = row["e2e"]["p50_ms"]
                runs[mode].append(row)
                log(f"round {r} {mode:<7}: produce {row['produce']:,.0f} msg/s, consume {row['consume']:,.0f} msg/s, "
                    f"e2e p50 {row['e2e']['p50_ms']:.2f} ms p99 {row['e2e']['p99_ms']:.2f} ms")
    keys = ("produce", "consume", "e2e_p50_ms")
    out = {"messages": n, "rounds": args.rounds, "e2e_rate": args.e2e_rate, "e2e_seconds": args.e2e_seconds}
    for mode in ("single", "cluster"):
        out[mode] = {"median": {k: statistics.median(x[k] for x in runs[mode]) for k in keys},
                     "e2e_p99_ms_median": statistics.median(x["e2e"]["p99_ms"] for x in runs[mode]),
                     "runs": runs[mode]}
    out["ratio_cluster_to_single"] = {k: statistics.median(c[k] / s[k] for c, s in zip(runs["cluster"], runs["single"]))
                                      for k in keys}
    return out


def step_consume(root: Path, etcd: EtcdServer, args) -> dict:
    """Consume alone: the same two brokers as ``step_single_vs_cluster``, each given one topic of
    ``--messages`` records once, then ``--read-rounds`` reads of it from the earliest offset on
    each, the order alternating. Step 1 times each consume right after its own produce (the
    flusher still writing, the rings just filled), which moves it by +-15% between rounds of one
    mode; here nothing else runs between the reads."""
    n = args.messages // BATCH * BATCH
    values, offsets = log_lines(min(n, 200_000))
    runs: dict[str, list[float]] = {"single": [], "cluster": []}
    with broker_pair(root, etcd, "reads") as brokers:
        for b in brokers.values():
            with Admin(b.bootstrap, timeout_ms=30_000) as a:
                a.create_topic("reads", PARTITIONS, replication_factor=1)
            produce(b.bootstrap, "reads", values, offsets, n)
        for r in range(args.read_rounds):
            for mode in (("single", "cluster") if r % 2 == 0 else ("cluster", "single")):
                runs[mode].append(consume(brokers[mode].bootstrap, "reads", n))
                log(f"read {r} {mode:<7}: {runs[mode][-1]:,.0f} msg/s")
    return {"messages": n, "rounds": args.read_rounds,
            "single": {"median": statistics.median(runs["single"]), "runs": runs["single"]},
            "cluster": {"median": statistics.median(runs["cluster"]), "runs": runs["cluster"]},
            "ratio_cluster_to_single": statistics.median(c / s for c, s in zip(runs["cluster"], runs["single"]))}


# --- clusters of 3 ------------------------------------------------------------------------------

class Cluster:
    """``n`` brokers (1 worker each) on one etcd, under cluster name ``name``."""

    def __init__(self, root: Path, etcd: EtcdServer, name: str, n: int = 3, **settings):
        self.name = name
        self.brokers = [Broker(root / f"{name}-b{i}", workers=1, cluster=f"etcd://{etcd.endpoint}", broker_id=i,
                               cluster_name=name, **settings) for i in range(n)]
        self.etcd = Etcd(etcd.endpoint, timeout_s=5.0)
        self.keys = Keys(name)

    def start(self, timeout_s: float = 120.0) -> "Cluster":
        for b in self.brokers:
            b.spawn()
        for b in self.brokers:
            b.wait_ready(timeout_s)
        deadline = time.monotonic() + 30
        while self.controller() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.name}: no controller 30 s after its brokers were ready")
            time.sleep(0.05)
        return self

    def controller(self) -> int | None:
        c = read_controller(self.etcd, self.keys)
        return None if c is None else c[0]

    def leaders(self, topic: str) -> dict[int, int]:
        current, _ = read_assignments(self.etcd, self.keys, topic)
        return {p: a.leader for (_t, p), (a, _rev) in current.items()}

    def stop(self) -> None:
        tell_to_stop(self.brokers)
        for b in self.brokers:
            try:
                b.stop()
            except Exception as exc:  # noqa: BLE001 - the others are stopped regardless
                log(f"stopping {b.data_dir}: {exc!r}")
        for b in self.brokers:
            b.cleanup_shm()


def wait_for(predicate, since: float, timeout_s: float) -> float | None:
    """Seconds from ``since`` (CLOCK_MONOTONIC) to the first poll where ``predicate()`` holds, or
    None after ``timeout_s``."""
    while True:
        if predicate():
            return time.monotonic() - since
        if time.monotonic() - since > timeout_s:
            return None
        time.sleep(POLL_S)


# --- step 2: metadata of many partitions ----------------------------------------------------------

def step_metadata(root: Path, etcd: EtcdServer, total: int, loads: int) -> dict:
    topics = [(f"meta-{i}", min(TOPIC_MAX, total - i * TOPIC_MAX)) for i in range((total + TOPIC_MAX - 1) // TOPIC_MAX)]
    settings = dict(ring_bytes=META_RING, max_slots=16384, segment_bytes=8 << 20,
                    shm_budget_bytes=(total + 1024) * ring_region_bytes(META_RING) + (1 << 30))
    out: dict = {"partitions": total, "topics": len(topics), "settings": {k: v for k, v in settings.items()}}
    c = Cluster(root, etcd, f"bench-{os.getpid()}-meta", **settings)
    try:
        t0 = time.monotonic()
        c.start()
        log(f"metadata: 3 brokers ready in {time.monotonic() - t0:.1f} s; creating {len(topics)} topics, {total:,} partitions")
        t0 = time.monotonic()
        create_s = []
        with Admin(c.brokers[0].bootstrap, timeout_ms=120_000) as a:
            for name, parts in topics:
                t1 = time.monotonic()
                try:
                    a.create_topic(name, parts, replication_factor=1)
                except TailraceError as exc:
                    out["create_error"] = f"{name} ({parts} partitions): {type(exc).__name__}: {exc}"
                    log(f"metadata: create failed: {out['create_error']}")
                    return out
                create_s.append(time.monotonic() - t1)
        out["create_s_each"] = [round(x, 2) for x in create_s]
        out["create_s_total"] = round(time.monotonic() - t0, 2)
        # every broker describes every partition with its leader before anything is timed
        t0 = time.monotonic()
        for i, b in enumerate(c.brokers):
            while True:
                try:
                    seen = describe_all(b.bootstrap, topics)
                except TailraceError as exc:
                    seen = {"error": repr(exc)}
                if seen.get("led") == total:
                    break
                if time.monotonic() - t0 > 180:
                    out["settle_error"] = f"broker {i} does not describe every partition's leader after 180 s: {seen}"
                    return out
                time.sleep(0.5)
        out["settle_s"] = round(time.monotonic() - t0, 2)
        by_broker = {}
        for name, _parts in topics:
            for _p, leader in c.leaders(name).items():
                by_broker[leader] = by_broker.get(leader, 0) + 1
        out["partitions_by_leader"] = {str(k): v for k, v in sorted(by_broker.items())}
        admin_runs, producer_runs = [], []
        for k in range(loads):
            bootstrap = c.brokers[k % len(c.brokers)].bootstrap
            seen = describe_all(bootstrap, topics)
            assert seen["led"] == total, seen
            admin_runs.append(seen["seconds"])
            producer_runs.append(producer_routes(bootstrap, topics, total))
            log(f"metadata load {k}: admin {admin_runs[-1]:.3f} s, producer {producer_runs[-1]:.3f} s")
        out["admin_s"] = {"median": statistics.median(admin_runs), "runs": [round(x, 4) for x in admin_runs]}
        out["producer_s"] = {"median": statistics.median(producer_runs), "runs": [round(x, 4) for x in producer_runs]}
        return out
    finally:
        c.stop()


def describe_all(bootstrap: str, topics: list[tuple[str, int]]) -> dict:
    """A fresh Admin describes every topic: seconds from its construction to the last reply, the
    partitions described and those with a leader."""
    t0 = time.perf_counter()
    described = led = 0
    with Admin(bootstrap, timeout_ms=30_000) as a:
        for name, _parts in topics:
            d = a.describe_topic(name)
            described += len(d.partitions)
            led += sum(1 for p in d.partitions if p.leader != NO_LEADER)
    return {"seconds": time.perf_counter() - t0, "described": described, "led": led}


def producer_routes(bootstrap: str, topics: list[tuple[str, int]], total: int) -> float:
    """A fresh Producer learns every topic's routes (leaders' endpoints for the partitions another
    broker leads): seconds from its construction to the last."""
    t0 = time.perf_counter()
    with Producer(bootstrap, acks="memory") as p:
        n = sum(p.partitions_for(name) for name, _parts in topics)
        took = time.perf_counter() - t0
        routed = len({tp for tp in p.routes.endpoints if tp[0] in dict(topics)})
    if n != total or routed != total:
        raise RuntimeError(f"producer learned {n} partitions ({routed} with an owner) of {total}")
    return took


# --- step 3: failure detection ------------------------------------------------------------------

def step_failover(root: Path, etcd: EtcdServer, ttls: list[int], deaths: int) -> dict:
    out: dict = {}
    for ttl in ttls:
        broker_s, controller_s, notes = [], [], []
        for rep in range(deaths):
            c = Cluster(root, etcd, f"bench-{os.getpid()}-ttl{ttl}-{rep}", cluster_ttl_s=ttl,
                        segment_bytes=8 << 20, shm_budget_bytes=512 << 20)
            try:
                c.start()
                with Admin(c.brokers[0].bootstrap, timeout_ms=30_000) as a:
                    a.create_topic("dies", 6, replication_factor=1)
                controller = c.controller()
                victim = next(i for i in (2, 1, 0) if i != controller)
                lost = sorted(p for p, b in c.leaders("dies").items() if b == victim)
                assert lost, c.leaders("dies")
                killed = c.brokers[victim].hard_kill_all()
                took = wait_for(lambda: all(c.leaders("dies")[p] == NO_LEADER for p in lost), killed, ttl * 3 + 15)
                if took is None:
                    notes.append(f"rep {rep}: broker {victim}'s partitions {lost} not reported unavailable in {ttl * 3 + 15} s")
                else:
                    broker_s.append(took)
                # then the controller, the one survivor left to take over
                killed = c.brokers[controller].hard_kill_all()
                took_c = wait_for(lambda: c.controller() not in (None, controller), killed, ttl * 3 + 15)
                if took_c is None:
                    notes.append(f"rep {rep}: no new controller {ttl * 3 + 15} s after controller {controller} died")
                else:
                    controller_s.append(took_c)
                log(f"ttl {ttl} rep {rep}: broker {victim} dead -> {len(lost)} partitions unavailable in "
                    f"{took if took is None else round(took, 2)} s; controller {controller} dead -> new controller "
                    f"{c.controller()} in {took_c if took_c is None else round(took_c, 2)} s")
            finally:
                c.stop()
        out[str(ttl)] = {
            "broker_death_to_unavailable_s": {"median": statistics.median(broker_s) if broker_s else None,
                                              "runs": [round(x, 3) for x in broker_s]},
            "controller_death_to_new_controller_s": {"median": statistics.median(controller_s) if controller_s else None,
                                                     "runs": [round(x, 3) for x in controller_s]},
            "notes": notes}
    return out


# --- the run ------------------------------------------------------------------------------------

def table(out: dict) -> str:
    lines = []
    s = out.get("single_vs_cluster")
    if s:
        sm, cm, q = s["single"]["median"], s["cluster"]["median"], s["ratio_cluster_to_single"]
        lines += [f"{s['messages']:,} records of {SIZE} B, {PARTITIONS} partitions, {s['rounds']} rounds (medians); "
                  f"e2e at {s['e2e_rate']:,} msg/s for {s['e2e_seconds']} s", "",
                  "| | single broker | cluster mode (1 broker, etcd) | cluster / single | target |",
                  "|---|---:|---:|---:|---|",
                  f"| produce msg/s | {sm['produce']:,.0f} | {cm['produce']:,.0f} | {q['produce']:.3f} | >= 0.95 |",
                  f"| consume msg/s | {sm['consume']:,.0f} | {cm['consume']:,.0f} | {q['consume']:.3f} | >= 0.95 |",
                  f"| e2e p50 ms | {sm['e2e_p50_ms']:.2f} | {cm['e2e_p50_ms']:.2f} | {q['e2e_p50_ms']:.3f} | <= 1.10 |",
                  f"| e2e p99 ms | {s['single']['e2e_p99_ms_median']:.2f} | {s['cluster']['e2e_p99_ms_median']:.2f} | "
                  f"{s['cluster']['e2e_p99_ms_median'] / s['single']['e2e_p99_ms_median']:.3f} | |", ""]
    c = out.get("consume")
    if c:
        lines += [f"consume alone: {c['messages']:,} records, {c['rounds']} reads on each broker (medians)", "",
                  "| | single broker | cluster mode | cluster / single | target |", "|---|---:|---:|---:|---|",
                  f"| consume msg/s | {c['single']['median']:,.0f} | {c['cluster']['median']:,.0f} | "
                  f"{c['ratio_cluster_to_single']:.3f} | >= 0.95 |", ""]
    m = out.get("metadata")
    if m:
        lines += ["| metadata | |", "|---|---|"]
        if "create_error" in m or "settle_error" in m:
            lines.append(f"| failed | {m.get('create_error') or m.get('settle_error')} |")
        else:
            lines += [f"| {m['partitions']:,} partitions in {m['topics']} topics, 3 brokers | leaders "
                      f"{m['partitions_by_leader']} |",
                      f"| creating them | {m['create_s_total']:.1f} s |",
                      f"| fresh Admin, describe every topic (median of {len(m['admin_s']['runs'])}) | "
                      f"{m['admin_s']['median']:.3f} s (target <= 1 s) |",
                      f"| fresh Producer, routes of every topic (median) | {m['producer_s']['median']:.3f} s |"]
        lines.append("")
    f = out.get("failover")
    if f:
        lines += ["| cluster_ttl_s | broker kill -9 -> its partitions NO_LEADER (s) | controller kill -9 -> new controller (s) |",
                  "|---:|---:|---:|"]
        for ttl, v in f.items():
            b, c = v["broker_death_to_unavailable_s"], v["controller_death_to_new_controller_s"]
            fmt = (lambda x: "-" if x["median"] is None else f"{x['median']:.2f} ({', '.join(f'{r:.2f}' for r in x['runs'])})")
            lines.append(f"| {ttl} | {fmt(b)} | {fmt(c)} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--e2e-rate", type=int, default=2000, help="e2e probe: one-record sends per second")
    ap.add_argument("--e2e-seconds", type=float, default=5.0)
    ap.add_argument("--meta-partitions", type=int, default=10_000)
    ap.add_argument("--meta-loads", type=int, default=5)
    ap.add_argument("--ttls", default="10,3", help="cluster_ttl_s values of the failure step, comma-separated")
    ap.add_argument("--deaths", type=int, default=3, help="fresh clusters per ttl in the failure step")
    ap.add_argument("--read-rounds", type=int, default=12, help="reads of one topic per broker in the consume step")
    ap.add_argument("--steps", default="single,consume,metadata,failover")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: 50,000 messages, 1 round, 1 s of e2e, "
                    "1,000 partitions, one death timing at ttl 3")
    ap.add_argument("--data-root", default=None, help="where the run's temporary directory goes (removed at the end)")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.rounds, args.e2e_seconds, args.read_rounds = 50_000, 1, 1.0, 2
        args.meta_partitions, args.meta_loads, args.ttls, args.deaths = 1000, 3, "3", 1
    steps = args.steps.split(",")
    out: dict = {"command": " ".join(["python -m tailrace.bench.cluster_bench", *(argv if argv is not None else sys.argv[1:])]),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "targets": TARGETS}
    t_run = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.data_root, prefix="cluster-bench-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root / "etcd", fsync=True)
        try:
            etcd.start()
            if "single" in steps:
                t0 = time.monotonic()
                out["single_vs_cluster"] = step_single_vs_cluster(root, etcd, args)
                out["single_vs_cluster"]["seconds"] = round(time.monotonic() - t0, 1)
            if "consume" in steps:
                t0 = time.monotonic()
                out["consume"] = step_consume(root, etcd, args)
                out["consume"]["seconds"] = round(time.monotonic() - t0, 1)
            if "metadata" in steps:
                t0 = time.monotonic()
                out["metadata"] = step_metadata(root, etcd, args.meta_partitions, args.meta_loads)
                out["metadata"]["seconds"] = round(time.monotonic() - t0, 1)
            if "failover" in steps:
                t0 = time.monotonic()
                out["failover"] = step_failover(root, etcd, [int(x) for x in args.ttls.split(",")], args.deaths)
                out["failover_seconds"] = round(time.monotonic() - t0, 1)
        finally:
            etcd.stop()
    out["seconds"] = round(time.monotonic() - t_run, 1)
    print(json.dumps(out, indent=1))
    print()
    print(table(out))
    return out


if __name__ == "__main__":
    main()
