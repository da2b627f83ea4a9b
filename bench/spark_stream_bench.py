"""Spark streaming latency: produce-to-sink time of ``format("tailrace")`` against Spark's rate source.

For each rate, interleaved in one run: Spark's own ``rate`` source (the floor: rows made inside
the JVM, no broker, no producer) and the tailrace source, each through the same sink, a
``foreachBatch`` that writes every micro-batch to parquet, with ``trigger(processingTime=...)``.
A producer process sends 100 B records at the rate, in batches of ``--batch`` to the partitions
in turn, for ``--seconds``. A record's latency is the time its micro-batch's parquet write
returned minus its ``timestamp`` (the producer's create time for tailrace; for the rate source
the time the row was due). Latencies are computed after the query stops, from the parquet files
and the per-batch return times, so measuring adds nothing to a micro-batch.

    python bench/spark_stream_bench.py --rates 10000,100000,300000 --seconds 40 --repeats 3

Per run it prints rows, rows/s (rows sunk over the time the records were produced), latency
p50/p99/max, the median micro-batch duration with its parts (Spark's ``durationMs``), the lag
(offsets behind the latest, from the progress' ``latestOffset`` and ``endOffset``) at the last
micro-batch, and the CPU seconds the broker and the producer used: on a 2-core machine those are
taken from Spark.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from tailrace import Admin, Producer
from tailrace.spark_bridge.offsets import from_json, progress_metrics

MEMORY_STREAM = "tailrace_memory_stream"
PARTS = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


def produce_at_rate(bootstrap: str, topic: str, partitions: int, rate: int, seconds: float, size: int,
                    batch: int, done) -> None:
    """Send ``batch``-record batches to partitions 0, 1, ... in turn, one every ``batch / rate`` s."""
    values = np.frombuffer(bytes(range(256)) * (size * batch // 256 + 1), np.uint8)[: size * batch].copy()
    offsets = np.arange(batch + 1, dtype=np.int32) * size
    n = int(rate * seconds) // batch
    with Producer(bootstrap, acks="memory", linger_ms=0) as prod:
        t0 = time.monotonic()
        for k in range(n):
            wait = t0 + k * batch / rate - time.monotonic()
            if wait > 0:
                prod.poll(int(wait * 1000))
                wait = t0 + k * batch / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            prod.send_buffers(topic, values, offsets, partition=k % partitions)
        prod.flush()
    done.value = n * batch


class MemoryStreamReader(DataSourceStreamReader):
    """The Python-source ceiling: the rows the tailrace source yields (same schema, same
    ``to_record_batch``, same coalescing into tasks), made in the executor at ``rate`` rows/s
    with row i due at start + i / rate (its timestamp, as the rate source's), no broker and no
    producer. Against it, the gap to ``rate`` is Spark's cost of a Python source with these
    rows; the gap from it to tailrace is the broker's and the producer's."""

    def __init__(self, rate: int, partitions: int, size: int):
        self.rate, self.partitions_n, self.size = rate, partitions, size
        self.t0 = time.time()

    def initialOffset(self):
        return {"rows": 0}

    def latestOffset(self, start=None, limit=None):
        return {"rows": int((time.time() - self.t0) * self.rate)}

    def partitions(self, start, end):
        from tailrace.spark_bridge.offsets import OffsetRange, coalesce_ranges
        from tailrace.spark_bridge.options import MIN_RECORDS_PER_PARTITION

        a, b = start["rows"], end["rows"]
        cuts = [a + (b - a) * i // self.partitions_n for i in range(self.partitions_n + 1)]
        ranges = [OffsetRange("memory", p, x, y) for p, (x, y) in enumerate(zip(cuts, cuts[1:])) if y > x]
        return [InputPartition((self.t0, self.rate, self.size, [tuple(r) for r in g]))
                for g in coalesce_ranges(ranges, MIN_RECORDS_PER_PARTITION)]

    def read(self, partition):
        from tailrace.client.records import Columns
        from tailrace.spark_bridge.arrow import to_record_batch

        t0, rate, size, ranges = partition.value
        for _topic, p, x, y in ranges:
            n = y - x
            values = _values(n * size)
            cols = Columns(offsets=np.arange(x, y, dtype=np.int64),
                           timestamps_us=((t0 + np.arange(x, y, dtype=np.float64) / rate) * 1e6).astype(np.int64),
                           value_offsets=np.arange(n + 1, dtype=np.int32) * size, values=values,
                           key_offsets=np.zeros(n + 1, dtype=np.int32), keys=np.zeros(0, np.uint8),
                           key_valid=np.zeros(n, dtype=bool))
            yield to_record_batch("memory", p, cols)


_VALUES: list[np.ndarray] = []  # per Python worker: one value buffer, grown as needed, shared by every batch


def _values(nbytes: int) -> np.ndarray:
    if not _VALUES or len(_VALUES[0]) < nbytes:
        _VALUES[:] = [np.frombuffer(bytes(range(256)) * (nbytes // 256 + 1), np.uint8)]
    return _VALUES[0][:nbytes]


class MemoryStreamSource(DataSource):
    @classmethod
    def name(cls):
        return MEMORY_STREAM

    def schema(self):
        from tailrace.spark_bridge.arrow import SCHEMA

        return SCHEMA

    def streamReader(self, schema):
        o = self.options
        return MemoryStreamReader(int(o["rate"]), int(o["partitions"]), int(o["size"]))


def tree_cpu_s(root: int) -> float:
    from tailrace.bench.spark_bench import tree_cpu_s as cpu

    return cpu(root)


def latencies(out: Path, done_at: dict[int, float], since: float) -> np.ndarray:
    """Seconds from each sunk row's timestamp to its batch's write returning, for the rows
    stamped at or after ``since``."""
    import pyarrow.parquet as pq

    lat = []
    for batch_id, t in done_at.items():
        d = out / f"b{batch_id}"
        if not d.exists():
            continue
        ts = pq.read_table(d, columns=["timestamp"]).column("timestamp")
        us = ts.cast("int64").to_numpy() if str(ts.type).startswith("timestamp[us") else ts.cast("timestamp[us]").cast("int64").to_numpy()
        us = us[us >= since * 1e6]
        lat.append(t - us / 1e6)
    return np.concatenate(lat) if lat else np.zeros(0)


def lag(progress: dict) -> int | None:
    """Records behind the latest after this micro-batch, all partitions together (the source's
    maxOffsetsBehindLatest times the partitions would overstate it): latestOffset - endOffset."""
    src = progress["sources"][0]
    if not progress_metrics(src):
        return None
    end, latest = (from_json(json.loads(x) if isinstance(x, str) else x) for x in (src["endOffset"], src["latestOffset"]))
    return sum(max(0, latest[k] - end.get(k, latest[k])) for k in latest)


def run_one(spark, broker, args, source: str, rate: int, run_no: int, out_root: Path) -> dict:
    out = out_root / f"{source}-{rate}-{run_no}"
    checkpoint = out_root / f"ck-{source}-{rate}-{run_no}"
    done_at: dict[int, float] = {}
    stopping = []  # set once the window is over: later batches are not written, so stop() interrupts no write

    def sink(df, batch_id):
        if stopping:
            return
        df.write.mode("append").parquet(str(out / f"b{batch_id}"))
        done_at[batch_id] = time.time()

    topic = f"lat-{rate}-{run_no}"
    if source == "rate":
        stream = (spark.readStream.format("rate").option("rowsPerSecond", rate)
                  .option("numPartitions", args.rate_partitions).load())
    elif source == "memory":
        stream = (spark.readStream.format(MEMORY_STREAM).option("rate", rate).option("partitions", args.partitions)
                  .option("size", args.message_bytes).load())
    else:
        with Admin(broker.bootstrap) as a:
            a.create_topic(topic, args.partitions)
        r = (spark.readStream.format("tailrace").option("bootstrap", broker.bootstrap).option("topic", topic)
             .option("startingOffsets", "earliest"))
        for kv in args.option:
            k, v = kv.split("=", 1)
            r = r.option(k, v)
        stream = r.load()
    query = (stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=args.trigger).start())
    cpu_broker0 = tree_cpu_s(broker.proc.pid)
    cpu_all0 = tree_cpu_s(os.getpid())
    load0 = os.getloadavg()[0]
    produced = None
    t_start = time.time()
    if source in ("rate", "memory"):
        # These make rows from the query's start: a new query's first batch (a fresh planner
        # process, first imports) is slow and leaves a backlog, so the window opens once the
        # first batch is written and that backlog has had 3 s to drain.
        deadline = time.time() + 120
        while not done_at and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(3)
        t_start = time.time()
        time.sleep(args.seconds)
        cpu_prod = 0.0
    else:
        # Warm the query as the others are warmed: a trickle of records (stamped before the
        # window, so left out) makes its first real batch (first imports and connections in the
        # Python workers) happen before the producer starts.
        with Producer(broker.bootstrap, acks="memory") as warm:
            for part in range(args.partitions):
                warm.send_batch(topic, [b"w" * args.message_bytes] * 10, partition=part)
            warm.flush()
        deadline = time.time() + 120
        while not done_at and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        ctx = multiprocessing.get_context("spawn")
        n = ctx.Value("q", 0)
        p = ctx.Process(target=produce_at_rate, args=(broker.bootstrap, topic, args.partitions, rate, args.seconds,
                                                      args.message_bytes, args.batch, n))
        t_start = time.time()
        p.start()
        p.join()
        produced = n.value
        cpu_prod = _child_cpu_s()
        deadline = time.time() + 60
        while time.time() < deadline:
            sunk = sum(pr["numInputRows"] for pr in query.recentProgress)
            if sunk >= produced + 10 * args.partitions:
                break
            time.sleep(0.5)
    stopping.append(True)
    query.stop()
    cpu_broker = tree_cpu_s(broker.proc.pid) - cpu_broker0
    cpu_all = tree_cpu_s(os.getpid()) - cpu_all0
    progress = [pr for pr in query.recentProgress if pr["numInputRows"] > 0]
    lat = latencies(out, done_at, t_start)
    rows = len(lat)
    span = (max(done_at.values()) - t_start) if done_at else 1.0
    res = {
        "source": source, "rate": rate, "run": run_no, "rows": rows, "produced": produced,
        "batches": len(progress), "rows_per_s": rows / span if span > 0 else 0,
        "p50": float(np.percentile(lat, 50)) if rows else float("nan"),
        "p99": float(np.percentile(lat, 99)) if rows else float("nan"),
        "max": float(lat.max()) if rows else float("nan"),
        "batch_ms": {k: statistics.median(pr["durationMs"].get(k, 0) for pr in progress) if progress else 0 for k in PARTS},
        "rows_per_batch": statistics.median(pr["numInputRows"] for pr in progress) if progress else 0,
        "lag_last": lag(progress[-1]) if progress else None,
        "lag_max": max((lag(pr) or 0) for pr in progress) if progress else None,
        "cpu_broker_s": cpu_broker, "cpu_producer_s": cpu_prod, "cpu_all_s": cpu_all,
        "load": (load0 + os.getloadavg()[0]) / 2,
        "per_batch": [(pr["numInputRows"], pr["durationMs"].get("triggerExecution", 0)) for pr in progress],
    }
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return res


def _child_cpu_s() -> float:
    """CPU seconds of reaped children so far (the producer process, once joined)."""
    t = os.times()
    used = t.children_user + t.children_system
    prev, _child_cpu_s.prev = getattr(_child_cpu_s, "prev", 0.0), used
    return used - prev


def show(r: dict) -> str:
    b = r["batch_ms"]
    parts = " ".join(f"{k}={b[k]:.0f}" for k in PARTS[:-1])
    return (f"  {r['source']:<8} {r['rate']:>7,}/s run {r['run']}: {r['rows']:>10,} rows {r['rows_per_s']:>9,.0f} rows/s "
            f"p50 {r['p50']:5.2f} s p99 {r['p99']:5.2f} s max {r['max']:5.2f} s | {r['batches']:3d} batches "
            f"median {b['triggerExecution']:.0f} ms ({parts}) {r['rows_per_batch']:,.0f} rows/batch | "
            f"lag last {r['lag_last']} max {r['lag_max']} | cpu broker {r['cpu_broker_s']:.1f} s producer "
            f"{r['cpu_producer_s']:.1f} s all {r['cpu_all_s']:.1f} s | load {r['load']:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10000,100000,300000")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--message-bytes", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000, help="records per produce batch")
    ap.add_argument("--trigger", default="1 second")
    ap.add_argument("--rate-partitions", type=int, default=2, help="the rate source's numPartitions")
    ap.add_argument("--sources", default="rate,memory,tailrace",
                    help="rate: Spark's rate source (the floor); memory: the same rows as tailrace from a Python "
                         "source without the broker; tailrace")
    ap.add_argument("--option", action="append", default=[], help="a tailrace read option, name=value (repeatable)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--verbose", action="store_true", help="print each micro-batch's rows and duration")
    ap.add_argument("--json", help="append each run's result as a JSON line to this file")
    args = ap.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from tailrace.bench.launcher import Broker
    from tailrace.spark_bridge import TailraceDataSource

    broker = Broker(Path(tempfile.mkdtemp(prefix="tailrace-stream-bench-")), workers=2, shm_budget_bytes=1 << 30)
    broker.start()
    out_root = Path(tempfile.mkdtemp(prefix="tailrace-stream-out-"))
    spark = (
        SparkSession.builder.master(args.master).appName("tailrace-stream-bench")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.streaming.numRecentProgressUpdates", "2000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TailraceDataSource)
    import tailrace.bench.spark_stream_bench as this  # by module name, so Python workers import it

    spark.dataSource.register(this.MemoryStreamSource)
    results = []
    warm = argparse.Namespace(**{**vars(args), "seconds": 6})
    try:
        spark.range(100_000).write.mode("overwrite").parquet(str(out_root / "warm"))
        for source in args.sources.split(","):  # the JVM's first streaming queries and parquet writes
            print("warm-up:", show(run_one(spark, broker, warm, source, 10_000, 0, out_root)), flush=True)
        for run_no in range(1, args.repeats + 1):
            for rate in (int(x) for x in args.rates.split(",")):
                for source in args.sources.split(","):
                    r = run_one(spark, broker, args, source, rate, run_no, out_root)
                    print(show(r), flush=True)
                    if args.verbose:
                        print("    per batch (rows, ms):", r["per_batch"], flush=True)
                    results.append(r)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(r) + "\n")
    finally:
        spark.stop()
        broker.stop()
        broker.cleanup_shm()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
        shutil.rmtree(out_root, ignore_errors=True)
    print("\nmedians:")
    for rate in (int(x) for x in args.rates.split(",")):
        row = {}
        for source in args.sources.split(","):
            rs = [r for r in results if r["rate"] == rate and r["source"] == source]
            if rs:
                row[source] = {k: statistics.median(r[k] for r in rs) for k in ("rows_per_s", "p50", "p99", "max")}
                row[source]["batch"] = statistics.median(r["batch_ms"]["triggerExecution"] for r in rs)
                m = row[source]
                print(f"  {rate:>7,}/s {source:<8} {m['rows_per_s']:>9,.0f} rows/s p50 {m['p50']:.2f} s "
                      f"p99 {m['p99']:.2f} s max {m['max']:.2f} s micro-batch {m['batch']:.0f} ms")
        for other in ("memory", "tailrace"):
            if "rate" in row and other in row:
                print(f"  {rate:>7,}/s {other} p99 / rate p99 = {row[other]['p99'] / row['rate']['p99']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
