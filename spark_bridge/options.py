"""Data source options: parsed once on the driver into frozen, picklable structs.

The offset options' names and meanings follow Spark's Kafka source (``topic`` stands for its
``subscribe``, ``bootstrap`` for ``kafka.bootstrap.servers``). Spark hands options over case-insensitively; we lower-case the
keys ourselves as well, so the structs can also be built from a plain dict in tests.

Offsets options take ``earliest``, ``latest`` or Kafka's JSON shape, one map per topic from
partition (a string) to offset: ``{"events": {"0": 23, "1": -2}}`` where -2 means earliest and
-1 latest. A partition the map leaves out takes the option's default (Kafka insists on every
partition; we do not).

By time, as Spark's Kafka source: ``startingTimestamp`` / ``endingTimestamp`` (ms since the
epoch, every partition) take precedence over ``startingOffsetsByTimestamp`` /
``endingOffsetsByTimestamp`` (``{"events": {"0": 1700000000000}}``), which take precedence over
``startingOffsets`` / ``endingOffsets``. A partition starts at the earliest offset appended at or
after its time; where every record is older, ``startingOffsetsByTimestampStrategy`` says what
happens (``error``, the default: the query fails; ``latest``: it starts at the end), and an
ending time with no such record ends at the latest offset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Union

from tailrace.client.connection import DEFAULT_BOOTSTRAP
from tailrace.client.errors import BootstrapError
from tailrace.client.protocol import ACKS_BY_NAME
from tailrace.client.security import curve_keys

from .errors import OptionError

EARLIEST = -2  # in an offsets JSON map: the partition's log start offset
LATEST = -1  # in an offsets JSON map: the partition's watermark (see ``isolation``)
SPECIAL = {"earliest": EARLIEST, "latest": LATEST}

# "earliest", "latest", or {topic: {partition: offset or EARLIEST or LATEST}}
OffsetSpec = Union[str, dict[str, dict[int, int]]]
# one time (ms since the epoch) for every partition, or {topic: {partition: ms}}
TimeSpec = Union[int, dict[str, dict[int, int]]]
BY_TIME_STRATEGIES = ("error", "latest")

MiB = 1 << 20
# minRecordsPerPartition's default: below this many records, ranges share a Spark task (offsets.coalesce_ranges)
MIN_RECORDS_PER_PARTITION = 100_000
ISOLATIONS = ("durable", "memory")


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec  # "latest" for streams: a stream has no end
    fail_on_data_loss: bool
    min_partitions: int | None
    max_offsets_per_trigger: int | None
    isolation: str  # "durable": read up to the durable watermark; "memory": the high watermark
    fetch_max_bytes: int
    fetch_timeout_ms: int
    direct_fetch: bool  # fetch from the partition's worker endpoint when it is reachable here
    security: tuple = ()  # keyFile, serverKey: CurveZMQ (client/security.py), as (("key_file", ..), ("server_key", ..))
    starting_time: TimeSpec | None = None  # startingTimestamp / startingOffsetsByTimestamp: before ``starting``
    ending_time: TimeSpec | None = None  # endingTimestamp / endingOffsetsByTimestamp (batch): before ``ending``
    by_time_strategy: str = "error"  # startingOffsetsByTimestampStrategy: no record that recent -> fail, or latest
    group_id: str | None = None  # groupId (streams): each finished micro-batch's end offsets are committed to it, for lag
    min_records_per_partition: int = 0  # a Spark task reads at least this many records: smaller ranges share a task
    min_offsets_per_trigger: int | None = None  # streams: wait for this many new records (up to max_trigger_delay_ms)
    max_trigger_delay_ms: int = 15 * 60_000  # streams: the longest a micro-batch waits for min_offsets_per_trigger
    include_headers: bool = False  # includeHeaders: the schema has Kafka's headers column


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None  # overrides a ``topic`` column, as with Kafka
    acks: str
    max_batch_bytes: int  # one produce batch stays under this; the broker's limit is 1 MiB by default
    request_timeout_ms: int
    direct_produce: bool  # produce to the partition's worker endpoint when it is reachable here
    security: tuple = ()  # keyFile, serverKey, as for reads


def _security(opts: dict) -> tuple:
    """``keyFile`` and ``serverKey`` (a broker with --auth curve), checked here on the driver; the
    files are read again where the client runs, so they must be readable on every executor, as
    Kafka's keystore files must."""
    key_file, server_key = opts.get("keyfile"), opts.get("serverkey")
    if key_file is None and server_key is None:
        return ()
    try:
        curve_keys(key_file, server_key)
    except BootstrapError as exc:
        raise OptionError(f"options keyFile/serverKey: {exc}") from None
    return (("key_file", key_file), ("server_key", server_key))


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bool(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false: {name}={raw!r}")


def _int(opts: dict, name: str, default: int | None, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer: {name}={raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}: {name}={value}")
    return value


_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(opts: dict, name: str, default: int) -> int:
    """Spark's time strings, as Kafka's ``maxTriggerDelay``: ``500ms``, ``30s``, ``15m``, ``1h``;
    a bare number is milliseconds."""
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = text[len(digits):].strip() or "ms"
    if not digits.isdigit() or unit not in _DURATION_MS:
        raise OptionError(f"option {name} must be a duration such as 500ms, 30s, 15m or 1h: {name}={raw!r}")
    return int(digits) * _DURATION_MS[unit]


def parse_include_headers(options: Mapping[str, str]) -> bool:
    """``includeHeaders`` (Kafka's option): whether the source's schema has a ``headers`` column.
    The schema is asked for before the readers are made, so this is parsed on its own too."""
    return _bool(_lower(options), "includeHeaders", False)


def parse_topics(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        raise OptionError("option topic is required: a topic name or a comma-separated list")
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise OptionError(f"option topic names no topic: topic={raw!r}")
    return topics


def parse_offset_spec(raw: str | None, name: str, default: str, topics: tuple[str, ...]) -> OffsetSpec:
    """``earliest``, ``latest`` or a JSON map per topic; raises OptionError naming the option."""
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if text.lower() in SPECIAL:
        return text.lower()
    try:
        doc = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name} must be earliest, latest or a JSON map: {name}={raw!r}") from None
    if not isinstance(doc, dict):
        raise OptionError(f"option {name} JSON must map topic -> {{partition: offset}}: {name}={raw!r}")
    spec: dict[str, dict[int, int]] = {}
    for topic, parts in doc.items():
        if topic not in topics:
            raise OptionError(f"option {name} names topic {topic!r}, which option topic does not list: topics={list(topics)}")
        if not isinstance(parts, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map to {{partition: offset}}, got {parts!r}")
        spec[topic] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(f"option {name}: partition must be an integer: topic={topic!r} partition={p!r}") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST or partition < 0:
                raise OptionError(
                    f"option {name}: offset must be an integer >= -2 (-2 earliest, -1 latest): "
                    f"topic={topic!r} partition={p} offset={off!r}")
            spec[topic][partition] = off
    return spec


def parse_time_spec(opts: dict, single: str, by_partition: str, topics: tuple[str, ...]) -> TimeSpec | None:
    """``single`` (one time for all) over ``by_partition`` (a JSON map); None if neither is set."""
    one = _int(opts, single, None, 0)
    if one is not None:
        return one
    raw = opts.get(by_partition.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise OptionError(f"option {by_partition} must be a JSON map of topic -> {{partition: ms}}: {by_partition}={raw!r}") from None
    if not isinstance(doc, dict):
        raise OptionError(f"option {by_partition} JSON must map topic -> {{partition: ms}}: {by_partition}={raw!r}")
    spec: dict[str, dict[int, int]] = {}
    for topic, parts in doc.items():
        if topic not in topics:
            raise OptionError(f"option {by_partition} names topic {topic!r}, which option topic does not list: topics={list(topics)}")
        if not isinstance(parts, dict):
            raise OptionError(f"option {by_partition}: topic {topic!r} must map to {{partition: ms}}, got {parts!r}")
        spec[topic] = {}
        for p, ts in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(f"option {by_partition}: partition must be an integer: topic={topic!r} partition={p!r}") from None
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0 or partition < 0:
                raise OptionError(f"option {by_partition}: a time is ms since the epoch, >= 0: topic={topic!r} partition={p} time={ts!r}")
            spec[topic][partition] = ts
    return spec


def _forbid(spec: OffsetSpec, name: str, word: str, code: int, why: str) -> None:
    if spec == word or (isinstance(spec, dict) and any(code in parts.values() for parts in spec.values())):
        raise OptionError(f"option {name} cannot be {word} ({code} in JSON): {why}")


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    opts = _lower(options)
    topics = parse_topics(opts.get("topic"))
    starting = parse_offset_spec(opts.get("startingoffsets"), "startingOffsets", "latest" if streaming else "earliest", topics)
    starting_time = parse_time_spec(opts, "startingTimestamp", "startingOffsetsByTimestamp", topics)
    ending_time = None
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in BY_TIME_STRATEGIES:
        raise OptionError(f"option startingOffsetsByTimestampStrategy must be one of {BY_TIME_STRATEGIES}: {strategy!r}")
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name.lower() in opts:
                raise OptionError(f"option {name} is for batch queries; a stream has no end (use trigger(availableNow=True))")
        ending: OffsetSpec = "latest"
    else:
        ending = parse_offset_spec(opts.get("endingoffsets"), "endingOffsets", "latest", topics)
        ending_time = parse_time_spec(opts, "endingTimestamp", "endingOffsetsByTimestamp", topics)
        if "groupid" in opts:
            raise OptionError("option groupId is for streams: a batch query has no micro-batches to commit")
        if starting_time is None:  # a time takes precedence over startingOffsets, which is then not read
            _forbid(starting, "startingOffsets", "latest", LATEST, "a batch query would read nothing")
        _forbid(ending, "endingOffsets", "earliest", EARLIEST, "a batch query would read nothing")
    max_offsets = _int(opts, "maxOffsetsPerTrigger", None, 1) if streaming else None
    min_offsets = _int(opts, "minOffsetsPerTrigger", None, 1) if streaming else None
    if not streaming and ("minoffsetspertrigger" in opts or "maxtriggerdelay" in opts):
        raise OptionError("options minOffsetsPerTrigger and maxTriggerDelay are for streams: a batch query has no triggers")
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError(f"option minOffsetsPerTrigger must not exceed maxOffsetsPerTrigger: "
                          f"minOffsetsPerTrigger={min_offsets} maxOffsetsPerTrigger={max_offsets}")
    isolation = opts.get("isolation", "durable").lower()
    if isolation not in ISOLATIONS:
        raise OptionError(f"option isolation must be one of {ISOLATIONS}: isolation={isolation!r}")
    return ReadOptions(
        bootstrap=opts.get("bootstrap", DEFAULT_BOOTSTRAP),
        topics=topics,
        starting=starting,
        ending=ending,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        min_partitions=_int(opts, "minPartitions", None, 1),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", 15 * 60_000),
        min_records_per_partition=_int(opts, "minRecordsPerPartition", MIN_RECORDS_PER_PARTITION, 0),
        isolation=isolation,
        fetch_max_bytes=_int(opts, "fetchMaxBytes", 16 * MiB, 64 * 1024),
        fetch_timeout_ms=_int(opts, "fetchTimeoutMs", 30_000, 100),
        direct_fetch=_bool(opts, "directFetch", True),
        security=_security(opts),
        starting_time=starting_time,
        ending_time=ending_time,
        by_time_strategy=strategy,
        group_id=opts.get("groupid") or None,
        include_headers=_bool(opts, "includeHeaders", False),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    acks = opts.get("acks", "durable").lower()
    if acks not in ACKS_BY_NAME:
        raise OptionError(f"option acks must be one of {sorted(ACKS_BY_NAME)}: acks={acks!r}")
    topic = opts.get("topic")
    if topic is not None and ("," in topic or not topic.strip()):
        raise OptionError(f"option topic names the one topic to write to: topic={topic!r}")
    return WriteOptions(
        bootstrap=opts.get("bootstrap", DEFAULT_BOOTSTRAP),
        topic=topic.strip() if topic is not None else None,
        acks=acks,
        max_batch_bytes=_int(opts, "maxBatchBytes", 512 * 1024, 4096),
        request_timeout_ms=_int(opts, "requestTimeoutMs", 30_000, 100),
        direct_produce=_bool(opts, "directProduce", True),
        security=_security(opts),
    )
