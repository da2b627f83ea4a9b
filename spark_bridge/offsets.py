"""Offset planning: resolve offset options, cut ranges, split them, rate-limit them. Pure: no I/O.

Vocabulary (as everywhere in tailrace): an *offset* is a record's logical number in its
partition. A *position* here is not a byte location but where a reader stands: the next offset
it will read, one per (topic, partition). A range ``[start, end)`` holds the offsets
``start <= offset < end``.

Streaming offsets, as Spark checkpoints them, are Kafka's JSON shape: topic -> partition (a
string) -> next offset to read. Spark compares and stores them as JSON text, so we always emit
the canonical form: keys in ``json.dumps(sort_keys=True)`` order (so partition "10" sorts before
"2") and plain ints. Equal positions then give byte-identical JSON, and a restart from a
checkpoint plans exactly the ranges the first run planned.
"""

from __future__ import annotations

import heapq
import json
import logging
from typing import Iterable, NamedTuple

from tailrace.client.protocol import PartitionOffsets

from .errors import DataLossError, OptionError
from .options import EARLIEST, LATEST, SPECIAL, OffsetSpec, TimeSpec

log = logging.getLogger("tailrace.spark")

TopicPartition = tuple[str, int]
Positions = dict[TopicPartition, int]  # (topic, partition) -> next offset to read
Logs = dict[str, list[PartitionOffsets]]  # topic -> per-partition log bounds, as the broker lists them


class OffsetRange(NamedTuple):
    topic: str
    partition: int
    start: int  # first offset to read
    end: int  # one past the last offset to read

    @property
    def size(self) -> int:
        return self.end - self.start


def watermark(po: PartitionOffsets, isolation: str) -> int:
    """The end of what a reader may see: durable watermark, or high watermark for "memory"."""
    return po.durable_watermark if isolation == "durable" else po.high_watermark


def resolve(spec: OffsetSpec, default: int, logs: Logs, isolation: str, name: str) -> Positions:
    """Positions for every partition of ``logs``: earliest/latest/explicit, per ``spec``.

    A partition a JSON spec leaves out takes ``default`` (EARLIEST or LATEST); a partition it
    names that the topic does not have is an OptionError naming the option.
    """
    out: Positions = {}
    for topic, parts in logs.items():
        explicit = spec.get(topic, {}) if isinstance(spec, dict) else {}
        unknown = sorted(set(explicit) - {po.partition for po in parts})
        if unknown:
            raise OptionError(f"option {name} names partitions topic {topic!r} does not have: "
                              f"partitions={unknown} topic has {len(parts)}")
        for po in parts:
            code = SPECIAL[spec] if isinstance(spec, str) else explicit.get(po.partition, default)
            if code == EARLIEST:
                out[(topic, po.partition)] = po.log_start_offset
            elif code == LATEST:
                out[(topic, po.partition)] = watermark(po, isolation)
            else:
                out[(topic, po.partition)] = code
    return out


def resolve_times(spec: TimeSpec, lookup, default: int, logs: Logs, isolation: str, name: str,
                  missing: str) -> Positions:
    """Positions for every partition of ``logs`` by time (Spark's Kafka source semantics).

    ``lookup(topic, ms)`` is the broker's LIST_OFFSETS by timestamp (one per topic and time). A
    partition the spec gives a time starts at the earliest offset appended at or after it (never
    past the ``isolation`` watermark); where every record is older, ``missing`` decides: "latest"
    (the watermark) or "error" (OptionError). A partition a JSON spec leaves out takes ``default``.
    """
    out: Positions = {}
    for topic, parts in logs.items():
        if isinstance(spec, int):
            want = {po.partition: spec for po in parts}
        else:
            want = spec.get(topic, {})
            unknown = sorted(set(want) - {po.partition for po in parts})
            if unknown:
                raise OptionError(f"option {name} names partitions topic {topic!r} does not have: "
                                  f"partitions={unknown} topic has {len(parts)}")
        found = {ts: {po.partition: po for po in lookup(topic, ts)} for ts in set(want.values())}
        for po in parts:
            key = (topic, po.partition)
            if po.partition not in want:
                out[key] = po.log_start_offset if default == EARLIEST else watermark(po, isolation)
                continue
            ts = want[po.partition]
            at = found[ts][po.partition].time_offset
            if at < 0 and missing == "error":
                raise OptionError(f"option {name}: topic {topic!r} partition {po.partition} has no record appended at "
                                  f"or after {ts} ms (set startingOffsetsByTimestampStrategy=latest to start at its end)")
            end = watermark(po, isolation)
            out[key] = end if at < 0 else max(po.log_start_offset, min(at, end))
    return out


def to_json(positions: Positions) -> dict:
    """Canonical offsets dict: ``json.dumps(d) == json.dumps(d, sort_keys=True)``, plain ints."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in positions.items():
        nested.setdefault(topic, {})[str(int(partition))] = int(offset)
    return {t: dict(sorted(nested[t].items())) for t in sorted(nested)}


def from_json(doc: dict) -> Positions:
    return {(topic, int(p)): int(off) for topic, parts in doc.items() for p, off in parts.items()}


def check_ranges(ranges: Iterable[OffsetRange], logs: Logs, isolation: str, fail_on_data_loss: bool) -> list[OffsetRange]:
    """Hold each range against what the log still has, ``[log start, watermark]``.

    Offsets before the log start were deleted (retention); offsets past the watermark are not
    there, or were lost with an unflushed tail. Either is data loss: raise DataLossError when
    ``fail_on_data_loss``, else log a warning and read what is left.
    """
    bounds = {(t, po.partition): (po.log_start_offset, watermark(po, isolation)) for t, parts in logs.items() for po in parts}
    out = []
    for r in ranges:
        if r.start > r.end:
            raise OptionError(f"starting offset is after the ending offset: topic={r.topic!r} "
                              f"partition={r.partition} start={r.start} end={r.end}")
        lo, hi = bounds[(r.topic, r.partition)]
        if r.start >= lo and r.end <= hi:
            out.append(r)
            continue
        message = (f"offsets of topic={r.topic!r} partition={r.partition} range=[{r.start}, {r.end}) "
                   f"are not all in the log, which holds [{lo}, {hi}) ({isolation} watermark)")
        if fail_on_data_loss:
            raise DataLossError(message + "; set failOnDataLoss=false to read what is left")
        log.warning("%s; reading what is left (failOnDataLoss=false)", message)
        start, end = min(max(r.start, lo), hi), min(max(r.end, lo), hi)
        out.append(r._replace(start=start, end=max(start, end)))
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Kafka's minPartitions: with fewer ranges than asked, cut big ranges into equal pieces.

    Each non-empty range gets ``max(1, round(size / total * min_partitions))`` pieces, so pieces
    across partitions end up about the same size; order is kept, pieces stay adjacent.
    """
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    if total == 0:
        return list(ranges)
    out = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions)) if r.size > 0 else 1
        parts = min(parts, max(r.size, 1))
        cuts = [r.start + r.size * i // parts for i in range(parts)] + [r.end]
        out.extend(r._replace(start=a, end=b) for a, b in zip(cuts, cuts[1:]))
    return out


def rate_limit(start: Positions, latest: Positions, max_rows: int) -> Positions:
    """End positions covering at most ``max_rows`` records, shared in proportion to backlog.

    Partition i with backlog b_i of total B gets ``floor(max_rows * b_i / B)`` records, then the
    rows still unassigned go one each to the largest remainders (ties: topic, partition order),
    so the total is exactly ``min(max_rows, B)`` and nobody is given more than its backlog.
    Integer arithmetic throughout: no float rounding can exceed the limit.
    """
    keys = sorted(latest)
    backlog = {k: max(0, latest[k] - start.get(k, latest[k])) for k in keys}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    share = {k: max_rows * backlog[k] // total for k in keys}
    left = max_rows - sum(share.values())
    by_remainder = sorted(keys, key=lambda k: -(max_rows * backlog[k] % total))
    for k in by_remainder[:left]:
        share[k] += 1
    return {k: start.get(k, latest[k]) + share[k] for k in keys}


def coalesce_ranges(ranges: list[OffsetRange], min_records: int, min_groups: int = 1) -> list[list[OffsetRange]]:
    """Group ranges so each Spark task reads at least ``min_records`` records (minRecordsPerPartition).

    Why: every Spark task of a Python data source costs a fixed ~50-200 ms here (a Python
    worker's round trip, the read function unpickled, a task scheduled), against ~0.5-1.5 us
    per record of Spark's own work. A streaming micro-batch of 100,000 records over 8
    partitions as 8 tasks on 2 cores spends most of its time on that overhead; one or two tasks
    read it in one go. Big ranges (batch reads, a backlog) are never merged: a range with
    ``min_records`` or more stays a group of its own.

    There are ``max(min_groups, total // min_records)`` groups (never more than there are
    ranges, at least one), filled largest range first into the lightest group, so their sizes
    differ by at most the largest range. Each group keeps the input's order; groups come in
    the order of their first range. ``min_records <= 1`` keeps one range per group.
    """
    ranges = list(ranges)
    if not ranges:
        return []
    total = sum(r.size for r in ranges)
    n = len(ranges) if min_records <= 1 else max(min_groups, total // min_records, 1)
    if n >= len(ranges):
        return [[r] for r in ranges]
    heap = [(0, g) for g in range(n)]  # heap of (records so far, group number)
    members: list[list[int]] = [[] for _ in range(n)]  # group number -> indexes into ranges
    for i in sorted(range(len(ranges)), key=lambda i: -ranges[i].size):
        load, g = heapq.heappop(heap)
        members[g].append(i)
        heapq.heappush(heap, (load + ranges[i].size, g))
    groups = sorted((sorted(m) for m in members if m), key=lambda m: m[0])
    return [[ranges[i] for i in m] for m in groups]


def admit(begin: Positions, available: Positions, max_rows: int | None, min_rows: int | None,
          since_last_ms: float | None, max_delay_ms: int) -> Positions | None:
    """The next micro-batch's end under Kafka's admission control, or None: wait, no batch yet.

    ``available`` is where each partition could end (its watermark, or the availableNow
    target). ``min_rows`` (minOffsetsPerTrigger): with fewer new records than that, wait, unless
    ``since_last_ms`` (time since the last batch admitted; None: none yet) has reached
    ``max_delay_ms`` (maxTriggerDelay). ``max_rows`` (maxOffsetsPerTrigger) then caps the batch
    (``rate_limit``). As Kafka's delayBatch, the minimum is judged on everything available,
    before the cap.
    """
    new = sum(max(0, available[k] - begin.get(k, available[k])) for k in available)
    if min_rows is not None and new < min_rows and since_last_ms is not None and since_last_ms < max_delay_ms:
        return None
    end = dict(available)
    return end if max_rows is None else rate_limit(begin, end, max_rows)


def behind_latest(end: Positions, latest: Positions) -> dict[str, str]:
    """Kafka's source metrics: records between a batch's end and the latest offsets, per partition.

    ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``, ``avgOffsetsBehindLatest`` (strings,
    as Spark's progress carries metrics); {} when no partition is known to both."""
    lags = [max(0, latest[k] - end[k]) for k in latest if k in end]
    if not lags:
        return {}
    return {"minOffsetsBehindLatest": str(min(lags)), "maxOffsetsBehindLatest": str(max(lags)),
            "avgOffsetsBehindLatest": str(float(sum(lags)) / len(lags))}


def progress_metrics(source_progress: dict) -> dict[str, str]:
    """Kafka's ``metrics`` for one source of a StreamingQueryProgress (``query.lastProgress
    ["sources"][0]``), from its ``endOffset`` and ``latestOffset``: Spark's Python stream API
    has no hook to put them in the progress itself (PySpark 4.3's Python streams do not
    implement ReportsSourceMetrics), so they are computed from what the progress carries."""
    end, latest = source_progress.get("endOffset"), source_progress.get("latestOffset")
    if not end or not latest:
        return {}
    end, latest = (json.loads(x) if isinstance(x, str) else x for x in (end, latest))
    if not isinstance(end, dict) or not isinstance(latest, dict):  # another source's offsets
        return {}
    return behind_latest(from_json(end), from_json(latest))
