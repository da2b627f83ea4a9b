"""The ``tailrace`` Spark data source: batch reads, streaming reads and writes of topics.

Where each piece runs (Spark's Python data source protocol):

- ``TailraceDataSource`` and the readers' planning methods (``partitions()``, and every
  ``DataSourceStreamReader`` method but ``read``) run in a Python process beside the driver. The
  stream reader there lives as long as the query; it keeps one ``Admin`` connection.
- ``read(partition)`` runs in executors' Python workers, on a *copy* of the reader that Spark
  pickled after planning: it must not rely on state from the planning side beyond the options,
  and opens its own connection (spark_bridge/fetch.py).
- The writers (spark_bridge/sink.py) are pickled the same way; ``write`` runs on executors,
  ``commit``/``abort`` on the driver.

Offsets are planned once, on the driver, and carried to executors in ``RangePartition``s: a
task reads exactly its ``[start, end)``, so a retried task, a re-run stage or a restarted
streaming query reads the same records.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tailrace.client.admin import Admin
from tailrace.client.errors import TailraceError
from tailrace.client.protocol import PartitionOffsets

from .arrow import schema as source_schema, to_record_batch
from .errors import OptionError
from .fetch import RangeFetcher, place
from .offsets import (
    EARLIEST, LATEST, Logs, admit, OffsetRange, Positions, TopicPartition, check_ranges, from_json, rate_limit, resolve,
    resolve_times, coalesce_ranges, split_ranges, to_json, watermark,
)
from .options import SPECIAL, ReadOptions, parse_include_headers, parse_read_options, parse_write_options
from .sink import TailraceArrowWriter, TailraceStreamArrowWriter, check_input_schema

NAME = "tailrace"
log = logging.getLogger("tailrace.spark")


class RangePartition(InputPartition):
    """One Spark input partition: one or more ranges, each of one broker partition, read in turn
    by one task (several when small ranges were coalesced, see offsets.coalesce_ranges), and
    the endpoint to fetch each from."""

    def __init__(self, ranges: list[OffsetRange], endpoints: list[str | None]):
        super().__init__(tuple(tuple(r) for r in ranges))
        self.ranges = tuple(OffsetRange(*r) for r in ranges)
        self.endpoints = tuple(endpoints)  # per range: the owning worker's endpoint at planning time, or None
        assert len(self.ranges) == len(self.endpoints) > 0, "a RangePartition reads at least one range"


def describe(admin: Admin, options: ReadOptions,
             placed: dict[TopicPartition, str] | None = None) -> tuple[Logs, dict[TopicPartition, str]]:
    """Log bounds of every partition of the topics and, with ``directFetch``, the worker
    endpoints tasks may fetch from directly (executors decide whether they can reach them).

    A partition is placed on its worker first (fetch.place) unless ``placed`` already maps it to
    the endpoint it has now; ``placed`` is updated. A stream reader keeps that map, so a query
    places each partition once (and again after it moved), not once per micro-batch."""
    logs: Logs = {}
    endpoints: dict[TopicPartition, str] = {}
    for topic in options.topics:
        parts = sorted(admin.describe_topic(topic).partitions, key=lambda pi: pi.partition)
        logs[topic] = [PartitionOffsets(pi.partition, pi.log_start_offset, pi.high_watermark, pi.durable_watermark)
                       for pi in parts]
        # a cluster: a partition another broker leads is fetched through that broker (its leader_endpoint)
        led_elsewhere = {(topic, pi.partition): pi.leader_endpoint for pi in parts if pi.leader_endpoint}
        endpoints.update(led_elsewhere)
        if options.direct_fetch:
            now = {(topic, pi.partition): pi.endpoint for pi in parts if (topic, pi.partition) not in led_elsewhere}
            todo = [p for (_t, p), e in now.items() if placed is None or placed.get((topic, p)) != e]
            if todo:
                place(admin.conn, topic, todo)
            endpoints.update(now)
            if placed is not None:
                placed.update(now)
    return logs, endpoints


def starting_positions(admin: Admin, o: ReadOptions, logs: Logs) -> Positions:
    """Where a new query starts: by time if a time option is set, else by ``startingOffsets``."""
    if o.starting_time is None:
        return resolve(o.starting, EARLIEST, logs, o.isolation, "startingOffsets")
    default = SPECIAL[o.starting] if isinstance(o.starting, str) else EARLIEST  # for partitions a time map leaves out
    return resolve_times(o.starting_time, admin.list_offsets, default, logs, o.isolation,
                         "startingTimestamp/startingOffsetsByTimestamp", o.by_time_strategy)


def plan(options: ReadOptions, ranges: list[OffsetRange], logs: Logs, endpoints: dict) -> list[RangePartition]:
    ranges = check_ranges(ranges, logs, options.isolation, options.fail_on_data_loss)
    ranges = split_ranges(ranges, options.min_partitions)
    groups = coalesce_ranges(ranges, options.min_records_per_partition, options.min_partitions or 1)
    return [RangePartition(g, [endpoints.get((r.topic, r.partition)) for r in g]) for g in groups]


def read_partition(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the records of the planned ranges, one Arrow batch per fetch.

    Every range's first fetch is sent before any reply is read, so the workers serve a
    coalesced task's ranges at once while it converts the first reply."""
    if not isinstance(partition, RangePartition):  # Spark's stand-in when a plan has no partitions
        return
    fetchers = [RangeFetcher(options.bootstrap, r, endpoint=e, max_bytes=options.fetch_max_bytes,
                             isolation=options.isolation, timeout_ms=options.fetch_timeout_ms,
                             fail_on_data_loss=options.fail_on_data_loss, security=options.security)
                for r, e in zip(partition.ranges, partition.endpoints)]
    try:
        for f in fetchers:
            f.start()
        for f in fetchers:
            for cols in f:
                yield to_record_batch(f.range.topic, f.range.partition, cols, options.include_headers)
    finally:
        for f in fetchers:
            f.close()


def _check_schema(schema: StructType, options: ReadOptions) -> ReadOptions:
    expected = source_schema(options.include_headers)
    if schema != expected:
        raise OptionError(f"the tailrace source has a fixed schema (Kafka's, with headers when includeHeaders is true); "
                          f"do not pass .schema(): expected {expected.simpleString()}, got {schema.simpleString()}")
    return options


class TailraceBatchReader(DataSourceReader):
    """Batch read: one Spark partition per broker partition (more with minPartitions)."""

    def __init__(self, options: ReadOptions):
        self.options = options

    def partitions(self) -> list[RangePartition]:
        o = self.options
        with Admin(o.bootstrap, **dict(o.security)) as admin:
            logs, endpoints = describe(admin, o)
            start = starting_positions(admin, o, logs)
            if o.ending_time is not None:
                end = resolve_times(o.ending_time, admin.list_offsets, LATEST, logs, o.isolation,
                                    "endingTimestamp/endingOffsetsByTimestamp", "latest")
            else:
                end = resolve(o.ending, LATEST, logs, o.isolation, "endingOffsets")
        ranges = [OffsetRange(t, p, start[(t, p)], end[(t, p)]) for (t, p) in start]
        return plan(o, ranges, logs, endpoints)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


class TailraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read. Offsets: Kafka's JSON shape, topic -> partition -> next offset.

    Not thread-safe; Spark calls it from one thread. ``_target`` is set once, by
    ``prepareForTriggerAvailableNow``, and caps every later ``latestOffset``.
    """

    def __init__(self, options: ReadOptions):
        self.options = options
        self._admin: Admin | None = None
        self._target: Positions | None = None  # (topic, partition) -> frozen end, for availableNow
        self._latest: Positions | None = None  # last watermarks seen, for reportLatestOffset
        self._group_committed: dict | None = None  # the offsets last committed to groupId
        self._placed: dict[TopicPartition, str] = {}  # (topic, partition) -> endpoint it was placed on
        self._planned: tuple[Logs, dict[TopicPartition, str]] | None = None  # latestOffset's describe, for partitions()
        self._last_admitted_s: float | None = None  # monotonic time of the last batch admitted (maxTriggerDelay)

    def _describe(self) -> tuple[Logs, dict[TopicPartition, str]]:
        if self._admin is None:
            self._admin = Admin(self.options.bootstrap, **dict(self.options.security))
        return describe(self._admin, self.options, self._placed)

    def _watermarks(self, logs: Logs) -> Positions:
        return {(t, po.partition): watermark(po, self.options.isolation) for t, parts in logs.items() for po in parts}

    def initialOffset(self) -> dict:
        logs, _ = self._describe()
        return to_json(starting_positions(self._admin, self.options, logs))

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger as ReadMaxRows, else minOffsetsPerTrigger as ReadMinRows. Python
        sources get one limit (no composite as Kafka's): with both set, Spark is handed
        ReadMaxRows and latestOffset applies the minimum from the options itself."""
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        logs, _ = self._describe()
        self._target = self._watermarks(logs)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """One describe per topic per trigger (kept for ``partitions`` of the same trigger), then
        admission control: Spark's limit, with the options' minimum (``admit``). ReadAllAvailable
        (the engine's own choice) reads everything; availableNow never waits for a minimum."""
        self._commit_group(start)  # the previous batch has finished (see _commit_group)
        logs, endpoints = self._planned = self._describe()
        latest = self._latest = self._watermarks(logs)
        begin = from_json(start)
        for t, parts in logs.items():  # a partition the start does not know begins at its log start
            for po in parts:
                begin.setdefault((t, po.partition), po.log_start_offset)
        available = {}
        for k, b in begin.items():
            cap = latest.get(k, b)
            if self._target is not None:
                cap = min(cap, self._target.get(k, b))  # nothing added after the freeze
            available[k] = max(b, cap)
        if isinstance(limit, ReadAllAvailable):
            max_rows = min_rows = None
        elif isinstance(limit, ReadMaxRows):
            max_rows, min_rows = limit.max_rows, self.options.min_offsets_per_trigger
        elif isinstance(limit, ReadMinRows):
            max_rows, min_rows = self.options.max_offsets_per_trigger, limit.min_rows
        else:
            raise OptionError(f"the tailrace source supports ReadAllAvailable, ReadMaxRows and ReadMinRows limits, not {limit!r}")
        if self._target is not None:
            min_rows = None  # availableNow: nothing more will come to wait for
        now = time.monotonic()
        since_ms = None if self._last_admitted_s is None else (now - self._last_admitted_s) * 1000
        end = admit(begin, available, max_rows, min_rows, since_ms, self.options.max_trigger_delay_ms)
        if end is None:
            return to_json(begin)
        self._last_admitted_s = now
        return to_json(end)

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets, which Spark shows as the progress' ``latestOffset``: with the
        batch's ``endOffset``, the query's lag (``offsets.behind_latest``)."""
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        """The ranges ``[start, end)``, checked against the describe ``latestOffset`` made in this
        trigger (a batch re-run after a restart describes again)."""
        begin, stop = from_json(start), from_json(end)
        logs, endpoints = self._planned if self._planned is not None else self._describe()
        self._planned = None
        log_start = {(t, po.partition): po.log_start_offset for t, parts in logs.items() for po in parts}
        ranges = [OffsetRange(t, p, begin.get((t, p), log_start.get((t, p), 0)), e) for (t, p), e in stop.items()]
        ranges = [r for r in ranges if r.end > r.start]
        return plan(self.options, ranges, logs, endpoints) if ranges else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        """With ``groupId``: commit the finished micro-batch's end offsets to that group."""
        self._commit_group(end)

    def _commit_group(self, end: dict) -> None:
        """Commit a finished micro-batch's end offsets to the ``groupId`` consumer group
        (``tailrace groups describe`` then shows the query's lag). Spark calls ``commit`` only
        when it starts the next batch, so the start ``latestOffset`` is given (the end of the
        last batch, which has finished when Spark plans the next) is committed too: the last
        batch of an availableNow run is committed when Spark looks for more. Spark's checkpoint
        stays the truth for exactly-once; a commit that fails (a group with members of its own,
        a broker away) is logged and the query goes on."""
        if self.options.group_id is None or not end or end == self._group_committed:
            return
        if self._admin is None:
            self._admin = Admin(self.options.bootstrap, **dict(self.options.security))
        try:
            self._admin.reset_offsets(self.options.group_id, from_json(end))
            self._group_committed = dict(end)
        except TailraceError as exc:
            log.warning("could not commit offsets to group %r: %s", self.options.group_id, exc)

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


class TailraceDataSource(DataSource):
    """``spark.read.format("tailrace")`` / ``df.write.format("tailrace")``; see docs/SPARK.md."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return source_schema(parse_include_headers(self.options))

    def reader(self, schema: StructType) -> TailraceBatchReader:
        return TailraceBatchReader(_check_schema(schema, parse_read_options(self.options, streaming=False)))

    def streamReader(self, schema: StructType) -> TailraceStreamReader:
        return TailraceStreamReader(_check_schema(schema, parse_read_options(self.options, streaming=True)))

    def writer(self, schema: StructType, overwrite: bool) -> TailraceArrowWriter:
        _reject_overwrite(overwrite)
        check_input_schema(schema, parse_write_options(self.options))
        return TailraceArrowWriter(parse_write_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TailraceStreamArrowWriter:
        _reject_overwrite(overwrite)
        check_input_schema(schema, parse_write_options(self.options))
        return TailraceStreamArrowWriter(parse_write_options(self.options))


def _reject_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("a topic is an append-only log: use mode('append') (streams: outputMode append or update)")
