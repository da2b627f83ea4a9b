"""Read one partition's offset range ``[start, end)`` as record columns: the executor fast path.

Runs inside Spark's Python workers, which Spark forks from a daemon and reuses across tasks.
Everything network is built here, inside ``read()``: a ``Connection`` makes its ZeroMQ context
lazily in the process that first uses it, and we close it when the range is done (a generator's
``finally``), so no socket outlives its task or crosses a fork.

Why it is shaped like this:

- **Direct to the worker.** The router is a Python hop: measured here, 8 partitions x 1M
  100-byte records drained at ~1.3-2M records/s through the router and ~8M/s straight from the
  workers' endpoints. The planner sends each partition's worker endpoint along with its range;
  when it is an ``ipc://`` path that exists here and the bootstrap address is this host's (Spark
  local mode, or an executor beside the broker) we fetch there. A worker that no longer owns the partition answers NOT_OWNER and
  a dead endpoint times out: either way we carry on through the router.
- **One fetch in flight ahead.** As soon as a reply's header says where the next fetch starts,
  that fetch is sent, before this reply's bytes are turned into columns and handed to Spark; the
  broker works while we convert and Spark consumes.
- **Bounded by the plan.** ``max_records`` never asks past ``end`` and columns are trimmed to
  ``[start, end)`` (a reply may start inside an earlier batch), so a task reads exactly its range
  however often Spark retries it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from typing import Iterator

from tailrace.client import protocol as P
from tailrace.client.connection import Connection
from tailrace.client.errors import NotLeaderOrFollowerError, NotOwnerError, OffsetOutOfRangeError, TimeoutError_
from tailrace.client.records import Columns, batches_to_columns, iter_batches
from tailrace.client.security import curve_keys

from .errors import DataLossError
from .offsets import OffsetRange

log = logging.getLogger("tailrace.spark")

_fetch_reply = P.decoder(P.FetchReply)


def _host(endpoint: str) -> str:
    return endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


@functools.lru_cache(maxsize=16)
def is_local_host(host: str) -> bool:
    """Whether ``host`` is an address of this machine: binding a socket to it succeeds only then."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((addr[0], 0))
        return True
    except OSError:
        return False


def reachable(endpoint: str | None, bootstrap: str) -> bool:
    """Whether a worker endpoint is this broker's and usable from this process.

    An ``ipc://`` path only if the bootstrap is on this very host: another host may run its own
    broker whose data directory, hence ipc path, has the same name. A ``tcp://`` endpoint only on
    the bootstrap's host (a loopback address seen from another executor host is that host's own).
    """
    if not endpoint:
        return False
    if endpoint.startswith("ipc://"):
        local = bootstrap.startswith("ipc://") or (bootstrap.startswith("tcp://") and is_local_host(_host(bootstrap)))
        return local and os.path.exists(endpoint[len("ipc://"):])
    return endpoint.startswith("tcp://") and bootstrap.startswith("tcp://") and _host(endpoint) == _host(bootstrap)


PLACE_OFFSET = 1 << 62  # a fetch here is answered OFFSET_OUT_OF_RANGE at once, without data


def place(conn: Connection, topic: str, partitions: list[int], timeout_ms: int = 10_000) -> None:
    """Make each partition's worker take it up, so it serves direct requests.

    A worker adopts a partition when the router first forwards a request for it (with the
    owner epoch); until then it answers direct requests NOT_OWNER, as right after a topic is
    created or the broker restarted. One routed fetch per partition, far past any data, does
    it: all sent at once, every answer (an error, by design) awaited and dropped.
    """
    header = P.encode(P.FetchRequest(PLACE_OFFSET, 1, 1, 0, "memory"))
    rids = [conn.send(P.Op.FETCH, topic, p, header) for p in partitions]
    for rid in rids:
        conn.wait_for(rid, timeout_ms)


class RangeFetcher:
    """Fetches one range; iterate it once. Not thread-safe (one per task, like its socket)."""

    def __init__(self, bootstrap: str, r: OffsetRange, *, endpoint: str | None = None, max_bytes: int = 4 << 20,
                 isolation: str = "durable", timeout_ms: int = 30_000, fail_on_data_loss: bool = True,
                 security: tuple = ()):
        self.bootstrap = bootstrap
        self.keys = curve_keys(**dict(security)) if security else None
        self.range = r
        self.endpoint = endpoint if reachable(endpoint, bootstrap) else bootstrap
        self.max_bytes = max_bytes
        self.isolation = isolation
        self.timeout_ms = timeout_ms
        self.fail_on_data_loss = fail_on_data_loss
        self.conn: Connection | None = None
        self._first = 0  # request id of the first fetch, once start() sent it
        self._leader_moves = 0  # a cluster: NOT_LEADER_OR_FOLLOWER replies followed to the leader they named

    def _send(self, offset: int) -> int:
        req = P.FetchRequest(offset, self.max_bytes, self.range.end - offset, 0, self.isolation)
        return self.conn.send(P.Op.FETCH, self.range.topic, self.range.partition, P.encode(req))

    def _to_router(self, why: str) -> None:
        log.info("fetching %s/%d through the router: %s", self.range.topic, self.range.partition, why)
        self.conn.close()
        self.endpoint = self.bootstrap
        self.conn = Connection(self.bootstrap, keys=self.keys)

    def _wait(self, rid: int, offset: int) -> tuple[int, P.FetchReply, object]:
        """The reply to fetch ``rid`` at ``offset`` (resent through the router if the worker
        cannot serve it); returns (offset the reply starts at, reply header, body)."""
        while True:
            try:
                reply = self.conn.wait_for(rid, self.timeout_ms)
                reply.raise_for_code()
                return offset, _fetch_reply.decode(reply.header), reply.body
            except (NotOwnerError, TimeoutError_) as exc:
                if self.endpoint == self.bootstrap:
                    raise
                self._to_router(f"{type(exc).__name__}: {exc}")
            except NotLeaderOrFollowerError as exc:  # a cluster: the partition's leader is another broker
                leader = exc.details.get("endpoint") or ""
                self._leader_moves += 1
                if not leader or self._leader_moves > 3:
                    raise
                log.info("fetching %s/%d from its leader at %s", self.range.topic, self.range.partition, leader)
                self.conn.close()
                self.endpoint = self.bootstrap = leader
                self.conn = Connection(leader, keys=self.keys)
            except OffsetOutOfRangeError as exc:
                offset = self._data_loss(offset, exc.details.get("log_start_offset", -1), exc.details.get("high_watermark", -1))
                if offset >= self.range.end:
                    return offset, None, None
            rid = self._send(offset)

    def _data_loss(self, offset: int, log_start: int, hw: int) -> int:
        """Where to carry on after the log no longer holds ``offset`` (or raise)."""
        r = self.range
        message = (f"topic={r.topic!r} partition={r.partition}: offset {offset} of the planned range "
                   f"[{r.start}, {r.end}) is not in the log, which holds [{log_start}, {hw})")
        if self.fail_on_data_loss:
            raise DataLossError(message + "; set failOnDataLoss=false to read what is left")
        log.warning("%s; skipping (failOnDataLoss=false)", message)
        return log_start if offset < log_start else r.end

    def start(self) -> None:
        """Open the connection and send the first fetch, without waiting for its reply (so a task
        with several ranges has them all asked for at once). Iterating starts it if not started."""
        r = self.range
        if self.conn is not None or r.start >= r.end:
            return
        self.conn = Connection(self.endpoint, keys=self.keys)
        self._first = self._send(r.start)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def __iter__(self) -> Iterator[Columns]:
        r = self.range
        if r.start >= r.end:
            return
        self.start()
        try:
            offset = r.start
            rid = self._first
            while offset < r.end:
                offset, info, body = self._wait(rid, offset)
                if info is None:
                    return
                nxt = info.next_offset
                if body is None or len(body) == 0 or nxt <= offset:
                    # Nothing past `offset`: the watermark is below the planned end.
                    nxt = self._data_loss(offset, info.log_start_offset, min(info.high_watermark, offset))
                    if nxt >= r.end:
                        return
                    rid = self._send(nxt)
                    offset = nxt
                    continue
                if nxt < r.end:
                    rid = self._send(nxt)  # in flight while this reply is converted and consumed
                buf = body.buffer if hasattr(body, "buffer") else body
                cols = batches_to_columns(iter_batches(buf), offset, r.end)
                offset = nxt
                if len(cols):
                    yield cols
        finally:
            self.conn.close()
