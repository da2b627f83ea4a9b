"""Consumer: assign partitions, start at earliest/latest/an offset, long-poll, iterate records.

Two ways to read:

- ``poll()`` returns ``Record`` objects (partition, offset, timestamp, key, value): simple, one
  Python object per message;
- ``poll_columns()`` returns per-partition ``Columns`` (records.py): one contiguous values buffer
  plus an int32 offsets array per fetch, built with numpy alone: the fast path the Spark bridge
  turns into Arrow arrays.

One fetch per assigned partition is in flight at a time; each asks the broker to hold it up to
``max_wait_ms`` when there is no data yet (long polling).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from . import protocol as P
from .connection import DEFAULT_BOOTSTRAP, Pool
from .routes import Routes
from .errors import OffsetOutOfRangeError
from .records import Columns, batches_to_columns, iter_batches

EARLIEST, LATEST = "earliest", "latest"


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # producer create time, ms since the epoch
    key: bytes | None
    value: bytes


@dataclass
class _Assigned:
    topic: str
    partition: int
    position: int  # next offset to fetch
    inflight: int = 0  # request id of the fetch in flight, 0 if none
    sent: float = 0.0  # when it was sent (a fetch lost with a broker process is sent again)
    wait_s: float = 0.0  # the max_wait it asked for
    via: str | None = None  # endpoint of the fetch in flight (None: the router)


class Consumer:
    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, *, max_bytes: int = 4 << 20,
                 max_records: int = 1 << 20, max_wait_ms: int = 500, isolation: str = "memory",
                 request_timeout_ms: int = 3000, direct: bool = True):
        self.pool = Pool(bootstrap)
        self.conn = self.pool.router
        self.routes = Routes(self.pool, direct)
        self.max_bytes = max_bytes
        self.max_records = max_records
        self.max_wait_ms = max_wait_ms
        self.isolation = isolation
        self.request_timeout_s = request_timeout_ms / 1000
        self._fetch_header_cache: dict[int, bytes] = {}
        self.assigned: dict[tuple[str, int], _Assigned] = {}
        self._by_rid: dict[int, _Assigned] = {}
        self.last_reply: dict[tuple[str, int], P.FetchReply] = {}

    def list_offsets(self, topic: str) -> list[P.PartitionOffsets]:
        r = self.conn.request(P.Op.LIST_OFFSETS, topic)
        return P.decoder(P.ListOffsetsReply).decode(r.header).partitions

    def assign(self, topic: str, partitions: Iterable[int] | None = None, start: str | int = EARLIEST) -> None:
        offsets = {po.partition: po for po in self.list_offsets(topic)}
        for p in (sorted(offsets) if partitions is None else partitions):
            po = offsets[p]
            if start == EARLIEST:
                pos = po.log_start_offset
            elif start == LATEST:
                pos = po.durable_watermark if self.isolation == "durable" else po.high_watermark
            else:
                pos = int(start)
            self.assigned[(topic, p)] = _Assigned(topic, p, pos)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        a = self.assigned[(topic, partition)]
        a.position = offset
        a.inflight = 0  # a reply still in flight for the old position is ignored

    def position(self, topic: str, partition: int) -> int:
        return self.assigned[(topic, partition)].position

    def _send_fetches(self, max_wait_ms: int) -> None:
        now = time.monotonic()
        for a in self.assigned.values():
            if a.inflight:
                if now - a.sent < a.wait_s + self.request_timeout_s:
                    continue
                self._by_rid.pop(a.inflight, None)  # lost with a broker process: ask again
                if a.via is not None:
                    self.routes.demote(a.topic, a.partition)
            header = P.encode(P.FetchRequest(a.position, self.max_bytes, self.max_records, max_wait_ms, self.isolation))
            via = self.routes.endpoint(a.topic, a.partition)
            rid = self.pool.send(via, P.Op.FETCH, a.topic, a.partition, header)
            a.inflight, a.sent, a.wait_s, a.via = rid, now, max_wait_ms / 1000, via
            self._by_rid[rid] = a

    def poll_raw(self, timeout_ms: int = 1000) -> list[tuple[_Assigned, int, P.FetchReply, object]]:
        """Fetch replies with data, as (partition state, start offset, reply, body buffer)."""
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
            a = self._by_rid.pop(r.request_id, None)
            if a is None or a.inflight != r.request_id:
                continue
            a.inflight = 0
            self.routes.answered(a.topic, a.partition, r.via, r.code)
            if r.code == P.ErrorCode.NOT_OWNER:
                continue  # asked again through the router on the next turn
            if r.code == P.ErrorCode.OFFSET_OUT_OF_RANGE:
                r_err = P.decoder(P.ErrorReply).decode(r.header)
                raise OffsetOutOfRangeError(
                    f"{a.topic}/{a.partition}: offset {a.position} out of range", log_start_offset=r_err.log_start_offset,
                    high_watermark=r_err.high_watermark)
            r.raise_for_code()
            info = P.decoder(P.FetchReply).decode(r.header)
            self.last_reply[(a.topic, a.partition)] = info
            if r.body is not None and len(r.body):
                start = a.position
                a.position = info.next_offset
                out.append((a, start, info, r.body))

    def poll_columns(self, timeout_ms: int = 1000) -> list[tuple[str, int, Columns]]:
        """Fetched records as columns, per partition (numpy only: no object per message)."""
        out = []
        for a, start, _info, body in self.poll_raw(timeout_ms):
            buf = body.buffer if hasattr(body, "buffer") else body
            cols = batches_to_columns(iter_batches(buf), start)
            out.append((a.topic, a.partition, cols))
        return out

    def poll(self, timeout_ms: int = 1000) -> list[Record]:
        records = []
        for topic, partition, cols in self.poll_columns(timeout_ms):
            v, vo = cols.values.tobytes(), cols.value_offsets.tolist()
            k, ko, kv = cols.keys.tobytes(), cols.key_offsets.tolist(), cols.key_valid.tolist()
            ts = (cols.timestamps_us // 1000).tolist()
            records.extend(
                Record(topic, partition, off, ts[i], k[ko[i] : ko[i + 1]] if kv[i] else None, v[vo[i] : vo[i + 1]])
                for i, off in enumerate(cols.offsets.tolist())
            )
        return records

    def close(self) -> None:
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
