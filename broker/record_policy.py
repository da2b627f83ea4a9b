"""A topic's record settings (Kafka's names and meanings), as the partition actor applies them
at append: which timestamp the records carry, what compression they are stored with, and how far
a producer's clock may stray.

- ``message.timestamp.type``: ``CreateTime`` (default: the producer's time per record) or
  ``LogAppendTime`` (the broker's append time; the batch's flags byte says so, so readers and
  lookups by time use it).
- ``compression.type``: ``producer`` (default: store what came), ``uncompressed``, or a codec
  (``gzip``, ``snappy``, ``lz4``, ``zstd``): a batch in another codec is recompressed on the broker.
- ``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms``: a CreateTime batch
  whose records' times lie further in the past / future than this from the broker's clock is
  refused with INVALID_TIMESTAMP (nothing stored). Defaults: no limit in the past; one hour in the
  future (Kafka 4.0's), because a future time would hold the partition's time index (the running
  largest timestamp, FORMAT.md 1.6) ahead of every later record. -1: no limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailrace.client import codecs

TIMESTAMP_TYPE = "message.timestamp.type"
COMPRESSION_TYPE = "compression.type"
BEFORE_MAX_MS = "message.timestamp.before.max.ms"
AFTER_MAX_MS = "message.timestamp.after.max.ms"
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
DEFAULTS: dict[str, str | int] = {TIMESTAMP_TYPE: "CreateTime", COMPRESSION_TYPE: "producer", BEFORE_MAX_MS: -1,
                                  AFTER_MAX_MS: 3_600_000}


@dataclass(frozen=True, slots=True)
class RecordPolicy:
    log_append_time: bool = False
    codec: int | None = None  # None: keep the producer's
    before_us: int = -1  # -1: no limit
    after_us: int = 3_600_000_000


DEFAULT_POLICY = RecordPolicy()


def check_value(name: str, raw: str) -> tuple[str | int | None, str | None]:
    """A record setting's stored value from its text, or why it is refused."""
    if name == TIMESTAMP_TYPE:
        for t in TIMESTAMP_TYPES:
            if raw.lower() == t.lower():
                return t, None
        return None, f"{name}={raw!r}: one of {', '.join(TIMESTAMP_TYPES)}"
    if name == COMPRESSION_TYPE:
        if raw.lower() in COMPRESSION_TYPES:
            return raw.lower(), None
        return None, f"{name}={raw!r}: one of {', '.join(COMPRESSION_TYPES)}"
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None, f"{name}={raw!r}: an integer (ms), or -1 for no limit"
    if value < -1:
        return None, f"{name}={value}: ms, or -1 for no limit"
    return value, None


def effective(config: dict) -> dict[str, str]:
    """The record settings a topic has (its own, else the defaults), as text."""
    return {k: str(config.get(k, d)) for k, d in DEFAULTS.items()}


def policy_of(config: dict | None) -> RecordPolicy:
    if not config or not any(k in config for k in DEFAULTS):
        return DEFAULT_POLICY
    c = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    kind = str(c[COMPRESSION_TYPE])
    codec = None if kind == "producer" else codecs.codec_id(kind)
    before, after = int(c[BEFORE_MAX_MS]), int(c[AFTER_MAX_MS])
    return RecordPolicy(c[TIMESTAMP_TYPE] == "LogAppendTime", codec, before * 1000 if before >= 0 else -1,
                        after * 1000 if after >= 0 else -1)


def timestamp_refusal(policy: RecordPolicy, lo_us: int, hi_us: int, now_us: int) -> str | None:
    """Why a CreateTime batch whose records' times span ``[lo_us, hi_us]`` is refused, or None."""
    if policy.log_append_time:
        return None
    if policy.before_us >= 0 and lo_us < now_us - policy.before_us:
        return (f"a record's timestamp {lo_us // 1000} ms is more than {BEFORE_MAX_MS}={policy.before_us // 1000} "
                f"before the broker's clock ({now_us // 1000} ms)")
    if policy.after_us >= 0 and hi_us > now_us + policy.after_us:
        return (f"a record's timestamp {hi_us // 1000} ms is more than {AFTER_MAX_MS}={policy.after_us // 1000} "
                f"after the broker's clock ({now_us // 1000} ms)")
    return None
