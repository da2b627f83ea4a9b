"""Soak: mixed produce (acks none, memory, durable) and a tailing consumer while random broker
processes are killed with SIGKILL every few seconds; then an audit of every record.

    python -m tailrace.bench.soak --minutes 10
    python -m tailrace.bench.soak --minutes 3 --rate 5000 --kill-every 2,6 --seed 7

Not a CI test: it runs for as long as it is told (bounded: ``--minutes``, then at most a few
minutes of draining and auditing). One broker (bench/launcher.py, the same supervisord tree as
``tailrace serve``) on a temporary data directory; one topic per ack level; one producer thread
per topic, paced to ``--rate`` records/s, each record auditable (bench/audit.py:
partition, sequence and a pattern of both, sent in order with one batch in flight per partition
and idempotence). Every ``--kill-every`` seconds (uniform in the range) a random victim gets
SIGKILL: the flusher, the router, one worker, or every program at once; supervisord restarts it.

The audit streams each partition from offset 0 (memory isolation) and checks it against the
sequence the producer sent: ``found`` records, ``lost`` = acknowledged but not found,
``duplicated``, ``out_of_order`` (a record that is not the next one expected: a gap or a
corruption). With acks=none nothing is acknowledged, so only duplicates and order count there;
records lost with a killed process are expected and reported as ``unacked_missing``.

Exit status: 0 if nothing acknowledged was lost and nothing was duplicated or out of order,
1 otherwise, 2 on a setup failure (broker did not start or a process did not come back).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tailrace import Admin, Consumer, Producer
from tailrace.client.errors import TailraceError
from tailrace.bench.launcher import Broker
from tailrace.bench.audit import REC, Produced, records

EXIT_OK, EXIT_LOST, EXIT_SETUP = 0, 1, 2
LEVELS = ("none", "memory", "durable")
VICTIMS = ("flusher", "router", "worker-0", "worker-1", "all")


@dataclass
class Tail:
    read: int = 0
    violations: list = field(default_factory=list)  # (topic, partition, expected offset, got)


@dataclass
class Tally:
    sent: int = 0
    acked: int = 0
    found: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    unacked_missing: int = 0


def produce_paced(bootstrap: str, topic: str, partitions: int, acks: str, rate: float, stop: threading.Event,
                  out: Produced, seed: int) -> None:
    """As workload.produce_until, paced to ``rate`` records/s so a long soak stays auditable."""
    out.sent = dict.fromkeys(range(partitions), 0)
    out.acked = dict.fromkeys(range(partitions), 0)

    def on_ack(_t, p, _base, n):
        out.acked[p] += n

    prod = Producer(bootstrap, acks=acks, on_ack=on_ack, request_timeout_ms=1500, delivery_timeout_ms=90_000,
                    retry_backoff_ms=20)
    rng = random.Random(seed)
    t0 = time.monotonic()
    try:
        while not stop.is_set():
            ahead_s = sum(out.sent.values()) / rate - (time.monotonic() - t0)
            if ahead_s > 0:
                prod.poll(int(min(ahead_s, 0.05) * 1000) + 1)
                continue
            p = rng.randrange(partitions)
            n = rng.randint(1, 200)
            values, offsets = records(p, out.sent[p], n)
            prod.send_buffers(topic, values, offsets, partition=p)
            out.sent[p] += n
            while prod.in_flight >= partitions:
                prod.poll(20)
        prod.flush(120_000)
    except TailraceError as exc:
        out.errors.append(exc)
    finally:
        prod.pool.close()


def tail(bootstrap: str, topics: list[str], stop: threading.Event, out: Tail) -> None:
    """A consumer following every topic: offsets must arrive dense, never repeated, never skipped."""
    seen: dict[tuple[str, int], int] = {}
    with Consumer(bootstrap, max_wait_ms=100, request_timeout_ms=1000) as cons:
        for t in topics:
            cons.assign(t, start="earliest")
        while not stop.is_set():
            try:
                chunks = cons.poll_columns(200)
            except TailraceError as exc:
                out.violations.append(("poll", -1, -1, repr(exc)))
                continue
            for t, p, cols in chunks:
                want = seen.get((t, p), 0)
                if int(cols.offsets[0]) != want:
                    out.violations.append((t, p, want, int(cols.offsets[0])))
                seen[(t, p)] = int(cols.offsets[-1]) + 1
                out.read += len(cols)


def audit_stream(bootstrap: str, topic: str, produced: Produced, check_content: bool) -> Tally:
    """Read every partition from offset 0 in chunks and compare with the sequence sent."""
    tally = Tally(sent=sum(produced.sent.values()), acked=sum(produced.acked.values()))
    with Consumer(bootstrap, max_wait_ms=100) as cons:
        ends = {po.partition: po.high_watermark for po in cons.list_offsets(topic)}
        cons.assign(topic, start="earliest")
        nxt = dict.fromkeys(ends, 0)  # next sequence expected
        got = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 600
        while any(got[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for _t, p, cols in cons.poll_columns(500):
                got[p] += len(cols)
                vals = cols.values.reshape(-1, REC)
                seqs = vals[:, 4:12].copy().view(np.uint64)[:, 0].astype(np.int64)
                parts = vals[:, 0:4].copy().view(np.uint32)[:, 0]
                tally.out_of_order += int(np.count_nonzero(parts != p))
                prev = np.concatenate(([nxt[p] - 1], seqs[:-1]))
                tally.duplicated += int(np.count_nonzero(seqs <= prev))
                if check_content:  # acknowledged in order: exactly the next records, byte for byte
                    expect, _ = records(p, nxt[p], len(seqs))
                    if not np.array_equal(cols.values, expect):
                        tally.out_of_order += int(np.count_nonzero(seqs != np.arange(nxt[p], nxt[p] + len(seqs))))
                else:  # acks=none: records may be missing, never repeated or reordered
                    tally.unacked_missing += int(np.sum(np.maximum(seqs - prev - 1, 0)))
                nxt[p] = max(nxt[p], int(seqs.max()) + 1)
    tally.found = sum(got.values())
    if check_content:
        tally.lost = sum(max(0, produced.acked[p] - nxt[p]) for p in ends)
    else:
        tally.unacked_missing += sum(max(0, produced.sent[p] - nxt[p]) for p in ends)
    return tally


def kill(broker: Broker, victim: str) -> dict:
    old = broker.pids()
    targets = list(old.values()) if victim == "all" else [old[victim]]
    for pid in targets:
        os.kill(pid, signal.SIGKILL)
    return old


def wait_restarted(broker: Broker, old: dict, victim: str, timeout_s: float = 60) -> float:
    t0 = time.monotonic()
    names = list(old) if victim == "all" else [victim]
    while time.monotonic() - t0 < timeout_s:
        now = broker.pids()
        if all(n in now and now[n] != old[n] for n in names) and len(now) == len(old):
            broker.wait_ready(timeout_s)
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError(f"{victim} not restarted by supervisord within {timeout_s}s")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.soak", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to produce and kill")
    ap.add_argument("--rate", type=float, default=5000, help="records/s per ack level")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    ap.add_argument("--kill-every", default="2,6", help="seconds between kills: MIN,MAX (uniform)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", help="keep the broker's data here (default: a temporary dir, removed)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kill_min, kill_max = (float(x) for x in args.kill_every.split(","))
    rng = random.Random(args.seed)
    tmp = None if args.data_dir else tempfile.mkdtemp(prefix="tailrace-soak-")
    broker = Broker(Path(args.data_dir or tmp) / "broker", workers=2, segment_bytes=8 << 20, ring_bytes=1 << 20,
                    max_batch_bytes=256 * 1024, shm_budget_bytes=512 << 20)
    topics = {level: f"soak-{level}" for level in LEVELS}
    stop, tail_stop = threading.Event(), threading.Event()
    produced = {level: Produced() for level in LEVELS}
    tail_out = Tail()
    kills: dict[str, int] = dict.fromkeys(VICTIMS, 0)
    restart_s: list[float] = []
    try:
        try:
            broker.start()
            with Admin(broker.bootstrap) as admin:
                for t in topics.values():
                    admin.create_topic(t, args.partitions)
        except Exception as exc:
            print(f"soak: broker setup failed: {exc}", file=sys.stderr)
            return EXIT_SETUP
        threads = [threading.Thread(target=produce_paced, name=f"produce-{level}", args=(
            broker.bootstrap, topics[level], args.partitions, level, args.rate, stop, produced[level], args.seed + i))
            for i, level in enumerate(LEVELS)]
        tailer = threading.Thread(target=tail, name="tail", args=(broker.bootstrap, list(topics.values()), tail_stop, tail_out))
        for th in [*threads, tailer]:
            th.start()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        last_report = t0
        try:
            while time.monotonic() < end:
                time.sleep(min(rng.uniform(kill_min, kill_max), max(0.0, end - time.monotonic())))
                if time.monotonic() >= end:
                    break
                victim = rng.choice(VICTIMS)
                old = kill(broker, victim)
                kills[victim] += 1
                restart_s.append(wait_restarted(broker, old, victim))
                if time.monotonic() - last_report > 30:
                    last_report = time.monotonic()
                    acked = {lv: sum(produced[lv].acked.values()) for lv in LEVELS}
                    print(f"soak: {time.monotonic() - t0:.0f} s, {sum(kills.values())} kills, acked {acked}, "
                          f"tail read {tail_out.read}", file=sys.stderr, flush=True)
        except RuntimeError as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return EXIT_SETUP
        finally:
            stop.set()
            for th in threads:
                th.join(300)
            time.sleep(1.0)
            tail_stop.set()
            tailer.join(60)
        ran_s = time.monotonic() - t0
        tallies = {level: audit_stream(broker.bootstrap, topics[level], produced[level], level != "none") for level in LEVELS}
    finally:
        broker.stop()
        broker.cleanup_shm()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"soak: {ran_s:.0f} s of load, {sum(kills.values())} kill -9 ("
          + ", ".join(f"{v} {n}" for v, n in kills.items())
          + f"), restart to ready p50 {np.median(restart_s) if restart_s else 0:.2f} s max {max(restart_s, default=0):.2f} s; "
          f"rate {args.rate:.0f} records/s per level, {args.partitions} partitions per topic")
    print(f"{'acks':8} {'sent':>10} {'acknowledged':>13} {'found':>10} {'lost':>6} {'duplicated':>11} "
          f"{'out_of_order':>13} {'unacked_missing':>16}")
    for level, t in tallies.items():
        print(f"{level:8} {t.sent:>10} {t.acked:>13} {t.found:>10} {t.lost:>6} {t.duplicated:>11} "
              f"{t.out_of_order:>13} {t.unacked_missing:>16}")
    errors = {lv: produced[lv].errors for lv in LEVELS if produced[lv].errors}
    print(f"tailing consumer: read {tail_out.read} records, {len(tail_out.violations)} gaps or repeats"
          + (f" (first {tail_out.violations[:3]})" if tail_out.violations else "")
          + (f"; producer errors {errors}" if errors else ""))
    bad = any(t.lost or t.duplicated or t.out_of_order for t in tallies.values()) or errors or tail_out.violations
    print("RESULT: " + ("FAIL" if bad else "OK: nothing acknowledged lost, nothing duplicated or out of order"))
    return EXIT_LOST if bad else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
