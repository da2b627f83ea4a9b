"""Consumer groups (docs/BENCHMARKS.md, "Consumer groups"; issue 19's figures):

    python -m tailrace.bench.probes.groups --repeat 3

- **commits/s**: one member committing in a loop (each commit durable before it returns), and
  ``--members`` members (one partition each, one thread each) committing at once;
- **join to consumed**: ``--join-members`` members reading a ``--join-partitions``-partition
  topic under produce load; one more joins: the time until every partition has delivered a record
  again after the join, and until the joiner holds its share; and from nothing, the time from
  ``--join-members`` members starting until every partition has delivered a record;
- **consume in a group of one against a plain assigned consumer** (issue 19's target: at least
  0.95x): ``--records`` records pre-produced, read whole by ``poll_columns``, alternating which
  goes first; medians and the ratio per round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.bench.launcher import Broker


def commit_rate(b: Broker, members: int, seconds: float) -> float:
    topic = f"c{members}"
    with Admin(b.bootstrap) as a:
        a.create_topic(topic, members)
    consumers = [Consumer(b.bootstrap, group=f"g{members}", auto_commit=False, heartbeat_interval_ms=1000, max_wait_ms=10)
                 for _ in range(members)]
    for c in consumers:
        c.subscribe([topic])
    deadline = time.monotonic() + 60
    while sum(len(c.assigned) for c in consumers) < members or any(not c.assigned for c in consumers):
        for c in consumers:
            c.poll(0)
        if time.monotonic() > deadline:
            raise RuntimeError("the group did not settle")
    counts = [0] * members
    stop = threading.Event()

    def run(i: int) -> None:
        c = consumers[i]
        (tp,) = list(c.assigned)
        n = 0
        while not stop.is_set():
            n += 1
            c.commit({tp: n})
        counts[i] = n

    threads = [threading.Thread(target=run, args=(i,)) for i in range(members)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    rate = sum(counts) / (time.perf_counter() - t0)
    for c in consumers:
        c.close()
    return rate


def _load(b: Broker, topic: str, partitions: int, stop: threading.Event) -> None:
    with Producer(b.bootstrap, acks="memory", linger_ms=2) as p:
        while not stop.is_set():
            for part in range(partitions):
                p.send(topic, b"x", partition=part)
            p.poll(1)
            time.sleep(0.005)  # every partition gets a record every ~5 ms
        p.flush(30_000)


def join_times(b: Broker, members: int, partitions: int, run: int) -> tuple[float, float, float]:
    """(from nothing to every member holding its share and every partition consumed since, a
    join to all consumed again, a join to the joiner holding its share)."""
    topic = f"j{run}"
    with Admin(b.bootstrap) as a:
        a.create_topic(topic, partitions)
    stop = threading.Event()
    load = threading.Thread(target=_load, args=(b, topic, partitions, stop))
    load.start()
    last: dict[int, float] = {}
    lock = threading.Lock()

    def member(c: Consumer, halt: threading.Event) -> None:
        while not halt.is_set():
            for r in c.poll(50):
                with lock:
                    last[r.partition] = time.monotonic()

    def start(n: int) -> list[tuple[Consumer, threading.Event, threading.Thread]]:
        out = []
        for _ in range(n):
            c = Consumer(b.bootstrap, group=f"join{run}", max_wait_ms=50)
            c.subscribe([topic])
            halt = threading.Event()
            t = threading.Thread(target=member, args=(c, halt))
            t.start()
            out.append((c, halt, t))
        return out

    def all_since(t0: float) -> bool:
        with lock:
            return len(last) == partitions and all(v > t0 for v in last.values())

    t0 = time.monotonic()
    running = start(members)
    share = partitions // members
    while not all(len(c.assigned) >= share for c, _h, _t in running):  # the group settled
        time.sleep(0.005)
    settled = time.monotonic()
    while not all_since(settled):
        time.sleep(0.005)
    cold = time.monotonic() - t0
    time.sleep(1.0)
    t1 = time.monotonic()
    running += start(1)
    joiner = running[-1][0]
    share = partitions // (members + 1)
    held_at = None
    while not all_since(t1) or held_at is None:
        if held_at is None and len(joiner.assigned) >= share:
            held_at = time.monotonic()
        time.sleep(0.005)
    again = time.monotonic() - t1
    for c, halt, t in running:
        halt.set()
        t.join()
        c.close()
    stop.set()
    load.join()
    return cold, again, held_at - t1


def consume_rate(b: Broker, topic: str, records: int, group: str | None) -> float:
    kw = {"group": group, "auto_offset_reset": "earliest"} if group else {}
    with Consumer(b.bootstrap, max_wait_ms=100, **kw) as c:
        if group:
            c.subscribe([topic])
        else:
            c.assign(topic, start="earliest")
        n, t0 = 0, time.perf_counter()
        while n < records:
            n += sum(len(cols) for _t, _p, cols in c.poll_columns(200))
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.groups")
    ap.add_argument("--seconds", type=float, default=5.0, help="per commit-rate measurement")
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--join-members", type=int, default=10)
    ap.add_argument("--join-partitions", type=int, default=100)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--parts", default="commits,join,consume", help="which measurements, comma-separated")
    o = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, Broker(Path(d) / "b", workers=2) as b:
        if "commits" in o.parts:
            one, many = commit_rate(b, 1, o.seconds), commit_rate(b, o.members, o.seconds)
            print(f"commits/s: one member {one:,.0f}; {o.members} members at once {many:,.0f}")
        if "join" in o.parts:
            joins = [join_times(b, o.join_members, o.join_partitions, r) for r in range(o.repeat)]
            for cold, again, held in joins:
                print(f"{o.join_members} members, {o.join_partitions} partitions: settled and all consumed {cold:.2f} s after "
                      f"start; a join: all consumed again {again:.2f} s, the joiner holds its share {held:.2f} s")
            print(f"join medians: cold {statistics.median(j[0] for j in joins):.2f} s, again "
                  f"{statistics.median(j[1] for j in joins):.2f} s, joiner {statistics.median(j[2] for j in joins):.2f} s")
        if "consume" not in o.parts:
            return
        with Admin(b.bootstrap) as a:
            a.create_topic("rate", 4)
        with Producer(b.bootstrap, acks="memory", linger_ms=5) as p:
            batch = [b"v" * 100] * 1000
            for i in range(o.records // 1000):
                p.send_batch("rate", batch, partition=i % 4)
            p.flush(300_000)
        ratios, plain_r, group_r = [], [], []
        for r in range(o.repeat):
            order = [None, f"rate{r}"] if r % 2 == 0 else [f"rate{r}", None]
            got = {}
            for g in order:
                got[g is None] = consume_rate(b, "rate", o.records, g)
            plain_r.append(got[True])
            group_r.append(got[False])
            ratios.append(got[False] / got[True])
            print(f"round {r}: plain {got[True]:,.0f} rec/s, group of one {got[False]:,.0f} rec/s, ratio {ratios[-1]:.3f}")
        print(f"consume medians: plain {statistics.median(plain_r):,.0f} rec/s, group {statistics.median(group_r):,.0f} rec/s, "
              f"ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
