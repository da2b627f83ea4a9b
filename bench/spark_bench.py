"""Spark bridge throughput: drain a topic into count() and into parquet, against a ceiling.

The ceiling is ``tailrace_memory``, a data source that yields the very Arrow batches the bridge
yields (same row count per batch, same ``to_record_batch``) from one batch of columns built once
per Python worker and reused with fresh offsets: Spark's own cost with the broker taken out. The broker path should reach >= 0.8x of it.
The writer drains the ceiling source's value column into a fresh topic (round-robin over its
partitions) with the chosen acks; its ceiling is ``tailrace_discard``, a Python sink that drops
the Arrow batches Spark hands it, and "no Spark" runs the same sink code on the same Arrow
batches from this process alone.

    python bench/spark_bench.py --messages-per-partition 1000000 --repeats 3

Starts its own broker (bench/launcher.py) on a temporary directory unless --bootstrap is given,
and needs Java 17+. Prints one line per run and a median summary per scenario.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyspark.sql.datasource import (
    DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage,
)

from tailrace import Admin, Producer
from tailrace.client.records import Columns
from tailrace.spark_bridge.arrow import SCHEMA, to_record_batch

MEMORY_NAME = "tailrace_memory"
DISCARD_NAME = "tailrace_discard"
PRODUCE_BATCH = 8000  # records per produce request: 8000 x 100 B stays under the 1 MiB limit


def payload(partition: int, start: int, count: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` distinct values of ``size`` bytes: (uint8 buffer, int32 offsets from 0)."""
    seq = np.arange(start, start + count, dtype=np.int64)
    vals = np.zeros((count, size), dtype=np.uint8)
    vals[:, 0] = partition
    vals[:, 1:9] = seq.view(np.uint8).reshape(count, 8)
    vals[:, 9:] = ((seq[:, None] * 31 + np.arange(size - 9)) % 251).astype(np.uint8)
    return vals.reshape(-1), np.arange(count + 1, dtype=np.int32) * size


def memory_columns(partition: int, start: int, count: int, size: int) -> Columns:
    values, offsets = payload(partition, start, count, size)
    return Columns(
        offsets=np.arange(start, start + count, dtype=np.int64),
        timestamps_us=np.full(count, time.time_ns() // 1000, dtype=np.int64),
        value_offsets=offsets, values=values,
        key_offsets=np.zeros(count + 1, dtype=np.int32), keys=np.zeros(0, np.uint8),
        key_valid=np.zeros(count, dtype=bool),
    )


_CACHE: dict[tuple, Columns] = {}  # per Python worker: (partition, rows, size) -> one batch's columns


class MemoryReader(DataSourceReader):
    def __init__(self, partitions: int, per_partition: int, size: int, rows_per_batch: int):
        self.partitions_n, self.per_partition, self.size, self.rows = partitions, per_partition, size, rows_per_batch

    def partitions(self):
        return [InputPartition(p) for p in range(self.partitions_n)]

    def read(self, partition):
        p = partition.value
        key = (p, self.rows, self.size)
        if key not in _CACHE:
            _CACHE[key] = memory_columns(p, 0, self.rows, self.size)
        template = _CACHE[key]
        for start in range(0, self.per_partition, self.rows):
            n = min(self.rows, self.per_partition - start)
            cols = template if n == self.rows else memory_columns(p, start, n, self.size)
            yield to_record_batch("memory", p, dataclasses.replace(cols, offsets=np.arange(start, start + n, dtype=np.int64)))


class MemorySource(DataSource):
    """The ceiling: the bridge's Arrow batches without the broker."""

    @classmethod
    def name(cls):
        return MEMORY_NAME

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        o = self.options
        return MemoryReader(int(o["partitions"]), int(o["perPartition"]), int(o["size"]), int(o["rowsPerBatch"]))


class DiscardWriter(DataSourceArrowWriter):
    def write(self, iterator):
        for _batch in iterator:
            pass
        return WriterCommitMessage()


class DiscardSink(DataSource):
    """The writer's ceiling: Spark hands a Python sink the same Arrow batches, which it drops."""

    @classmethod
    def name(cls):
        return DISCARD_NAME

    def writer(self, schema, overwrite):
        return DiscardWriter()


def sink_in_process(bootstrap: str, topic: str, partitions: int, per_partition: int, size: int, arrow_rows: int) -> int:
    """tailrace.spark_bridge.sink without Spark: the same Arrow batches, produced from this process."""
    import pyarrow as pa

    from tailrace.spark_bridge.options import parse_write_options
    from tailrace.spark_bridge.sink import produce as sink_produce

    values, offsets = payload(0, 0, arrow_rows, size)
    value = pa.Array.from_buffers(pa.binary(), arrow_rows, [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    batch = pa.RecordBatch.from_arrays([value], names=["value"])
    batches = (batch for _ in range(partitions * per_partition // arrow_rows))
    return sink_produce(batches, parse_write_options({"bootstrap": bootstrap, "topic": topic})).records


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, size: int) -> float:
    t0 = time.monotonic()
    with Producer(bootstrap, acks="memory") as prod:
        for first in range(0, per_partition, PRODUCE_BATCH):
            n = min(PRODUCE_BATCH, per_partition - first)
            for p in range(partitions):
                values, offsets = payload(p, first, n, size)
                prod.send_buffers(topic, values, offsets, partition=p)
        prod.flush()
    return partitions * per_partition / (time.monotonic() - t0)


def wait_durable(bootstrap: str, topic: str, per_partition: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while any(po.durable_watermark < per_partition for po in admin.list_offsets(topic)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} not durable after {timeout_s}s")
            time.sleep(0.1)


def tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by ``root`` and every process under it, reaped children included
    (Linux /proc): the JVM, Spark's Python workers and planners, and the broker's processes."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    total = 0.0
    for pid, cpu in used.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += cpu
    return total


def timed(label: str, total: int, fn, results: dict, cpu: dict) -> None:
    """Run ``fn``; record rows per wall second and rows per CPU second of the whole tree. On a
    shared, busy machine the second is the steadier measure of what each path costs."""
    c0, t0 = tree_cpu_s(os.getpid()), time.monotonic()
    got = fn()
    dt, dc = time.monotonic() - t0, tree_cpu_s(os.getpid()) - c0
    if got is not None and got != total:
        raise RuntimeError(f"{label}: expected {total} rows, got {got}")
    results.setdefault(label, []).append(total / dt)
    cpu.setdefault(label, []).append(total / dc)
    print(f"  {label:<30} {total / dt:>12,.0f} rows/s  ({dt:6.2f} s)  {total / dc:>12,.0f} rows/cpu-s  (load {os.getloadavg()[0]:.1f})",
          flush=True)


def run(args) -> dict:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from tailrace.spark_bridge import TailraceDataSource

    # Registered through its module name (not __main__) so workers import it and keep _CACHE.
    import tailrace.bench.spark_bench as this

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, from the JVM's first lookup on
    spark = (
        SparkSession.builder.master(args.master).appName("tailrace-spark-bench")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch_rows))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TailraceDataSource)
    spark.dataSource.register(this.MemorySource)
    spark.dataSource.register(this.DiscardSink)
    parts, n, size = args.partitions, args.messages_per_partition, args.message_bytes
    total = parts * n
    rows_per_batch = args.fetch_max_bytes // (size + 8)  # what one fetch of fetchMaxBytes returns, about
    out = Path(tempfile.mkdtemp(prefix="tailrace-bench-"))
    results: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def broker_df():
        return (spark.read.format("tailrace").option("bootstrap", args.bootstrap).option("topic", args.topic)
                .option("fetchMaxBytes", args.fetch_max_bytes).load())

    def memory_df():
        return (spark.read.format(MEMORY_NAME).option("partitions", parts).option("perPartition", n)
                .option("size", size).option("rowsPerBatch", rows_per_batch).load())

    memory_df().count()  # fill every worker's cache, start the Python workers
    broker_df().count()  # warm the page cache and the workers' imports
    memory_df().write.mode("overwrite").parquet(str(out / "warm"))  # and the parquet writer
    for i in range(args.repeats):
        print(f"run {i + 1}/{args.repeats}", flush=True)
        timed("memory -> count", total, lambda: memory_df().count(), results, cpu)
        timed("broker -> count", total, lambda: broker_df().count(), results, cpu)
        timed("memory -> parquet", total, lambda: memory_df().write.mode("overwrite").parquet(str(out / "m")), results, cpu)
        timed("broker -> parquet", total, lambda: broker_df().write.mode("overwrite").parquet(str(out / "b")), results, cpu)
        if not args.skip_write:
            sink = f"{args.topic}-sink-{i}"
            Admin(args.bootstrap).create_topic(sink, parts)
            timed("memory -> discard", total, lambda: memory_df().select("value").write.format(DISCARD_NAME)
                  .mode("append").save(), results, cpu)
            timed("memory -> tailrace", total, lambda: memory_df().select("value").write.format("tailrace")
                  .option("bootstrap", args.bootstrap).option("topic", sink).option("acks", args.acks)
                  .mode("append").save(), results, cpu)
            Admin(args.bootstrap).create_topic(sink + "-direct", parts)
            rows = total - total % args.arrow_batch_rows
            timed("arrow -> tailrace (no Spark)", rows, lambda: sink_in_process(
                args.bootstrap, sink + "-direct", parts, n, size, args.arrow_batch_rows), results, cpu)
    spark.stop()
    shutil.rmtree(out, ignore_errors=True)
    return results, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--messages-per-partition", type=int, default=1_000_000)
    ap.add_argument("--message-bytes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fetch-max-bytes", type=int, default=16 << 20)
    ap.add_argument("--acks", default="durable", choices=["none", "memory", "durable"])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--arrow-batch-rows", type=int, default=10_000,
                    help="spark.sql.execution.arrow.maxRecordsPerBatch: rows per batch Spark hands the writer")
    ap.add_argument("--bootstrap", help="use this running broker instead of starting one")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--skip-write", action="store_true")
    args = ap.parse_args()

    broker = None
    if args.bootstrap is None:
        from tailrace.bench.launcher import Broker

        per_topic = args.partitions * (8 << 20)
        broker = Broker(Path(tempfile.mkdtemp(prefix="tailrace-bench-broker-")), workers=2,
                        shm_budget_bytes=max(1 << 30, per_topic * (2 * args.repeats + 2)))
        broker.start()
        args.bootstrap = broker.bootstrap
    try:
        Admin(args.bootstrap).create_topic(args.topic, args.partitions)
        rate = produce(args.bootstrap, args.topic, args.partitions, args.messages_per_partition, args.message_bytes)
        wait_durable(args.bootstrap, args.topic, args.messages_per_partition)
        print(f"produced {args.partitions} x {args.messages_per_partition:,} x {args.message_bytes} B at {rate:,.0f} msg/s")
        results, cpu = run(args)
    finally:
        if broker is not None:
            broker.stop()
            broker.cleanup_shm()
            shutil.rmtree(broker.data_dir, ignore_errors=True)
    print(f"\nmedian of {args.repeats}: {args.partitions} partitions x {args.messages_per_partition:,} x {args.message_bytes} B")
    med = {k: statistics.median(v) for k, v in results.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    for k in med:
        print(f"  {k:<30} {med[k]:>12,.0f} rows/s  {med_cpu[k]:>12,.0f} rows/cpu-s")
    pairs = [("count", "broker -> count", "memory -> count"), ("parquet", "broker -> parquet", "memory -> parquet"),
             ("write", "memory -> tailrace", "memory -> discard")]
    for name, path, ceiling in pairs:
        if path in med:
            print(f"  {name}: path/ceiling {med[path] / med[ceiling]:.2f}x wall, {med_cpu[path] / med_cpu[ceiling]:.2f}x cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
