"""Replication's costs (issue 34, parts 1-2), in one run (docs/BENCHMARKS.md "Replication (issue 34)"):

    python -m tailrace.bench.replication_bench [--messages 1000000] [--rounds 3] [--quick] [--data-root DIR]

One cluster of three brokers (1 worker each, bench/cluster_bench.py's ``Cluster``: segment_bytes
64 MiB, other settings default, ``replica.lag.time.max.ms`` 30 s, ttl 10 s) on one loopback etcd
(fsync on), all on this machine with the client. Topics of 8 partitions; the replicated ones
``replication_factor=3``, ``min.insync.replicas=2``.

1. **Batched produce** (``step_produce``): one blocking producer, 1,000 records of 100 B log-like
   text per ``send_buffers`` (bench/format_bench.py's ``log_lines``), 4 in flight per partition,
   linger 0, timed to the last acknowledgement (cluster_bench's ``produce`` with the acks level
   as a parameter), into fresh topics each round: acks ``all`` on RF 3, acks ``memory`` on RF 1
   and acks ``durable`` on RF 3 (since 0e11299: synced on the leader and every in-sync follower),
   the order rotating by round (``--modes memory/RF3`` adds acks memory on RF 3). Medians over rounds; ratios are
   medians of per-round ratios to acks memory RF 1 (issue 34's target: all/RF 3 >= 0.5x). Right
   after each acks=all run every broker's own log ends are read (LIST_OFFSETS on its worker): on
   RF 3 each must hold every record (the ISR is all three when nothing lags).
2. **Durable single-message produce** (``step_single``): the ``durable-single`` workload of the
   asyncio client (bench/gen_aio.py ``single``: coroutines sharing one AsyncProducer per process,
   each sends one 100 B record to its own partition and awaits the ack), 64 coroutines over 2
   processes, acks durable, for ``--single-seconds``, on the RF 3 topic and, for reference, on an
   RF 1 one. (gen_tailrace.py's raw-frame generator cannot take a cluster bootstrap: it asks the
   bootstrap router for every partition, and the ones other brokers lead are answered
   NOT_LEADER_OR_FOLLOWER.)
3. **Follower catch-up** (``step_catchup``): on an RF 3 topic, a follower broker that is not the
   controller has its router paused (SIGSTOP: it fetches nothing; the pause is far shorter than its lease
   and the ISR lag limit), ``--catchup-messages`` records are produced acks memory into the partitions
   it does not lead; it is resumed and its own log ends (LIST_OFFSETS on its worker) are polled
   every 20 ms until they equal the leaders' (log end) and until its durable watermarks do
   (synced: what it reports to the leaders). Catch-up speed = records (and bytes appended to its
   rings) over that time.

4. **Leader failover** (``step_failover``, ``--failovers`` times): kill -9 a partition's leader
   under acks=all load, time to the first acknowledgement on the new leader; the old leader is
   restarted and must rejoin the ISR (see the step's docstring).

Everything runs under one temporary directory (under ``--data-root``), removed at the
end; every broker and etcd is stopped by pid. Prints a JSON summary, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tailrace.bench.cluster_bench import BATCH, PARTITIONS, POLL_S, SIZE, Cluster, describe_all, log, wait_for
from tailrace.bench.format_bench import log_lines
from tailrace.bench.loadgen import Job, run_jobs
from tailrace.bench.procstat import CpuMeter
from tailrace.client import protocol as P
from tailrace.client.admin import Admin
from tailrace.client.connection import Connection
from tailrace.client.producer import Producer
from tailrace.cluster.etcd_server import EtcdServer
from tailrace.cluster.metadata import read_assignments

MODES = {"all/RF3": ("all", 3), "memory/RF1": ("memory", 1), "durable/RF3": ("durable", 3),
         "memory/RF3": ("memory", 3)}  # the last only with --modes: the followers' copying without waiting for them
BASE = "memory/RF1"
TARGET_ALL_TO_MEMORY = 0.5
MIN_ISR = "2"
_offsets_dec = P.decoder(P.ListOffsetsReply)


def create(c: Cluster, topic: str, rf: int) -> None:
    """A topic of PARTITIONS partitions and factor ``rf`` (min.insync.replicas 2 when replicated),
    made through broker 0; returns once every broker describes every partition with a leader."""
    config = {"min.insync.replicas": MIN_ISR} if rf > 1 else None
    with Admin(c.brokers[0].bootstrap, timeout_ms=30_000) as a:
        a.create_topic(topic, PARTITIONS, replication_factor=rf, config=config)
    for b in c.brokers:
        if wait_for(lambda b=b: describe_all(b.bootstrap, [(topic, PARTITIONS)])["led"] == PARTITIONS,
                    time.monotonic(), 30) is None:
            raise RuntimeError(f"{topic}: {b.bootstrap} does not describe every partition's leader after 30 s")


def own_ends(broker, topic: str) -> dict[int, tuple[int, int, int]]:
    """``broker``'s own log of each partition of ``topic``, as its worker's LIST_OFFSETS gives it
    (the control table: led or followed alike): partition -> (log end, durable watermark, bytes
    appended to its ring)."""
    conn = Connection(broker.settings.worker_endpoint(0), 5000)
    try:
        r = conn.request(P.Op.LIST_OFFSETS, topic, -1, P.encode(P.ListOffsetsRequest()), timeout_ms=5000)
        return {po.partition: (po.high_watermark, po.durable_watermark, po.appended_bytes)
                for po in _offsets_dec.decode(r.header).partitions}
    finally:
        conn.close()


def send_batches(p: Producer, topic: str, values, offsets, n: int, partitions) -> float:
    """``n`` records in batches of BATCH (``send_buffers``), dealt round robin over ``partitions``;
    seconds to the last acknowledgement."""
    step = BATCH * SIZE
    span = len(values) - step + 1
    t0 = time.perf_counter()
    for i in range(n // BATCH):
        a = (i * step) % span
        p.send_buffers(topic, values[a:a + step], offsets[:BATCH + 1], partition=partitions[i % len(partitions)])
    p.flush()
    took = time.perf_counter() - t0
    if p.errors or p.acked_records != n // BATCH * BATCH:
        raise RuntimeError(f"produce to {topic}: {p.acked_records} acknowledged of {n // BATCH * BATCH}, "
                           f"{len(p.errors)} errors{', first ' + repr(p.errors[0]) if p.errors else ''}")
    return took


def program_pids(c: Cluster) -> dict[str, int]:
    return {f"b{i}/{name}": pid for i, b in enumerate(c.brokers) for name, pid in b.pids().items()}


# --- step 1: batched produce --------------------------------------------------------------------

def step_produce(c: Cluster, args) -> dict:
    n = args.messages // BATCH * BATCH
    values, offsets = log_lines(min(n, 200_000))
    pids = program_pids(c)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        k = r % len(args.modes)
        for mode in args.modes[k:] + args.modes[:k]:
            acks, rf = MODES[mode]
            topic = f"rb-{acks}-rf{rf}-{r}"
            create(c, topic, rf)
            meter = CpuMeter(pids)
            cpu0 = time.process_time()
            with Producer(c.brokers[0].bootstrap, acks=acks, linger_ms=0, max_in_flight_per_partition=4) as p:
                p.partitions_for(topic)
                meter.start()
                took = send_batches(p, topic, values, offsets, n, range(PARTITIONS))
                cpu = meter.stop()
                client_cpu = time.process_time() - cpu0
            row = {"msgs_per_s": n / took, "seconds": round(took, 3), "leaders": sorted(c.leaders(topic).values()),
                   "broker_cores": round(sum(v["cpu_s"] or 0 for v in cpu.values()) / took, 2),
                   "client_cores": round(client_cpu / took, 2)}
            if acks == "all":  # every ISR member holds every acknowledged record
                row["held_by_broker"] = [sum(e[0] for e in own_ends(b, topic).values()) for b in c.brokers]
            runs[mode].append(row)
            log(f"round {r} {mode:<11}: {row['msgs_per_s']:,.0f} msg/s ({took:.2f} s), brokers {row['broker_cores']} "
                f"cores, client {row['client_cores']}{', held ' + str(row['held_by_broker']) if 'held_by_broker' in row else ''}")
    out: dict = {"messages": n, "rounds": args.rounds, "modes": {}}
    for mode, rows in runs.items():
        out["modes"][mode] = {"median_msgs_per_s": statistics.median(x["msgs_per_s"] for x in rows), "runs": rows}
    if BASE in runs:
        out["ratio_to_memory_rf1"] = {mode: statistics.median(x["msgs_per_s"] / b["msgs_per_s"] for x, b in zip(rows, runs[BASE]))
                                      for mode, rows in runs.items() if mode != BASE}
    return out


# --- step 2: durable single-message produce ----------------------------------------------------------

def step_single(c: Cluster, args) -> dict:
    out = {"producers": args.single_producers, "processes": 2, "seconds": args.single_seconds}
    for rf in (3, 1):
        topic = f"rb-single-rf{rf}"
        create(c, topic, rf)
        with Producer(c.brokers[0].bootstrap, acks="durable") as p:  # warm: every leader's worker adopts (and is told)
            for part in range(PARTITIONS):
                p.send(topic, b"warm", partition=part)
            p.flush()
        per_proc = [args.single_producers // 2, args.single_producers - args.single_producers // 2]
        quota = 1_000_000 if not args.quick else 100_000
        jobs = [Job("tailrace.bench.gen_aio:single", {
            "endpoint": c.brokers[0].bootstrap, "direct": True, "same_host": False, "topic": topic, "partitions": PARTITIONS,
            "producers": k, "first_producer": first, "messages": quota // 2, "size": SIZE, "acks": "durable",
            "max_seconds": args.single_seconds, "uvloop": False, "partitioner": "pinned"})
            for k, first in zip(per_proc, (0, per_proc[0]))]
        run = run_jobs(jobs, label=f"durable single RF{rf}", total=quota, timeout_s=args.single_seconds + 120,
                       broker_pids=program_pids(c))
        acked = sum(x["acked"] for x in run.results)
        lat_ms = np.concatenate([x["latency_ns"] for x in run.results]).astype(np.float64) / 1e6
        row = {"msgs_per_s": acked / run.wall_s, "acked": acked, "sent": sum(x["sent"] for x in run.results),
               "errors": sum(x["errors"] for x in run.results),
               "p50_ms": float(np.percentile(lat_ms, 50)) if acked else None,
               "p99_ms": float(np.percentile(lat_ms, 99)) if acked else None,
               "broker_cores": round(sum(v["cpu_s"] or 0 for v in run.broker_cpu.values()) / run.wall_s, 2),
               "loadgen_cores": round(run.loadgen["cpu_s"] / run.wall_s, 2)}
        out[f"RF{rf}"] = row
        log(f"durable single RF{rf}: {row['msgs_per_s']:,.0f} msg/s, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
            f"{row['errors']} errors, brokers {row['broker_cores']} cores, load generators {row['loadgen_cores']}")
    return out


# --- step 3: follower catch-up --------------------------------------------------------------------

def step_catchup(c: Cluster, args) -> dict:
    n = args.catchup_messages // BATCH * BATCH
    topic = "rb-catchup"
    create(c, topic, 3)
    controller = c.controller()
    victim = next(i for i in (2, 1, 0) if i != controller)
    leaders = c.leaders(topic)
    kept = sorted(p for p, b in leaders.items() if b != victim)
    boot = c.brokers[next(i for i in range(3) if i != victim)].bootstrap
    values, offsets = log_lines(min(n, 200_000))
    out: dict = {"records": n, "follower": victim, "controller": controller, "partitions": kept,
                 "leaders": {str(p): leaders[p] for p in kept}}
    with Producer(boot, acks="all") as p:  # every copy starts from the same end, the follower's included
        for part in kept:
            p.send(topic, b"warm", partition=part)
        p.flush()
    start = own_ends(c.brokers[victim], topic)
    # where each leader's log ends once the records are in (send_batches deals batch i to kept[i % len(kept)]);
    # not the leaders' LIST_OFFSETS: a replicated partition's leader listed its high watermark (28e8ff7), held back by the pause
    want = {q: start[q][0] + BATCH * len(range(i, n // BATCH, len(kept))) for i, q in enumerate(kept)}
    router = c.brokers[victim].pids()["router"]
    with Producer(boot, acks="memory", linger_ms=0, max_in_flight_per_partition=4) as p:
        p.partitions_for(topic)  # routes learned before the pause (a DESCRIBE asks every leader, the paused one too)
        os.kill(router, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            produce_s = send_batches(p, topic, values, offsets, n, kept)
            before = own_ends(c.brokers[victim], topic)
        finally:
            os.kill(router, signal.SIGCONT)
            resumed = time.monotonic()
    out["produce_msgs_per_s"] = round(n / produce_s)
    out["paused_s"] = round(resumed - paused, 2)
    behind = sum(want[q] - before[q][0] for q in kept)
    out["behind_at_resume"] = behind
    out["copied_while_paused"] = sum(before[q][0] - start[q][0] for q in kept)
    ends = {}

    def reached(col: int) -> bool:
        ends.update(own_ends(c.brokers[victim], topic))
        return all(ends[q][col] >= want[q] for q in kept)  # never past it: checked below

    log_s = wait_for(lambda: reached(0), resumed, args.catchup_timeout)
    durable_s = wait_for(lambda: reached(1), resumed, args.catchup_timeout) if log_s is not None else None
    copied_bytes = sum(ends[q][2] - before[q][2] for q in kept)
    out.update({"log_end_s": log_s, "durable_s": durable_s, "copied_bytes": copied_bytes,
                "follower_ends": {str(q): ends[q][:2] for q in kept}, "leader_ends": {str(q): want[q] for q in kept}})
    if any(ends[q][0] != want[q] for q in kept):
        out["error"] = f"follower {victim}'s ends {[ends[q][0] for q in kept]} are not the leaders' {[want[q] for q in kept]}"
    elif log_s is None:
        out["error"] = f"follower {victim} not caught up {args.catchup_timeout} s after its router resumed"
    else:
        out["records_per_s"] = round(behind / log_s)
        out["mb_per_s"] = round(copied_bytes / log_s / 1e6, 1)  # as appended to its rings: batch headers included
        out["payload_mb_per_s"] = round(behind * SIZE / log_s / 1e6, 1)
        if durable_s is not None:
            out["durable_records_per_s"] = round(behind / durable_s)
    log(f"catch-up: follower {victim} {behind:,} records behind after a {out['paused_s']} s pause; log end reached in "
        f"{log_s if log_s is None else round(log_s, 3)} s, synced in {durable_s if durable_s is None else round(durable_s, 3)} s "
        f"({copied_bytes / 1e6:.1f} MB appended)")
    return out


# --- step 4: leader failover -------------------------------------------------------------------

def first_after_silence(acks: list[float], t0: float, silence_s: float = 0.3) -> float | None:
    """The first acknowledgement after ``t0`` that follows a silence (replies the killed leader
    sent just before its kill may still arrive just after it: they are not the new leader's)."""
    prev = t0
    for t in list(acks):
        if t > t0:
            if t - prev > silence_s:
                return t
            prev = t
    return None


def step_failover(c: Cluster, args) -> dict:
    """Per repetition: a fresh topic of three partitions, RF 3, and one of them led by a broker
    that is not the controller; a producer (acks all, idempotent, one record per send, linger 0) through a broker
    that stays up sends without pause; the leader's broker is killed (every program kill -9,
    bench/launcher.py ``hard_kill_all``); failover time = from the kill to the first
    acknowledgement after the silence that follows it (``first_after_silence``: the new leader's). Then the broker is
    started again and the step waits until it is back in the partition's ISR (it cuts what only it
    held and catches up) before the next repetition."""
    import threading
    ttl = c.brokers[0].settings.cluster_ttl_s
    out: dict = {"ttl_s": ttl, "target_s": ttl + 2, "runs": []}
    for rep in range(args.failovers):
        topic = f"rb-failover-{rep}"
        controller = c.controller()
        with Admin(c.brokers[controller].bootstrap, timeout_ms=30_000) as a:  # leaders spread: one per broker
            a.create_topic(topic, 3, replication_factor=3, config={"min.insync.replicas": MIN_ISR})
        current, _ = read_assignments(c.etcd, c.keys, topic)
        # a partition the controller does not lead (its own failover would add a controller election)
        part, first = next((p, a) for (_t, p), (a, _r) in sorted(current.items()) if a.leader != controller)
        victim = first.leader
        acks: list[float] = []
        stop = threading.Event()

        def produce():
            with Producer(c.brokers[controller].bootstrap, acks="all", linger_ms=0, request_timeout_ms=1000,
                          on_ack=lambda *_: acks.append(time.monotonic())) as p:
                i = 0
                while not stop.is_set():
                    p.send(topic, b"f%d" % i, partition=part)
                    i += 1
                    p.poll(1)
                p.flush(30_000)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        try:
            if wait_for(lambda: len(acks) >= 200, time.monotonic(), 30) is None:
                raise RuntimeError(f"{topic}: no steady acknowledgements before the kill")
            killed = time.monotonic()
            c.brokers[victim].hard_kill_all()
            wait_for(lambda: first_after_silence(acks, killed) is not None, killed, 60)
            first_after = first_after_silence(acks, killed)
            elected = read_assignments(c.etcd, c.keys, topic)[0][(topic, part)][0]
        finally:
            stop.set()
            t.join(60)
        run = {"victim": victim, "new_leader": elected.leader, "leader_epoch": elected.leader_epoch,
               "failover_s": None if first_after is None else round(first_after - killed, 3),
               "acks_before": sum(1 for x in acks if x <= killed)}
        c.brokers[victim].spawn()
        c.brokers[victim].wait_ready(120)
        back = wait_for(lambda: victim in read_assignments(c.etcd, c.keys, topic)[0][(topic, part)][0].isr,
                        time.monotonic(), 120)
        run["rejoined_isr_s"] = None if back is None else round(back, 2)
        log(f"failover {rep}: leader {victim} killed, broker {elected.leader} acknowledged after "
            f"{run['failover_s']} s (ttl {ttl} s); the old leader back in the ISR {run['rejoined_isr_s']} s after its start")
        out["runs"].append(run)
    times = [r["failover_s"] for r in out["runs"] if r.get("failover_s") is not None]
    if times:
        out["median_failover_s"] = round(statistics.median(times), 3)
        out["max_failover_s"] = max(times)
    return out


# --- the run ------------------------------------------------------------------------------------

def table(out: dict) -> str:
    lines = []
    s = out.get("produce")
    if s:
        q = s.get("ratio_to_memory_rf1", {})
        lines += [f"batched produce: {s['messages']:,} records of {SIZE} B, {PARTITIONS} partitions, {s['rounds']} rounds (medians)",
                  "", "| acks / replication factor | msg/s | per run | / memory RF 1 (median of per-round ratios) |",
                  "|---|---:|---|---:|"]
        for mode, v in s["modes"].items():
            per = ", ".join(f"{x['msgs_per_s'] / 1e3:,.0f}k" for x in v["runs"])
            ratio = "1" if mode == BASE else f"{q.get(mode, float('nan')):.3f}"
            lines.append(f"| {mode} | {v['median_msgs_per_s']:,.0f} | {per} | {ratio} |")
        lines.append("")
    d = out.get("single")
    if d:
        lines += [f"durable single-message produce, {d['producers']} senders, {d['seconds']} s", "",
                  "| topic | msg/s | p50 ms | p99 ms | errors |", "|---|---:|---:|---:|---:|"]
        for rf in ("RF3", "RF1"):
            if rf in d:
                x = d[rf]
                lines.append(f"| {rf} | {x['msgs_per_s']:,.0f} | {x['p50_ms']:.2f} | {x['p99_ms']:.2f} | {x['errors']} |")
        lines.append("")
    k = out.get("catchup")
    if k:
        lines += ["| follower catch-up | |", "|---|---|",
                  f"| records behind at resume | {k['behind_at_resume']:,} (router paused {k['paused_s']} s) |",
                  f"| to the leaders' log ends | {k['log_end_s'] if k['log_end_s'] is None else round(k['log_end_s'], 3)} s: "
                  f"{k.get('records_per_s', 0):,} records/s, {k.get('mb_per_s', 0)} MB/s appended "
                  f"({k.get('payload_mb_per_s', 0)} MB/s of values) |",
                  f"| to synced (durable watermark) | {k['durable_s'] if k['durable_s'] is None else round(k['durable_s'], 3)} s |"]
        if "error" in k:
            lines.append(f"| error | {k['error']} |")
    f = out.get("failover")
    if f:
        times = ", ".join(f"{r['failover_s']} s" for r in f["runs"] if r.get("failover_s") is not None)
        lines += ["", f"| leader failover (kill -9 to the first acknowledgement on the new leader), lease TTL {f['ttl_s']} s | |",
                  "|---|---|", f"| median (runs: {times}) | {f.get('median_failover_s')} s (target <= {f['target_s']} s) |"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="all/RF3,memory/RF1,durable/RF3",
                    help=f"of the batched produce step, comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--single-producers", type=int, default=64)
    ap.add_argument("--single-seconds", type=float, default=8.0)
    ap.add_argument("--catchup-messages", type=int, default=500_000)
    ap.add_argument("--catchup-timeout", type=float, default=120.0)
    ap.add_argument("--failovers", type=int, default=3, help="leader kills of the failover step")
    ap.add_argument("--steps", default="produce,single,catchup,failover")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: 50,000 messages, 1 round, 2 s of single "
                    "produce, 50,000 records to catch up")
    ap.add_argument("--data-root", default=None, help="where the run's temporary directory goes (removed at the end)")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.rounds, args.single_seconds, args.catchup_messages = 50_000, 1, 2.0, 50_000
        args.failovers = 1
    args.modes = args.modes.split(",")
    steps = args.steps.split(",")
    out: dict = {"command": " ".join(["python -m tailrace.bench.replication_bench", *(argv if argv is not None else sys.argv[1:])]),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "target_all_rf3_to_memory_rf1": TARGET_ALL_TO_MEMORY, "loadavg_start": os.getloadavg()}
    t_run = time.monotonic()
    with tempfile.TemporaryDirectory(dir=args.data_root, prefix="replication-bench-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root / "etcd", fsync=True)
        try:
            etcd.start()
            c = Cluster(root, etcd, f"bench-{os.getpid()}-rep", segment_bytes=64 << 20)
            try:
                t0 = time.monotonic()
                c.start()
                log(f"3 brokers ready in {time.monotonic() - t0:.1f} s, controller {c.controller()}")
                for name, step in (("produce", step_produce), ("single", step_single), ("catchup", step_catchup),
                                   ("failover", step_failover)):
                    if name in steps:
                        t0 = time.monotonic()
                        out[name] = step(c, args)
                        out[name]["step_seconds"] = round(time.monotonic() - t0, 1)
            finally:
                c.stop()
        finally:
            etcd.stop()
    out["seconds"] = round(time.monotonic() - t_run, 1)
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    print()
    print(table(out))
    return out


if __name__ == "__main__":
    main()
