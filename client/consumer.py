"""Consumer: assign partitions, start at earliest/latest/an offset, long-poll, iterate records.

Two ways to read:

- ``poll()`` returns ``Record`` objects (partition, offset, timestamp, key, value): simple, one
  Python object per message;
- ``poll_columns()`` returns per-partition ``Columns`` (records.py): one contiguous values buffer
  plus an int32 offsets array per fetch, built with numpy alone: the fast path the Spark bridge
  turns into Arrow arrays.

One fetch per assigned partition is in flight at a time; each asks the broker to hold it up to
``max_wait_ms`` when there is no data yet (long polling). The partitions one worker owns are
fetched together, one FETCH_MULTI for all of them (client/fetches.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

from . import protocol as P
from .connection import CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, Connection, Pool
from . import group as group_mod
from .group import GROUP_OPTIONS, Membership
from .security import curve_keys
from .routes import BlockingRoutes
from .errors import InvalidRequestError, UnknownPartitionError
from .fetches import Fetches
from .records import CREATE_TIME, Columns, batches_to_columns, iter_batches
from .ring_reader import WATERMARK_COLUMN, SharedRings, TailStatus

EARLIEST, LATEST = "earliest", "latest"
AUTO_OFFSET_RESETS = ("earliest", "latest", "error")
log = logging.getLogger("tailrace.consumer")
RING_WAIT_S = 0.1  # longest futex sleep of a ring-reading consumer with nothing to read
RING_RECHECK_S = 1.0  # how often a ring reader checks that its mappings are current
FEW_TAILS = 16  # ring-read partitions up to which the watermarks are looked at one by one


class OffsetAndTimestamp(NamedTuple):
    """Where a time falls in a partition (Kafka's): the earliest offset appended at or after
    it, and that record's append time."""
    offset: int
    timestamp_ms: int


def times_by_topic(timestamps: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[int]]:
    """{(topic, partition): ms} grouped into one LIST_OFFSETS per (topic, ms): the partitions."""
    out: dict[tuple[str, int], list[int]] = {}
    for (topic, partition), ts in timestamps.items():
        if int(ts) < 0:
            raise InvalidRequestError(f"timestamp {ts} for {topic}/{partition}: milliseconds since the epoch, >= 0")
        out.setdefault((topic, int(ts)), []).append(partition)
    return out


def found_times(topic: str, offsets: list[P.PartitionOffsets], partitions) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
    by = {po.partition: po for po in offsets}
    out = {}
    for p in partitions:
        po = by.get(p)
        if po is None:
            raise UnknownPartitionError(f"topic {topic!r} has partitions 0-{len(by) - 1}; no partition {p}")
        out[(topic, p)] = OffsetAndTimestamp(po.time_offset, po.time_timestamp_ms) if po.time_offset >= 0 else None
    return out


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch: the producer's create time, or the append time (timestamp_type)
    key: bytes | None
    value: bytes
    headers: tuple = ()  # ((key str, value bytes or None), ...) in the order sent, repeats kept
    timestamp_type: int = CREATE_TIME  # CREATE_TIME (0) or LOG_APPEND_TIME (1): the topic's message.timestamp.type


@dataclass
class _Assigned:
    topic: str
    partition: int
    position: int  # next offset to fetch
    inflight: int = 0  # request id of the fetch in flight, 0 if none
    sent: float = 0.0  # when it was sent (a fetch lost with a broker process is sent again)
    wait_s: float = 0.0  # the max_wait it asked for
    via: str | None = None  # endpoint of the fetch in flight (None: the router)
    tail: object = None  # ring_reader.PartitionTail when read from the ring (shm=True)
    below: bool = False  # the position is below the ring: fetch it
    alone: bool = False  # answered NOT_OWNER: fetched on its own (through the router) until answered
    lane: object = None  # fetches._Lane: fetched with others of its owner, in one session


class ConsumerCore(Fetches):
    """Everything a consumer decides, without I/O: assigned partitions and positions, which
    fetches to send and what a fetch reply means (``Fetches``, client/fetches.py), records out of
    replies. ``Consumer`` below drives
    it with blocking polls (and reads the rings on the same host); ``aio.AsyncConsumer`` from an
    asyncio event loop. Subclasses set ``self.pool`` (``send`` never blocks), ``self.routes``
    and ``_route``."""

    def __init__(self, *, max_bytes: int = 4 << 20, max_records: int = 1 << 20, max_wait_ms: int = 500,
                 isolation: str = "memory", request_timeout_ms: int = 3000, auto_offset_reset: str = "error",
                 multi_partition: bool = True, multi_partition_min: int = 5, multi_partition_max: int = 64):
        if auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise InvalidRequestError(f"auto_offset_reset={auto_offset_reset!r}: one of {', '.join(AUTO_OFFSET_RESETS)}")
        # where a position the log no longer holds (retention) or never held goes: Kafka's
        # auto.offset.reset; "error" raises OffsetOutOfRangeError (nothing is skipped unseen)
        self.auto_offset_reset = auto_offset_reset
        self.resets = 0
        self.max_bytes = max_bytes
        self.max_records = max_records
        self.max_wait_ms = max_wait_ms
        self.isolation = isolation
        self.request_timeout_s = request_timeout_ms / 1000
        self.assigned: dict[tuple[str, int], _Assigned] = {}
        self._by_rid: dict = {}  # request id -> partition (_Assigned: a FETCH), or the lane (fetches._Lane: a FETCH_MULTI)
        self.multi_partition = multi_partition  # one FETCH_MULTI per worker for its partitions (client/fetches.py)
        self.multi_partition_min = max(2, multi_partition_min)  # ... when it has at least this many due,
        self.multi_partition_max = max(self.multi_partition_min, min(multi_partition_max, P.MAX_REQUEST_PARTITIONS))  # at most this many a request
        self.last_reply: dict[tuple[str, int], P.FetchReply] = {}
        self._tailed: list[_Assigned] = []
        self._tail_slots = self._tail_pos = np.zeros(0, dtype=np.int64)
        self._fetching = False
        self._deferred: Exception | None = None  # see _take_or_defer
        self.throttle_ms = 0  # total time the broker held fetch replies back: over the principal's quota

    pool = None
    routes = None

    def _route(self, topic: str, partition: int) -> str | None:
        raise NotImplementedError

    def _assign_from(self, topic: str, offsets: list[P.PartitionOffsets], partitions: Iterable[int] | None,
                     start: str | int) -> None:
        """``assign`` once the topic's offsets are known (LIST_OFFSETS)."""
        offsets = {po.partition: po for po in offsets}
        wanted = sorted(offsets) if partitions is None else list(partitions)
        missing = [p for p in wanted if p not in offsets]
        if missing:
            raise UnknownPartitionError(f"topic {topic!r} has partitions 0-{len(offsets) - 1}; no partition {missing[0]}")
        if not isinstance(start, str) and int(start) < 0:
            raise InvalidRequestError(f"offset {start} is negative")
        for p in wanted:
            po = offsets[p]
            if start == EARLIEST:
                pos = po.log_start_offset
            elif start == LATEST:
                pos = po.durable_watermark if self.isolation == "durable" else po.high_watermark
            else:
                pos = int(start)
            self.assigned[(topic, p)] = a = _Assigned(topic, p, pos)
            self._mark_due(a)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        a = self.assigned[(topic, partition)]
        a.position = offset
        a.inflight = 0  # a reply still in flight for the old position is ignored
        self._leave_lane(a)
        a.below = False
        self._mark_due(a)
        self._index_tails()

    def position(self, topic: str, partition: int) -> int:
        return self.assigned[(topic, partition)].position

    # --- consumer groups: what Consumer and AsyncConsumer share (client/group.py) ----------------
    membership: Membership | None = None

    def _group_options(self, group: str | None, options: dict) -> dict:
        """Take the group's options (``GROUP_OPTIONS``) out of ``options`` and join ``group``
        with them; return the rest (for ``ConsumerCore``)."""
        mine = {k: options.pop(k) for k in list(options) if k in GROUP_OPTIONS}
        if group is None:
            if mine:
                raise InvalidRequestError(f"{', '.join(sorted(mine))}: options of a group consumer; give group=")
            return options
        options.setdefault("auto_offset_reset", LATEST)
        self.membership = Membership(self, group, **mine)
        return options

    @property
    def group_start(self) -> str:
        """Where a group's partition without a committed offset starts."""
        if self.auto_offset_reset not in (EARLIEST, LATEST):
            raise InvalidRequestError("a group partition has no committed offset and auto_offset_reset='error'")
        return self.auto_offset_reset

    def _member(self) -> Membership:
        if self.membership is None:
            raise InvalidRequestError("this consumer has no group: give group='name'")
        return self.membership

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Consume ``topics`` as a member of the group: the next poll joins, and the broker
        assigns partitions from then on (``on_assign``/``on_revoke`` say which)."""
        self._member().subscribe([topics] if isinstance(topics, str) else list(topics))

    def unassign(self, topic: str, partition: int) -> None:
        """Stop reading a partition (a reply still in flight for it is ignored)."""
        a = self.assigned.pop((topic, partition), None)
        if a is None:
            return
        if self._by_rid.get(a.inflight) is a:  # (a FETCH_MULTI's entry stays for its other partitions)
            del self._by_rid[a.inflight]
        a.inflight = 0
        self._leave_lane(a)
        a.tail = None
        self.last_reply.pop((topic, partition), None)
        self._index_tails()

    def _seek_times(self, topic: str, offsets: list[P.PartitionOffsets], partitions: Iterable[int] | None) -> dict[int, int]:
        """Seek assigned partitions of ``topic`` to the offsets a LIST_OFFSETS by time found; a
        partition where every record is older goes to its end (what comes next)."""
        parts = sorted(p for t, p in self.assigned if t == topic) if partitions is None else list(partitions)
        by = {po.partition: po for po in offsets}
        moved = {}
        for p in parts:
            if (topic, p) not in self.assigned:
                raise UnknownPartitionError(f"{topic}/{p} is not assigned to this consumer")
            po = by[p]
            end = po.durable_watermark if self.isolation == "durable" else po.high_watermark
            moved[p] = po.time_offset if po.time_offset >= 0 else end
            self.seek(topic, p, moved[p])
        return moved

    # --- same-host ring reads: what Consumer and AsyncConsumer share (client/ring_reader.py) -----
    _rings: SharedRings | None = None
    _tails_at = 0.0  # when the mappings were last checked
    _ring_error = ""  # the last reason ring reads could not be set up (logged once)

    def _map_rings(self, topic: str, d: P.DescribeReply) -> None:
        """Map the broker's control table (once) and ``topic``'s rings from its DESCRIBE answer,
        for the assigned partitions; raises when they cannot be mapped here (another host, user
        or build), and the old mapping stays."""
        if self._rings is None or self._rings.instance != d.instance or not self._rings.is_current():
            fresh = SharedRings(d.instance, d.data_id)
            self._drop_rings()
            self._rings = fresh
        for pi in d.partitions:
            a = self.assigned.get((topic, pi.partition))
            if a is not None and pi.slot >= 0:
                a.tail = self._rings.partition(pi.slot, d.topic.topic_id, pi.partition)
                self._leave_lane(a)

    def _rings_failed(self, topic: str, exc: BaseException) -> None:
        """``topic``'s rings could not be mapped (or watched): its partitions are fetched."""
        why = f"{type(exc).__name__}: {exc}"
        if why != self._ring_error:  # retried every second: say it once, not each time
            log.info("same-host ring reads unavailable for %s (%s); fetching", topic, why)
            self._ring_error = why
        for a in self.assigned.values():
            if a.topic == topic:
                a.tail = None
                self._mark_due(a)

    def _rings_mapped(self) -> None:
        self._tails_at = time.monotonic()
        self._index_tails()

    def _rings_due(self, every_topic: bool = False) -> list[str]:
        """Once every ``RING_RECHECK_S``: the topics to map again (a partition lost its ring, or
        the broker re-made its memory; ``every_topic``: all of them)."""
        if time.monotonic() - self._tails_at < RING_RECHECK_S:
            return []
        self._tails_at = time.monotonic()
        stale = every_topic or self._rings is None or not self._rings.is_current()
        return sorted({a.topic for a in self.assigned.values() if stale or a.tail is None})

    def _read_rings(self, out: list) -> None:
        """Read every ring-read partition whose watermark moved: a few partitions looked at one by
        one (a word load each), many with one numpy gather."""
        rings, tailed = self._rings, self._tailed
        if rings is None or not tailed:
            return
        if len(tailed) <= FEW_TAILS:
            col = WATERMARK_COLUMN[self.isolation]
            ready = [(i, a) for i, a in enumerate(tailed) if a.tail.row.cells[col] != a.position]
        else:
            wm = rings.watermarks(self._tail_slots, self.isolation)
            ready = [(i, tailed[i]) for i in np.flatnonzero(wm != self._tail_pos).tolist()]
        moved = False  # a partition left the ring path: re-index once, after the loop
        for i, a in ready:
            moved |= self._read_ring(a, i, out)
        if moved:
            self._index_tails()

    def _read_ring(self, a: _Assigned, i: int, out: list) -> bool:
        """Read partition ``a`` (index ``i`` in the tail arrays) from its ring; True when it left
        the ring path (below its ring, or the ring is gone) and the arrays need re-indexing."""
        if a.inflight or a.below or a.tail is None:
            return False
        got = a.tail.read(a.position, self.max_bytes, self.max_records, self.isolation)
        if got.status == TailStatus.DATA:
            info = P.FetchReply(got.high_watermark, got.durable_watermark, got.log_start_offset, got.next_offset, "shm")
            self.last_reply[(a.topic, a.partition)] = info
            out.append((a, a.position, info, got.body))
            a.position = self._tail_pos[i] = got.next_offset
            return False
        if got.status == TailStatus.EMPTY:
            self._tail_pos[i] = a.position
            return False
        if got.status == TailStatus.BELOW:
            a.below = True  # a fetch reads it (the journal, or the broker's error)
        else:
            a.tail = None  # GONE: fetched until the next recheck maps it again
        self._mark_due(a)
        return True

    def _drop_rings(self) -> None:
        """Unmap every ring (each partition is fetched until mapped again)."""
        for a in self.assigned.values():
            a.tail = None
            self._mark_due(a)
        self._index_tails()
        if self._rings is not None:
            self._rings.close()
            self._rings = None

    def _index_tails(self) -> None:
        """Arrays of the ring-read partitions' slots and positions, for the one-gather idle check."""
        tails = [a for a in self.assigned.values() if a.tail is not None]
        self._tailed = tails
        self._tail_slots = np.array([a.tail.slot for a in tails], dtype=np.int64)
        self._tail_pos = np.array([a.position for a in tails], dtype=np.int64)
        self._fetching = any(a.tail is None or a.below for a in self.assigned.values())

    @staticmethod
    def _to_columns(raw: list) -> list[tuple[str, int, Columns]]:
        """``poll_raw``'s replies as columns, per partition (numpy only: no object per message)."""
        out = []
        for a, start, _info, body in raw:
            buf = body.buffer if hasattr(body, "buffer") else body
            cols = batches_to_columns(iter_batches(buf), start)
            out.append((a.topic, a.partition, cols))
        return out

    @staticmethod
    def _to_records(columns: list[tuple[str, int, Columns]]) -> list[Record]:
        records = []
        for topic, partition, cols in columns:
            v, vo = cols.values.tobytes(), cols.value_offsets.tolist()
            k, ko, kv = cols.keys.tobytes(), cols.key_offsets.tolist(), cols.key_valid.tolist()
            ts = (cols.timestamps_us // 1000).tolist()
            if cols.headers is None and cols.timestamp_types is None:
                records.extend(
                    Record(topic, partition, off, ts[i], k[ko[i] : ko[i + 1]] if kv[i] else None, v[vo[i] : vo[i + 1]])
                    for i, off in enumerate(cols.offsets.tolist())
                )
                continue
            hs = cols.headers.lists() if cols.headers is not None else [()] * len(cols)
            tt = cols.timestamp_types.tolist() if cols.timestamp_types is not None else [CREATE_TIME] * len(cols)
            records.extend(
                Record(topic, partition, off, ts[i], k[ko[i] : ko[i + 1]] if kv[i] else None, v[vo[i] : vo[i + 1]],
                       hs[i], tt[i])
                for i, off in enumerate(cols.offsets.tolist())
            )
        return records


class Consumer(ConsumerCore):
    """The blocking consumer (``ConsumerCore`` driven by the caller's polls), with same-host
    ring reads."""

    def __init__(self, bootstrap: str | None = None, *, direct: bool = True, same_host: bool = False,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None,
                 group: str | None = None, **options):
        """``group``: consume as a member of this consumer group (``subscribe``, then ``poll``),
        with the options in ``GROUP_OPTIONS`` (client/group.py): the broker shares the topics'
        partitions among the group's members and keeps their committed offsets. Without a
        committed offset a partition starts where ``auto_offset_reset`` says (``latest`` in a
        group unless given, as Kafka)."""
        options = self._group_options(group, options)
        super().__init__(**options)
        self.pool = Pool(bootstrap, connect_timeout_ms, curve_keys(key_file, server_key))
        self.pool.on_lost = self._connection_lost
        self._group_conn: group_mod.CoordinatorLink | None = None  # the group's requests: their own socket, one at a time
        if group is not None:
            keys = curve_keys(key_file, server_key)
            self._group_conn = group_mod.CoordinatorLink(Connection(bootstrap, connect_timeout_ms, keys),
                                                         lambda endpoint: Connection(endpoint, connect_timeout_ms, keys))
        self.conn = self.pool.router
        self.routes = BlockingRoutes(self.pool, direct, same_host)
        # same_host: read partitions straight from the broker's shared-memory rings (client/ring_reader.py)
        # and fetch what is below them over the workers' Unix sockets; falls back to ordinary
        # fetches wherever the rings cannot be mapped (another host or user)
        self.same_host = same_host

    def _route(self, topic: str, partition: int) -> str | None:
        return self.routes.endpoint(topic, partition)

    def list_offsets(self, topic: str, timestamp_ms: int | None = None) -> list[P.PartitionOffsets]:
        header = P.EMPTY_MAP if timestamp_ms is None else P.encode(P.ListOffsetsRequest(int(timestamp_ms)))
        r = self.conn.request(P.Op.LIST_OFFSETS, topic, header=header)
        return P.decoder(P.ListOffsetsReply).decode(r.header).partitions

    def offsets_for_times(self, timestamps: dict[tuple[str, int], int]) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
        """Kafka's ``offsetsForTimes``: for each ``(topic, partition): ms since the epoch``, the
        earliest offset whose record was appended (broker time) at or after it, with that time;
        None where every record is older. One round trip per topic and time, O(log n) reads."""
        out = {}
        for (topic, ts), parts in times_by_topic(timestamps).items():
            out.update(found_times(topic, self.list_offsets(topic, ts), parts))
        return out

    def seek_to_time(self, topic: str, timestamp_ms: int, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Move the assigned partitions of ``topic`` (or ``partitions``) to the first record
        appended at or after ``timestamp_ms``; where every record is older, to the end. Returns
        {partition: new position}."""
        if int(timestamp_ms) < 0:
            raise InvalidRequestError(f"timestamp {timestamp_ms}: milliseconds since the epoch, >= 0")
        return self._seek_times(topic, self.list_offsets(topic, timestamp_ms), partitions)

    def assign(self, topic: str, partitions: Iterable[int] | None = None, start: str | int = EARLIEST) -> None:
        self._assign_from(topic, self.list_offsets(topic), partitions, start)
        if self.same_host:
            self._attach_rings(topic)

    # --- consumer groups (group=...; client/group.py) ---------------------------------------------
    def _group(self, gen):
        """Run a group operation (client/group.py) with blocking requests."""
        timeout = max(10_000, int(self.request_timeout_s * 1000))
        return group_mod.run(gen, lambda op, topic, header: self._group_conn.request(op, topic, header, timeout),
                             self._group_assigned)

    def _group_assigned(self, topic: str) -> None:
        if self.same_host:
            self._attach_rings(topic)

    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """Commit the group's offsets, durably before it returns: ``offsets`` {(topic,
        partition): next offset to read}, or the current position of every partition held."""
        m = self._member()
        return self._group(m.commit_positions(sorted(self.assigned)) if offsets is None else m.commit(dict(offsets)))

    def committed(self, partitions: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """The group's committed offsets (of ``partitions``, or all it has)."""
        return self._group(self._member().committed(None if partitions is None else list(partitions)))

    def poll_raw(self, timeout_ms: int = 1000) -> list[tuple[_Assigned, int, P.FetchReply, object]]:
        """Fetch replies with data, as (partition state, start offset, reply, body buffer)."""
        self._raise_deferred()
        if self.membership is not None and self.membership.due():
            self._group(self.membership.step())
        if self.same_host:
            return self._poll_rings(timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        out = []
        while True:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            # A fetch may outlive this call (the next poll picks its reply up), so it always asks
            # for the full wait: shrinking it to this call's deadline made near-zero-wait fetches
            # spin the broker at the end of every poll.
            self._send_fetches(self.max_wait_ms)
            r = self.pool.recv(left if not out else 0)
            if r is None:
                if out or left == 0:
                    return out
                continue
            if not self._take_or_defer(r, out):
                return out

    def poll_columns(self, timeout_ms: int = 1000) -> list[tuple[str, int, Columns]]:
        """Fetched records as columns, per partition (numpy only: no object per message)."""
        return self._to_columns(self.poll_raw(timeout_ms))

    def poll(self, timeout_ms: int = 1000) -> list[Record]:
        return self._to_records(self.poll_columns(timeout_ms))

    # --- same-host ring reads (same_host=True; ConsumerCore does the reading) -----------------------
    def _attach_rings(self, topic: str) -> None:
        """Map the broker's control table and this topic's rings read-only; on any failure (not
        the broker's host or user, another build) the topic is read with fetches."""
        try:
            r = self.conn.request(P.Op.DESCRIBE_TOPIC, topic)
            self._map_rings(topic, P.decoder(P.DescribeReply).decode(r.header))
        except Exception as exc:  # noqa: BLE001 - any reason to not map is a reason to fetch
            self._rings_failed(topic, exc)
        self._rings_mapped()

    def _poll_rings(self, timeout_ms: int) -> list:
        """Read partitions from the rings; a partition below its ring (or not mapped) goes
        through fetches meanwhile. With nothing to read, sleeps on the broker's futex word
        (shm/futex.py) until a worker publishes, at most ``RING_WAIT_S`` at a time."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            out = []
            for topic in self._rings_due():
                self._attach_rings(topic)
            rings = self._rings
            mark = rings.table.wake_mark() if rings is not None else 0
            self._read_rings(out)
            if self._fetching:
                self._send_fetches(self.max_wait_ms, fetch_only=True)
            if self._by_rid:
                while (r := self.pool.recv(0)) is not None:
                    if not self._take_or_defer(r, out):
                        return out
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            if self._by_rid:  # a fetch is out: its reply is what comes next (rings looked at every 5 ms)
                wait_ms = 5 if self._tailed else min(RING_RECHECK_S, left) * 1000
                r = self.pool.recv(max(1, min(int(left * 1000), int(wait_ms))))
                if r is not None and (not self._take_or_defer(r, out) or out):
                    return out
            elif rings is not None:
                rings.table.wait_wake(mark, min(left, RING_WAIT_S))
            else:
                time.sleep(min(left, RING_WAIT_S))

    def close(self) -> None:
        if self.membership is not None:
            self._group(self.membership.leave())
            self._group_conn.close()
        self._drop_rings()
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
