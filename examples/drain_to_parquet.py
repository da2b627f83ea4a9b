"""Drain a tailrace topic to parquet with Spark, then count what landed.

    python examples/drain_to_parquet.py --bootstrap tcp://127.0.0.1:7420 --topic events --out ./events-parquet

Runs a streaming query with ``trigger(availableNow=True)``: it reads everything in the topic at
start, writes it as parquet, and stops. Its checkpoint (``--checkpoint``, by default beside the
output) remembers where it stopped, so running it again later drains only what arrived since:
every message lands in the parquet output exactly once (docs/SPARK.md, "Delivery guarantees").

Needs Java 17+ and the ``spark`` extra (``pip install -e '.[spark]'``).
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="tcp://127.0.0.1:7420")
    ap.add_argument("--topic", default="events", help="a topic, or a comma-separated list")
    ap.add_argument("--out", default="events-parquet", help="parquet output directory")
    ap.add_argument("--checkpoint", help="streaming checkpoint directory (default: <out>/_checkpoint)")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=2_000_000, help="records per micro-batch")
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()
    checkpoint = args.checkpoint or f"{args.out.rstrip('/')}/_checkpoint"

    from pyspark.sql import SparkSession

    from tailrace.spark_bridge import TailraceDataSource

    spark = SparkSession.builder.master(args.master).appName("tailrace-drain-to-parquet").getOrCreate()
    spark.dataSource.register(TailraceDataSource)

    stream = (
        spark.readStream.format("tailrace")
        .option("bootstrap", args.bootstrap)
        .option("topic", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
        .load()
    )
    query = (
        stream.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    drained = sum(p["numInputRows"] for p in query.recentProgress)

    table = spark.read.parquet(args.out)
    total = table.count()
    print(f"drained {drained:,} new records from {args.topic}; {args.out} now holds {total:,}")
    table.groupBy("topic", "partition").count().orderBy("topic", "partition").show(truncate=False)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
