"""``AsyncConsumer``: ``Consumer`` for asyncio (aio.py says what the asyncio client shares
with the blocking one), and ``_Bell``, the doorbell it sleeps on when it reads the rings on the
same host (same_host=True).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from typing import Iterable

from . import protocol as P
from . import group as group_mod
from .admin import AdminCalls
from .aio_connection import AsyncPool, AsyncRoutes
from .connection import CONNECT_TIMEOUT_MS, Reply
from .errors import ConnectionLostError, InvalidRequestError, NotCoordinatorError, NotReadyError, TimeoutError_
from .security import curve_keys
from .consumer import (EARLIEST, RING_WAIT_S, ConsumerCore, OffsetAndTimestamp, Record, found_times,
                       times_by_topic)
from .records import Columns

__all__ = ["AsyncConsumer"]


class _Bell:
    """An AsyncConsumer's doorbell for same-host ring reads: an abstract Unix datagram socket
    (no file, gone with the process) the workers ring with one byte (WATCH). ``on_ring`` runs in
    the loop when one comes. Rings are taken out only when the loop hands them over (all that
    wait: a busy reader finds several), never before a look at the rings: one that comes after
    the look is still in the socket and wakes the next sleep."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_ring):
        self.loop = loop
        self.name = f"{P.WATCH_BELL_PREFIX}{os.getpid()}-{os.urandom(8).hex()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(b"\x00" + self.name.encode())
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.on_ring = on_ring
        self.rings = 0  # rings taken (a diagnostic: a reader that never hears one sleeps on its timer)
        loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        recv, n = self.sock.recv, 0
        try:
            while True:
                recv(64)
                n += 1
        except (BlockingIOError, InterruptedError):
            pass
        if n:
            self.rings += n
            self.on_ring()

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


class AsyncConsumer(ConsumerCore):
    """``Consumer`` for asyncio: ``assign``, ``poll``, ``poll_columns``, ``poll_raw``, ``seek``,
    ``position``, long-polling fetches, groups (``group=``, ``subscribe``, ``commit``,
    ``committed``), the same options."""

    def __init__(self, bootstrap: str | None = None, *, direct: bool = True, same_host: bool = False,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None,
                 group: str | None = None, **options):
        options = self._group_options(group, options)
        super().__init__(**options)
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, self._reply, curve_keys(key_file, server_key),
                              on_lost=self._lost)
        self.routes = AsyncRoutes(self.pool, direct, same_host)
        self.same_host = same_host
        self._replies: deque[Reply] = deque()
        self._coordinator: str | None = None  # a cluster: the group's coordinator, once a broker named it
        self._waiter: asyncio.Future | None = None  # what a poll sleeps on (see _sleep)
        # same_host: the doorbell the workers ring (WATCH), and each ring-read topic's owners
        self._bell: _Bell | None = None
        self._owners: dict[str, set[str]] = {}  # topic -> its owners' Unix endpoints
        self._recheck: asyncio.Future | None = None  # the once-a-second describe and WATCH (_read_rings_now)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its polls run on (the first one's)

    def _route(self, topic: str, partition: int) -> str | None:
        return self.routes.endpoint(topic, partition)

    def _reply(self, r: Reply) -> None:
        self._replies.append(r)
        self._wake()

    def _lost(self, via: str | None) -> None:
        self._connection_lost(via)
        self._wake()  # the poll sends its fetches again

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _sleep(self, seconds: float) -> None:
        """Until a reply comes or the bell rings, at most ``seconds`` (one future and one timer,
        not a task per wait)."""
        loop = self._loop
        if loop is None:  # asked once: get_running_loop makes a getpid system call each time
            loop = self._loop = asyncio.get_running_loop()
        w = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _resolve, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None

    async def list_offsets(self, topic: str, timestamp_ms: int | None = None) -> list[P.PartitionOffsets]:
        c = AdminCalls.list_offsets(topic, timestamp_ms)
        return c.parse(await self.pool.request(c.op, c.topic, c.partition, c.header))

    async def offsets_for_times(self, timestamps: dict[tuple[str, int], int]) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
        """As ``Consumer.offsets_for_times``."""
        out = {}
        for (topic, ts), parts in times_by_topic(timestamps).items():
            out.update(found_times(topic, await self.list_offsets(topic, ts), parts))
        return out

    async def seek_to_time(self, topic: str, timestamp_ms: int, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """As ``Consumer.seek_to_time``."""
        if int(timestamp_ms) < 0:
            raise InvalidRequestError(f"timestamp {timestamp_ms}: milliseconds since the epoch, >= 0")
        return self._seek_times(topic, await self.list_offsets(topic, timestamp_ms), partitions)

    async def assign(self, topic: str, partitions: Iterable[int] | None = None, start: str | int = EARLIEST) -> None:
        self._assign_from(topic, await self.list_offsets(topic), partitions, start)
        await self._group_assigned(topic)

    # --- consumer groups (client/group.py) -----------------------------------------------------
    async def _group(self, gen):
        timeout = max(10_000, int(self.request_timeout_s * 1000))
        return await group_mod.run_async(gen, lambda op, topic, header: self._group_request(op, topic, header, timeout),
                                         self._group_assigned)

    async def _group_request(self, op: int, topic, header: bytes, timeout: int):
        """A group request to the group's coordinator: the bootstrap broker, or the one a
        NOT_COORDINATOR reply named (a cluster); back to the bootstrap when that one is lost."""
        for _ in range(3):
            endpoint = self._coordinator
            try:
                return await self.pool.request(op, topic, header=header, timeout_ms=timeout, endpoint=endpoint)
            except NotCoordinatorError as exc:
                self._coordinator = group_mod.coordinator_endpoint(exc)
            except (ConnectionLostError, TimeoutError_) as exc:
                if endpoint is None:
                    raise
                self._coordinator = None
                raise NotReadyError(f"the group's coordinator at {endpoint} was lost ({exc}): asking again") from exc
        raise NotReadyError("the group's coordinator moved while it was being found: asking again")

    async def _group_assigned(self, topic: str) -> None:
        """Partitions of ``topic`` were assigned: learn where their owners are before the first
        fetch (as Consumer), and on the same host map and watch their rings."""
        if self.same_host:
            await self._attach_rings(topic)
        elif self.routes.due(topic):
            try:
                await self.routes.describe(topic)
            except Exception:  # noqa: BLE001 - the router path works meanwhile
                self.routes.failed(topic)

    # --- same-host ring reads (same_host=True; ConsumerCore does the reading) -----------------------
    async def _attach_all(self, topics: list[str]) -> None:
        for topic in topics:
            await self._attach_rings(topic)

    async def _attach_rings(self, topic: str) -> None:
        """Describe ``topic``, map its rings and ask every owner to ring the bell (WATCH); on any
        failure the topic is read with fetches (over the Unix sockets where they work)."""
        try:
            r = await self.pool.request(P.Op.DESCRIBE_TOPIC, topic)
            d = P.decoder(P.DescribeReply).decode(r.header)
            self.routes.learn(topic, d)
            self._map_rings(topic, d)
            self._owners[topic] = {pi.local_endpoint for pi in d.partitions if pi.local_endpoint}
            if len(self._owners[topic]) < len({pi.worker for pi in d.partitions}):
                raise ConnectionError("a partition's owner has no Unix socket to WATCH on")
            await self._watch(topic)
        except Exception as exc:  # noqa: BLE001 - any reason to not read the rings is a reason to fetch
            self.routes.failed(topic)
            self._rings_failed(topic, exc)
        self._rings_mapped()

    async def _watch(self, topic: str) -> None:
        """WATCH every ring-read slot at every owner seen (a slot rings only where it is
        appended, so a partition that moves between them is still heard)."""
        if self._bell is None:
            self._bell = _Bell(asyncio.get_running_loop(), self._wake)
        slots = sorted({a.tail.slot for a in self.assigned.values() if a.tail is not None})
        header = P.encode(P.WatchRequest(self._bell.name, slots, self.isolation))
        endpoints = sorted(set().union(*self._owners.values()))
        timeout = int(self.request_timeout_s * 1000)
        got = await asyncio.gather(*(self.pool.request(P.Op.WATCH, topic, header=header, endpoint=ep, timeout_ms=timeout)
                                     for ep in endpoints), return_exceptions=True)
        for r in got:
            if isinstance(r, BaseException):
                raise r

    def _read_rings_now(self, out: list) -> None:
        """One look at the rings (same_host): the once-a-second describe and WATCH go in a task
        (awaited here, their round trips held up every record that came in the while), then
        every moved partition is read. A ring that comes after the look wakes the poll's sleep
        (_Bell)."""
        due = self._rings_due(every_topic=True)  # follows moves, reconnects, a new memory
        if due and (self._recheck is None or self._recheck.done()):
            self._recheck = asyncio.ensure_future(self._attach_all(due))
        self._read_rings(out)

    async def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """As ``Consumer.commit``."""
        m = self._member()
        return await self._group(m.commit_positions(sorted(self.assigned)) if offsets is None else m.commit(dict(offsets)))

    async def committed(self, partitions: Iterable[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """As ``Consumer.committed``."""
        return await self._group(self._member().committed(None if partitions is None else list(partitions)))

    async def poll_raw(self, timeout_ms: int = 1000) -> list:
        """Fetch replies with data, as (partition state, start offset, reply, body buffer)."""
        self._raise_deferred()
        if self.membership is not None and self.membership.due():
            await self._group(self.membership.step())
        deadline = time.monotonic() + timeout_ms / 1000
        out: list = []
        while True:
            if self.same_host:  # the rings first; fetches only for what is not read from them
                self._read_rings_now(out)
                if self._fetching:
                    self._send_fetches(self.max_wait_ms, fetch_only=True)
            else:
                self._send_fetches(self.max_wait_ms)
            while self._replies:
                if not self._take_or_defer(self._replies.popleft(), out):
                    return out
            if out:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            # until a reply or a ring; a ring reader looks every RING_WAIT_S anyway (a lost ring
            # costs that much latency, never data)
            await self._sleep(min(left, RING_WAIT_S) if self.same_host else left)

    async def poll_columns(self, timeout_ms: int = 1000) -> list[tuple[str, int, Columns]]:
        """Fetched records as columns, per partition (numpy only: no object per message)."""
        return self._to_columns(await self.poll_raw(timeout_ms))

    async def poll(self, timeout_ms: int = 1000) -> list[Record]:
        return self._to_records(await self.poll_columns(timeout_ms))

    async def close(self) -> None:
        if self.membership is not None:
            await self._group(self.membership.leave())
        if self._recheck is not None:
            self._recheck.cancel()
        self._drop_rings()
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        self.routes.close()
        self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _resolve(f: asyncio.Future) -> None:
    if not f.done():
        f.set_result(None)
