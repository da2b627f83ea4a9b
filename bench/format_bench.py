"""Record format v2 costs, side by side in one run: batched produce and consume of 100-byte
log-like text records uncompressed, with zstd and with lz4, and produced with 3 headers per
record (docs/BENCHMARKS.md "Record format v2").

    python -m tailrace.bench.format_bench [--messages 1000000] [--rounds 3] [--json]

One broker (2 workers, its own temporary data directory), one topic of 8 partitions per variant
and round; the variants run interleaved, round after round, and each figure is the median over
rounds, with each compressed or headed variant also given as a ratio to the uncompressed run of
the same round. Produce: one blocking producer, batches of 1,000 records from the columnar path
(``send_buffers``, no Python step per record), acks memory, timed to the last acknowledgement.
Journal bytes per record: the bytes appended to the partitions' rings (what the flusher writes
to the journal, headers and padding included) over the records. Consume: one consumer of the 8
partitions from the earliest offset, ``poll_columns`` (inflating in the client), timed to the
last record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tailrace import Admin, Consumer, Producer
from tailrace.bench.launcher import Broker
from tailrace.client.sections import HeaderArrays

PARTITIONS = 8
BATCH = 1000
SIZE = 100
VARIANTS = ("none", "zstd", "lz4", "headers3")
EXTRA = ("zstd1", "zstd3", "snappy", "gzip")  # --variants: zstd at levels 1 and 3, the other two codecs


def log_lines(count: int, size: int = SIZE, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """``count`` log-like text records of exactly ``size`` bytes (an access log: time, level,
    service, method, path, status, latency, a request id), back to back, with their offsets.
    Built once from a pool of 4,096 distinct lines, then shuffled."""
    rng = np.random.default_rng(seed)
    levels = ["INFO", "INFO", "INFO", "WARN", "DEBUG", "ERROR"]
    services = ["api", "auth", "billing", "search", "cart", "media"]
    methods = ["GET", "GET", "GET", "POST", "PUT", "DELETE"]
    paths = ["/v1/items", "/v1/users", "/v1/orders", "/v2/search", "/health", "/v1/cart/items"]
    pool = []
    for i in range(4096):
        line = ("2026-11-27T%02d:%02d:%02d.%03dZ %-5s %s %s %s/%d status=%d %dms req=%016x" % (
            rng.integers(0, 24), rng.integers(0, 60), rng.integers(0, 60), rng.integers(0, 1000),
            levels[i % 6], services[rng.integers(0, 6)], methods[rng.integers(0, 6)], paths[rng.integers(0, 6)],
            rng.integers(1, 100000), [200, 200, 200, 201, 404, 500][rng.integers(0, 6)], rng.integers(1, 900),
            int(rng.integers(0, 1 << 62)))).encode()
        pool.append((line + b" " * size)[:size])
    joined = np.frombuffer(b"".join(pool), dtype=np.uint8).reshape(len(pool), size)
    rows = joined[rng.integers(0, len(pool), size=count)]
    return np.ascontiguousarray(rows).ravel(), np.arange(count + 1, dtype=np.int32) * size


def three_headers(n: int) -> HeaderArrays:
    """3 headers per record, as columns (trace id, content type, a retry count)."""
    keys = b"trace-id" + b"content-type" + b"retries"
    klens = np.tile(np.array([8, 12, 7], dtype=np.int32), n)
    key_bytes = np.frombuffer(keys * n, dtype=np.uint8)
    per = np.frombuffer(b"4bf92f3577b34da6" + b"text/plain" + b"0", dtype=np.uint8)
    vlens = np.tile(np.array([16, 10, 1], dtype=np.int32), n)
    offs = lambda lens: np.concatenate(([0], np.cumsum(lens))).astype(np.int32)  # noqa: E731
    return HeaderArrays(np.arange(n + 1, dtype=np.int32) * 3, offs(klens), key_bytes, offs(vlens),
                        np.tile(per, n), np.ones(3 * n, dtype=bool))


def produce(bootstrap: str, topic: str, values, offsets, n: int, variant: str) -> float:
    compression = variant.rstrip("13") if variant not in ("none", "headers3") else None
    level = int(variant[-1]) if variant in ("zstd1", "zstd3") else None
    headers = three_headers(BATCH) if variant == "headers3" else None
    step = BATCH * SIZE
    batches = n // BATCH
    with Producer(bootstrap, acks="memory", compression=compression, compression_level=level, linger_ms=0,
                  max_in_flight_per_partition=4) as p:
        t0 = time.perf_counter()
        for i in range(batches):
            a = (i * step) % (len(values) - step + 1)
            p.send_buffers(topic, values[a : a + step], offsets[: BATCH + 1], partition=i % PARTITIONS, headers=headers)
        p.flush()
        return batches * BATCH / (time.perf_counter() - t0)


def consume(bootstrap: str, topic: str, n: int) -> float:
    """msg/s from the earliest offset to the last of ``n`` records; every record must come."""
    with Consumer(bootstrap, max_wait_ms=100, max_bytes=4 << 20) as c:
        c.assign(topic, start="earliest")
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 120
        while got < n and time.perf_counter() < deadline:
            got += sum(len(cols) for _t, _p, cols in c.poll_columns(200))
        took = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"consume of {topic}: {got} records of {n}")
    return n / took


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, 'none' first: of {', '.join(VARIANTS + EXTRA)}")
    ap.add_argument("--data-root", default=None, help="where the broker's temporary data directory goes "
                    "(default: the system's temporary folder; /dev/shm takes the disk out of the measurement)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    variants = tuple(args.variants.split(","))
    assert variants[0] == "none" and set(variants) <= set(VARIANTS + EXTRA), variants
    n = args.messages // BATCH * BATCH
    values, offsets = log_lines(min(n, 200_000))
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(dir=args.data_root) as tmp:
        b = Broker(Path(tmp) / "data", workers=2, segment_bytes=64 << 20)
        b.start()
        try:
            with Admin(b.bootstrap) as a:
                for r in range(args.rounds):
                    for v in variants:
                        a.create_topic(f"fmt-{v}-{r}", PARTITIONS)
            for r in range(args.rounds):
                for v in variants:
                    topic = f"fmt-{v}-{r}"
                    rate = produce(b.bootstrap, topic, values, offsets, n, v)
                    with Admin(b.bootstrap) as a:
                        appended = sum(o.appended_bytes for o in a.list_offsets(topic))
                    runs[v].append({"produce": rate, "bytes_per_record": appended / n,
                                    "consume": consume(b.bootstrap, topic, n)})
                    with Admin(b.bootstrap) as a:
                        a.delete_topic(topic)
        finally:
            b.stop()
            b.cleanup_shm()
    out = {"messages": n, "rounds": args.rounds, "variants": {}}
    for v in variants:
        med = {k: statistics.median(x[k] for x in runs[v]) for k in ("produce", "bytes_per_record", "consume")}
        ratio = {k: statistics.median(x[k] / y[k] for x, y in zip(runs[v], runs["none"]))
                 for k in ("produce", "bytes_per_record", "consume")}
        out["variants"][v] = {"median": med, "ratio_to_none": ratio, "runs": runs[v]}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{n:,} records of {SIZE} B log-like text, {PARTITIONS} partitions, {args.rounds} rounds (medians)")
        print(f"{'variant':<10} {'produce msg/s':>14} {'x none':>7} {'journal B/rec':>14} {'x none':>7} {'consume msg/s':>14} {'x none':>7}")
        for v in variants:
            m, q = out["variants"][v]["median"], out["variants"][v]["ratio_to_none"]
            print(f"{v:<10} {m['produce']:>14,.0f} {q['produce']:>7.2f} {m['bytes_per_record']:>14.1f} "
                  f"{q['bytes_per_record']:>7.3f} {m['consume']:>14,.0f} {q['consume']:>7.2f}")
    return out


if __name__ == "__main__":
    main()
