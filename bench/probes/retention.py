"""Produce throughput while retention deletes segments, against the same produce without
(docs/BENCHMARKS.md, "Retention"; issue 18's target: at least 0.9x, same run).

    python -m tailrace.bench.probes.retention --repeat 3

One broker, 2 workers, ``--segment-mib`` segments, one topic of ``--partitions`` partitions
whose ``retention.bytes`` is switched between -1 ("kept": nothing is deleted) and ``--keep-mib``
per partition ("trimmed": once the partitions are at the limit, every new segment deletes an old
one). Each run produces ``--mib`` MiB of ``--size``-byte records in batches of ``--batch``
(acks=memory, straight to the workers) in each mode, alternating which goes first; in "trimmed"
the backlog is trimmed and the partitions filled to the limit before timing. Reported: MB/s
medians and trimmed/kept per run, with the segments deleted while timing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from tailrace import Admin, Producer
from tailrace.bench.launcher import Broker


def _produce(b: Broker, topic: str, o, batch: list[bytes], mib: float) -> float:
    n = int(mib * (1 << 20)) // (o.size * o.batch)
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        t0 = time.perf_counter()
        for i in range(n):
            p.send_batch(topic, batch, partition=i % o.partitions)
        p.flush(300_000)
        dt = time.perf_counter() - t0
    return n * o.batch * o.size / dt / 1e6


def _deleted(b: Broker) -> int:
    """Segments retention deleted so far (from the flusher's log lines)."""
    try:
        text = (b.data_dir / "logs" / "flusher.log").read_text()
    except FileNotFoundError:
        return 0
    return sum(int(m.group(1)) for m in re.finditer(r"retention: deleted (\d+) journal segments", text))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.probes.retention")
    ap.add_argument("--mib", type=float, default=512, help="MiB produced per measurement")
    ap.add_argument("--keep-mib", type=int, default=32, help="retention.bytes while trimming, MiB per partition")
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    o = ap.parse_args()
    batch = [os.urandom(o.size)] * o.batch
    runs: dict[str, list[float]] = {"kept": [], "trimmed": []}
    with tempfile.TemporaryDirectory(prefix="tailrace-retention-") as d:
        b = Broker(Path(d) / "broker", workers=2, segment_bytes=o.segment_mib << 20)
        with b:
            with Admin(b.bootstrap) as a:
                a.create_topic("t", o.partitions, config={"retention.ms": -1})
                for r in range(o.repeat):
                    for mode in (("kept", "trimmed") if r % 2 == 0 else ("trimmed", "kept")):
                        keep = -1 if mode == "kept" else o.keep_mib << 20
                        a.alter_configs("t", {"retention.bytes": keep})
                        time.sleep(6)  # the flusher's next periodic pass takes the new setting
                        if mode == "trimmed":  # at the limit before timing: from here each new segment deletes one
                            _produce(b, "t", o, batch, o.keep_mib * o.partitions)
                        at = _deleted(b)
                        runs[mode].append(_produce(b, "t", o, batch, o.mib))
                        print(f"run {r + 1} {mode}: {runs[mode][-1]:,.0f} MB/s ({_deleted(b) - at} segments deleted meanwhile)",
                              flush=True)

    def med(xs):
        return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}-{max(xs):,.0f}]"

    ratios = [t / k for t, k in zip(runs["trimmed"], runs["kept"])]
    print(f"\n| produce ({o.mib:g} MiB of {o.size} B records in batches of {o.batch}, {o.partitions} partitions, "
          f"{o.segment_mib} MiB segments; median of {o.repeat}) | MB/s |\n|---|---:|")
    print(f"| retention.bytes -1: nothing deleted | {med(runs['kept'])} |")
    print(f"| retention.bytes {o.keep_mib} MiB per partition, at its limit: a segment deleted per segment written | "
          f"{med(runs['trimmed'])} |")
    print(f"| deleting / not, per run | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |")


if __name__ == "__main__":
    main()
