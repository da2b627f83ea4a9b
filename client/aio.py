"""The asyncio client: ``AsyncAdmin``, ``AsyncProducer``, ``AsyncConsumer``, ``AsyncShareConsumer``.

The same names, options and semantics as the blocking client (admin.py, producer.py,
consumer.py), and the same protocol logic: the batching, sequence numbers, retries, routing and
reply handling are ``ProducerCore``, ``ConsumerCore``, ``Routes`` and ``AdminCalls``, shared with
the blocking classes; only the I/O is here (``AsyncProducer``, ``AsyncAdmin``), in aio_consumer.py
(``AsyncConsumer``), aio_share.py (``AsyncShareConsumer``) and aio_connection.py (``AsyncPool``,
``AsyncRoutes``). ZeroMQ DEALERs and the workers' same-host Unix sockets (unixwire.py) are both
read with the event loop's ``add_reader`` on their file descriptors (_ZmqLink says why not
``zmq.asyncio``). No thread, no per-call executor; works under uvloop.

Producing::

    async with AsyncProducer("127.0.0.1:7420", acks="durable") as p:
        ack = await p.send("orders", b"...")        # Ack(topic, partition, offset, timestamp)

``send`` queues the record at once (in call order) and returns a future. Many coroutines may
share one producer: records for one partition from all of them join one batch while the
partition's previous batch is in flight (``max_in_flight_per_partition``, 1 by default, keeps
order through retries), and each future resolves with its own record's offset.

Cancellation: cancelling a send's future (or the coroutine awaiting it) before its record is
sealed into a batch withdraws the record (it is never stored); after that, the batch goes as it
is (its other records belong to other coroutines) and the cancelled record is stored once. The
producer's state never depends on who is still waiting.

Consuming: ``AsyncConsumer`` fetches with long polls, like ``Consumer``. With ``same_host=True``
it reads the shared-memory rings as ``Consumer`` does (ring_reader.py; what is below a ring is
fetched over the workers' Unix sockets). The futex a blocking reader sleeps on cannot be polled
by an event loop, so it sleeps on a doorbell instead: an abstract Unix datagram socket
(``_Bell``, aio_consumer.py), read with ``add_reader``, that every worker owning a partition it
reads rings when it appends to it (WATCH, docs/PROTOCOL.md 8d).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Sequence

from .admin import AdminCalls, Call, other_brokers
from .accumulator import batch_times, header_bytes
from .aio_connection import AsyncPool, AsyncRoutes
from .aio_consumer import AsyncConsumer
from .aio_share import AsyncShareConsumer
from .delayed import DelayedProduceReply, delayed_request, reply_decoder
from .connection import CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, Reply
from .sections import HeaderArrays
from .security import curve_keys
from .consumer import Record
from .share import ShareRecord
from .errors import TailraceError, TimeoutError_
from .producer import TIMEOUT_SCAN_S, Ack, ProducerCore
from . import protocol as P
from . import share_protocol as S

__all__ = ["Ack", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "AsyncShareConsumer", "Record", "ShareRecord"]


class AsyncProducer(ProducerCore):
    """``Producer`` for asyncio: the same options (``acks``, ``linger_ms``, ``batch_records``,
    ``partitioner``, ``idempotent``, ``direct``, ``same_host``...). Create it inside the event
    loop that uses it."""

    def __init__(self, bootstrap: str | None = None, *, direct: bool = True, same_host: bool = False,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None, **options):
        super().__init__(**options)
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, self._reply, curve_keys(key_file, server_key),
                              on_lost=self._lost)
        self.routes = AsyncRoutes(self.pool, direct, same_host)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kicked = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._flushers: list[asyncio.Future] = []
        self._waiting_meta: dict[str, deque] = {}  # topic -> sends waiting for its partition count
        # sends waiting for room in buffer_memory, in call order: deque of (deadline, nbytes, item),
        # item as _waiting_meta's; each fails with TimeoutError_ at its deadline (max_block_ms)
        self._blocked: deque = deque()
        self.closed = False

    def _route(self, topic: str, partition: int) -> str | None:
        return self.routes.endpoint(topic, partition)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # --- sending -------------------------------------------------------------------------
    async def partitions_for(self, topic: str) -> int:
        return await self.routes.partitions(topic)

    def send(self, topic: str, value: bytes, key: bytes | None = None, headers=None, timestamp_ms: int | None = None,
             partition: int | None = None) -> asyncio.Future:
        """Queue one record now (headers and create time as ``Producer.send``'s); the returned
        future resolves with its ``Ack`` (or raises the error that stopped it). ``await
        p.send(...)`` waits for the acknowledgement."""
        if isinstance(headers, int) and not isinstance(headers, bool):  # send(topic, value, key, partition): a
            partition, headers = headers, None  # call written before headers took the fourth place
        fut = self.loop.create_future()
        if self.closed:
            fut.set_exception(RuntimeError("the producer is closed"))
            return fut
        extra = None if headers is None and timestamp_ms is None else (headers, None if timestamp_ms is None else int(timestamp_ms) * 1000)
        item = ("one", value, key, partition, extra, fut)
        n = self.routes.partitions_of.get(topic)
        if topic in self._waiting_meta or (n is None and (partition is None or self.routes.direct)):
            # learn the topic first (as the blocking producer does, inline): where its partitions
            # are, so even the first request goes straight to the owner; behind earlier sends
            self._wait_meta(topic, item)
            return fut
        self._queue_item(topic, item, n)
        self._kick()
        return fut

    def _queue_item(self, topic: str, item, n: int) -> None:
        """Queue a send whose topic's partition count ``n`` is known: now, or behind the sends
        waiting for room in ``buffer_memory`` (its future raises ``TimeoutError_`` if none comes
        within ``max_block_ms``). A record over the broker's batch limit fails at once."""
        kind, values, keys, partition, extra, fut = item
        if kind == "one":
            more = 0 if extra is None else header_bytes(extra[0]) + (8 if extra[1] is not None else 0)
            exc = self._too_large(values, keys, more)
            if exc is not None:
                fut.set_exception(exc)
                return
            nbytes = len(values) + (0 if keys is None else len(keys)) + more
        elif kind == "buffers":  # values: (values, value_offsets, keys, key_offsets) of one joined batch
            nbytes = len(values[0]) + (0 if values[2] is None else len(values[2]))
        else:
            nbytes = sum(map(len, values)) + (0 if keys is None else sum(map(len, keys)))
        if self._blocked or not self._room(nbytes):
            self._blocked.append((time.monotonic() + self.max_block_s, nbytes, topic, item, n))
            return
        if kind == "one":
            tp = (topic, self._choose(topic, keys, partition, n))
            if extra is None:
                self._add(tp, values, keys, fut)
            else:
                self._add(tp, values, keys, fut, extra[0], extra[1], more)
            return
        if kind == "buffers":
            tp = (topic, partition)
            self._queue_buffers(tp, *values, *(extra or ()))
            frame, count, _w = self._ready[tp][-1]
            self._ready[tp][-1] = (frame, count, [fut])
            return
        futs = []
        hs, ts = extra or (None, None)
        groups = [(partition, values, keys, hs, ts)] if partition is not None else self._split_batch(topic, values, keys, n, hs, ts)
        for p, vs, ks, hg, tg in groups:
            futs += self._queue_futures((topic, p), vs, ks, hg, tg)
        g = asyncio.gather(*futs)
        g.add_done_callback(lambda g, fut=fut: _copy_outcome(g, fut))

    def _admit(self) -> None:
        """Queue the sends that waited for room, in order, as far as it goes; fail those whose
        ``max_block_ms`` ran out."""
        q = self._blocked
        now = time.monotonic()
        while q:
            deadline, nbytes, topic, item, n = q[0]
            fut = item[-1]
            if fut.done():  # cancelled while it waited
                q.popleft()
            elif self._room(nbytes):
                q.popleft()
                blocked, self._blocked = self._blocked, deque()
                self._queue_item(topic, item, n)
                self._blocked = blocked
            elif now >= deadline:
                q.popleft()
                fut.set_exception(TimeoutError_(
                    f"buffer full: {self._buffered_bytes} bytes queued or unacknowledged, buffer_memory="
                    f"{self.buffer_memory}; no room for {nbytes} more within max_block_ms={self.max_block_s * 1000:g}"))
            else:
                break

    async def send_delayed(self, topic: str, values: Sequence[bytes], *, partition: int, keys: Sequence[bytes] | None = None,
                           headers: Sequence | None = None, deliver_at_ms: int | None = None,
                           deliver_after_ms: int | None = None) -> DelayedProduceReply:
        """``Producer.send_delayed``: one batch appended to ``partition`` at one time, not before."""
        header, batch = delayed_request(values, keys, headers, deliver_at_ms, deliver_after_ms)
        r = await self.pool.request(P.Op.PRODUCE_DELAYED, topic, partition, header, body=batch, timeout_ms=30_000)
        return reply_decoder.decode(r.header)

    def send_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes] | None = None,
                   partition: int | None = None, headers: Sequence | None = None,
                   timestamps_ms: Sequence[int] | None = None) -> asyncio.Future:
        """Queue many values now (grouped, with headers and create times, as
        ``Producer.send_batch`` does); the future resolves with one ``Ack`` per batch sent (its
        first record's offset)."""
        if not values:
            f = self.loop.create_future()
            f.set_result([])
            return f
        known = topic in self.routes.partitions_of and topic not in self._waiting_meta
        f = self.loop.create_future()
        times = batch_times(timestamps_ms, len(values))
        item = ("batch", values, keys, partition, None if headers is None and times is None else (headers, times), f)
        if known or (partition is not None and not self.routes.direct):
            self._queue_item(topic, item, self.routes.partitions_of.get(topic, 0))
        else:
            self._wait_meta(topic, item)
            return f
        self._kick()
        return f

    def send_buffers(self, topic: str, values, value_offsets, partition: int | None = None, keys=None,
                     key_offsets=None, headers: HeaderArrays | None = None, timestamps_us=None) -> asyncio.Future:
        """``Producer.send_buffers``: one pre-joined batch; resolves with its first offset's ``Ack``
        (the partition must be given, or the topic's partitions known: ``await partitions_for``)."""
        if partition is None:
            n = self.routes.partitions_of.get(topic)
            if n is None:
                raise ValueError(f"partitions of {topic!r} not known yet: await partitions_for({topic!r}) first")
            partition = self._choose(topic, None, None, n)
        f = self.loop.create_future()
        # held back like every send while buffer_memory is full (``_queue_item``)
        extra = None if headers is None and timestamps_us is None else (headers, timestamps_us)
        self._queue_item(topic, ("buffers", (values, value_offsets, keys, key_offsets), None, partition, extra, f), 0)
        self._kick()
        return f

    def _queue_futures(self, tp, values, keys, headers=None, times=None) -> list:
        before = len(self._ready.get(tp, ()))
        self._queue_batch(tp, values, keys, headers, times)
        q = self._ready[tp]
        futs = []
        for i in range(before, len(q)):
            frame, count, _w = q[i]
            f = self.loop.create_future()
            q[i] = (frame, count, [f])
            futs.append(f)
        return futs

    def _wait_meta(self, topic: str, item) -> None:
        q = self._waiting_meta.get(topic)
        if q is None:
            q = self._waiting_meta[topic] = deque()
            asyncio.ensure_future(self._learn_then_queue(topic))
        q.append(item)

    async def _learn_then_queue(self, topic: str) -> None:
        """Ask for ``topic``'s partitions, then queue the sends that waited, in order (or fail
        them with the reason: UNKNOWN_TOPIC, a broker that does not answer...)."""
        try:
            n = await self.routes.partitions(topic)
            error = None
        except Exception as exc:  # noqa: BLE001 - handed to every waiting send
            n, error = 0, exc
        q = self._waiting_meta.pop(topic, deque())
        for item in q:
            partition, fut = item[3], item[5]
            if error is not None and (partition is None or not getattr(error, "retriable", False)):
                if not fut.done():
                    fut.set_exception(error)
                continue  # (a named partition after a retriable error goes by the router: retries cover it)
            if fut.cancelled():
                continue
            self._queue_item(topic, item, n)
        self._kick()

    # --- driving -------------------------------------------------------------------------
    def _reply(self, r: Reply) -> None:
        self._on_reply(r)
        self._kick()

    def _lost(self, via: str | None) -> None:
        self._connection_lost(via)
        self._kick()

    def _kick(self) -> None:
        """Run ``_step`` once, after what is ready to run now: coroutines woken by acks send
        their next records first, so those join one batch instead of going one by one."""
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._step)

    def _step(self) -> None:
        self._kicked = False
        if self._blocked:
            self._admit()
        self._advance()
        if self._flushers and self._oneway and not (self._ready or self._retry or self._lingering):
            self._send_barriers()  # acks="none": the round trips that close a flush (producer.py)
        self._scan_timeouts()
        due = self._next_due()
        if self._blocked:
            due = self._blocked[0][0] if due is None else min(due, self._blocked[0][0])
        if self._inflight:
            t = self.loop.time() + TIMEOUT_SCAN_S  # request timeouts are watched while anything is out
            due = t if due is None else min(due, t)
        if due is not None and (self._timer is None or due < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = self.loop.call_at(max(due, self.loop.time()), self._on_timer)
        if self._flushers and not (self.busy or self._blocked or self._oneway):
            for f in self._flushers:
                if not f.done():
                    f.set_result(None)
            self._flushers.clear()

    def _on_timer(self) -> None:
        self._timer = None
        self._step()

    async def poll(self, timeout_ms: int = 0) -> None:
        """Replies are taken in as they come; this only gives the loop ``timeout_ms``."""
        await asyncio.sleep(timeout_ms / 1000)

    async def flush(self, timeout_ms: int = 60_000) -> int:
        """Send everything queued and wait for every ack; return records acked so far. Raises
        the first permanent error of a batch no future was told of (``send_batch``'s are)."""
        while self._waiting_meta:
            await asyncio.sleep(0.001)
        self._seal_all()
        if self.busy or self._blocked or self._oneway:
            f = self.loop.create_future()
            self._flushers.append(f)
            self._kick()
            try:
                await asyncio.wait_for(f, timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise TimeoutError_(f"flush timed out with {len(self._inflight)} batches in flight") from None
        self._take_errors()
        return self.acked_records

    async def close(self) -> None:
        if self.closed:
            return
        try:
            await self.flush()
        finally:
            self.closed = True
            if self._timer is not None:
                self._timer.cancel()
            self.routes.close()
            self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _copy_outcome(src: asyncio.Future, dst: asyncio.Future) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif src.exception() is not None:
        dst.set_exception(src.exception())
    else:
        dst.set_result(src.result())


class AsyncAdmin:
    """``Admin`` for asyncio: the same operations, awaited."""

    def __init__(self, bootstrap: str | None = None, timeout_ms: int = 10_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, *, key_file=None, server_key=None):
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, keys=curve_keys(key_file, server_key))
        self.timeout_ms = timeout_ms

    async def _call(self, c: Call):
        return c.parse(await self.pool.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms))

    async def create_topic(self, name: str, partitions: int, ring_bytes: int = 0, config: dict | None = None,
                           replication_factor: int = 0) -> P.TopicInfo:
        return await self._call(AdminCalls.create_topic(name, partitions, ring_bytes, config, replication_factor))

    async def list_topics(self, internal: bool = False) -> list[P.TopicInfo]:
        return await self._call(AdminCalls.list_topics(internal))

    async def describe_topic(self, name: str) -> P.DescribeReply:
        return await self._call(AdminCalls.describe_topic(name))

    async def list_offsets(self, name: str, timestamp_ms: int | None = None) -> list[P.PartitionOffsets]:
        return await self._call(AdminCalls.list_offsets(name, timestamp_ms))

    async def alter_configs(self, name: str, config: dict) -> P.TopicInfo:
        return await self._call(AdminCalls.alter_configs(name, config))

    async def create_partitions(self, name: str, total: int) -> P.TopicInfo:
        return await self._call(AdminCalls.create_partitions(name, total))

    async def reassign_partitions(self, name: str, partitions: dict[int, list[int]]) -> list[P.PartitionReassignment]:
        return await self._call(AdminCalls.reassign_partitions(name, partitions))

    async def delete_topic(self, name: str) -> P.TopicInfo:
        return await self._call(AdminCalls.delete_topic(name))

    async def list_groups(self) -> list[P.GroupInfo]:
        groups = {g.group: g for g in await self._call(AdminCalls.list_groups())}
        for endpoint in other_brokers(await self.status()):  # a cluster: each broker lists its own groups
            c = AdminCalls.list_groups()
            try:
                found = c.parse(await self.pool.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms,
                                                        endpoint=endpoint))
            except TailraceError:  # gone, not ready, refused: its groups are left out
                continue
            for g in found:
                groups.setdefault(g.group, g)
        return sorted(groups.values(), key=lambda g: g.group)

    async def describe_group(self, group: str) -> P.GroupInfo:
        return await self._call(AdminCalls.describe_group(group))

    async def delete_group(self, group: str) -> None:
        return await self._call(AdminCalls.delete_group(group))

    async def committed(self, group: str, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
        return await self._call(AdminCalls.committed(group, topics))

    async def reset_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        return await self._call(AdminCalls.commit(group, offsets))

    async def list_share_groups(self) -> list[str]:
        return await self._call(AdminCalls.list_share_groups())

    async def describe_share_group(self, group: str) -> S.ShareGroupInfo:
        """``Admin.describe_share_group``: in a cluster every broker's part, merged."""
        info = await self._call(AdminCalls.describe_share_group(group))
        infos = [info]
        for ep in info.brokers:
            try:
                r = await self.pool.request(P.Op.DESCRIBE_SHARE_GROUP, group, -1, timeout_ms=self.timeout_ms, endpoint=ep)
            except TailraceError:
                continue
            infos.append(P.decoder(S.ShareGroupInfo).decode(r.header))
        return S.merge_infos(infos) if info.brokers else info

    async def alter_share_group(self, group: str, config: dict[str, str]) -> S.ShareGroupInfo:
        info = await self._call(AdminCalls.alter_share_group(group, config))
        return await self.describe_share_group(group) if info.brokers else info

    async def status(self) -> dict:
        return await self._call(AdminCalls.status())

    async def set_workers(self, workers: int) -> dict:
        return await self._call(AdminCalls.set_workers(workers))

    async def close(self) -> None:
        self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
