"""The asyncio client: ``AsyncAdmin``, ``AsyncProducer``, ``AsyncConsumer``.

The same names, options and semantics as the blocking client (admin.py, producer.py,
consumer.py), and the same protocol logic: the batching, sequence numbers, retries, routing and
reply handling are ``ProducerCore``, ``ConsumerCore``, ``Routes`` and ``AdminCalls``, shared with
the blocking classes; only the I/O is here. ZeroMQ DEALERs and the workers' same-host Unix
sockets (unixwire.py) are both read with the event loop's ``add_reader`` on their file
descriptors (_ZmqLink says why not ``zmq.asyncio``). No thread, no per-call executor; works
under uvloop.

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
(``_Bell``), read with ``add_reader``, that every worker owning a partition it reads rings
when it appends to it (WATCH, docs/PROTOCOL.md 8d).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
from collections import deque
from typing import Iterable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as P
from . import group as group_mod
from . import unixwire
from .admin import AdminCalls, Call
from .connection import (CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, DROP_EVENTS, HANDSHAKE_EVENTS, Reply, handshake_refused,
                         parse_bootstrap, parse_reply, request_frames, take_drops)
from .security import CurveKeys, curve_keys
from .consumer import (EARLIEST, RING_WAIT_S, ConsumerCore, OffsetAndTimestamp, Record, found_times,
                       times_by_topic)
from .errors import BootstrapError, BrokerUnavailableError, ConnectionLostError, TimeoutError_
from .producer import TIMEOUT_SCAN_S, Ack, ProducerCore
from .records import Columns
from .routes import Routes

__all__ = ["Ack", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Record"]


class _ZmqLink:
    """One ZeroMQ DEALER driven by the event loop.

    The socket's ``FD`` is registered with ``loop.add_reader``; it signals that the socket's
    events changed (edge-triggered), so each wake-up, and each send (which may consume the
    signal), is followed by reading every message ``EVENTS`` says is waiting. This is what
    zmq.asyncio does inside, without a future per send and per receive: a first version on
    ``zmq.asyncio.Socket.send_multipart``/``recv_multipart`` spent ~150 us per request and
    reply in pyzmq's future bookkeeping (enum flags, event rescheduling), more than the rest of
    the client (docs/BENCHMARKS.md, "The asyncio client"). The socket's monitor FD is watched
    the same way: for the connect-timeout wait (handshake events), then for the rest of its
    life for a closed connection (client/connection.py says why), which calls ``lost``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ctx: zmq.Context, endpoint: str, deliver, monitor: bool,
                 keys: CurveKeys | None = None, lost=None):
        self.endpoint = endpoint
        self.loop = loop
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.secured = keys is not None
        if keys is not None:
            keys.apply(self.sock)
        self.monitor = self.sock.get_monitor_socket(HANDSHAKE_EVENTS | DROP_EVENTS if monitor else DROP_EVENTS)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self._watching = False  # whether the loop watches the monitor's FD for drops
        self.lost = lost  # called with the endpoint when the connection closes (requests in flight are lost)
        try:
            self.sock.connect(endpoint)
        except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
            self.close()
            raise BootstrapError(f"cannot connect to {endpoint}: {exc}") from None
        self.deliver = deliver
        self.fd = self.sock.FD
        self.closed = False
        self._scheduled = False
        loop.add_reader(self.fd, self._readable)
        if not monitor:
            self._watch_drops()

    def _watch_drops(self) -> None:
        if self.monitor is not None and not self._watching:
            self._watching = True
            self.loop.add_reader(self.monitor.FD, self._on_monitor)
            self._on_monitor()  # (edge-triggered: an event already waiting would not wake it)

    def _on_monitor(self) -> None:
        if self.closed or self.monitor is None or not take_drops(self.monitor):
            return
        self._readable()  # the replies that came before the close are answers: take them first
        if self.lost is not None and not self.closed:
            self.lost(self.endpoint)

    def _readable(self) -> None:
        self._scheduled = False
        sock = self.sock
        for _ in range(_DRAIN_LIMIT):
            if self.closed or not P.socket_events(sock) & _POLLIN:
                return
            try:
                frames = P.recv_frames_nocopy(sock, P.NOBLOCK)
            except zmq.Again:
                return
            try:
                r = parse_reply(frames, self.endpoint)
            except Exception:  # noqa: BLE001 - not a reply of ours (a short frame): nothing to match it to
                continue
            self.deliver(r)
        self._again()  # more waiting: after the loop's other work

    def _again(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._readable)

    def send(self, frames: list) -> None:
        """Send now, never waiting; a full pipe (100,000 messages to a peer that reads
        nothing) raises ``TimeoutError_`` and nothing of the message is sent."""
        try:
            P.send_frames(self.sock, frames, P.NOBLOCK)
        except zmq.Again:
            raise TimeoutError_(f"{self.endpoint}: 100,000 requests queued and unread (not sent)") from None
        if P.socket_events(self.sock) & _POLLIN:  # the send may have taken the FD's signal
            self._again()

    async def handshake(self, timeout_ms: int) -> None:
        """Wait for the handshake monitor's event, the monitor's FD on the loop like the
        socket's. Its reader is removed before the monitor closes: a loop still watching a
        closed FD number misses every event of the next socket the kernel gives that number."""
        mon = self.monitor
        if mon is None:
            return
        done = self.loop.create_future()

        def check() -> None:
            while not done.done() and P.socket_events(mon) & _POLLIN:
                event = recv_monitor_message(mon, zmq.NOBLOCK)["event"]
                if event & HANDSHAKE_EVENTS:  # (a connection closed before its handshake says nothing yet)
                    done.set_result(event)

        fd = mon.FD
        self.loop.add_reader(fd, check)
        ok = False
        try:
            check()
            try:
                refused = handshake_refused(await asyncio.wait_for(done, timeout_ms / 1000), self.endpoint, self.secured)
                if refused is not None:
                    raise refused
                ok = True
            except asyncio.TimeoutError:
                raise BrokerUnavailableError(
                    f"no broker answered at {self.endpoint} within {timeout_ms / 1000:g} s "
                    "(is `tailrace serve` running?)") from None
        finally:
            self.loop.remove_reader(fd)
            if ok and not self.closed:
                self._watch_drops()
            else:
                self._stop_monitor()

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            if self._watching:
                self._watching = False
                self.loop.remove_reader(self.monitor.FD)
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(0)
            self.monitor = None

    def close(self) -> None:
        if getattr(self, "closed", True) is False:
            self.closed = True
            self.loop.remove_reader(self.fd)
        self._stop_monitor()
        self.sock.close(0)


_POLLIN = int(zmq.POLLIN)
_DRAIN_LIMIT = 256  # replies read per wake-up before the loop's other work runs


class _UnixLink:
    """A worker's same-host Unix socket (unixwire.py framing), driven by the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, endpoint: str, deliver, gone):
        self.endpoint = endpoint
        self.loop = loop
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(unixwire.path_of(endpoint))  # a local connect: never waits
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.reader = unixwire.FrameReader(1 << 30)
        self.deliver = deliver
        self.gone = gone  # called once when the worker closes the connection
        self._out = bytearray()  # what the kernel did not take yet
        self._rbuf = bytearray(unixwire.RECV_BYTES)
        self._rmv = memoryview(self._rbuf)
        self.closed = False
        loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            n = self.sock.recv_into(self._rbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if not n:
            self._lost()
            return
        self.reader.feed(self._rmv[:n])
        try:
            messages = self.reader.messages()
        except unixwire.WireError:
            self._lost()
            return
        for frames in messages:
            self.deliver(parse_reply(frames, self.endpoint))

    def send(self, frames: list) -> None:
        """Raises OSError when the worker is gone (the caller goes through the router)."""
        if self.closed:
            raise ConnectionError(f"{self.endpoint} is closed")
        bufs = unixwire.encode(frames)
        if self._out:  # keep order behind what waits
            self._out += b"".join(bufs)
            return
        total = sum(len(b) for b in bufs)
        try:
            sent = self.sock.sendmsg(bufs, [], socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < total:
            self._out += memoryview(b"".join(bufs))[sent:]
            self.loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self._out, socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._lost()
            return
        del self._out[:n]
        if not self._out:
            self.loop.remove_writer(self.sock.fileno())

    def _lost(self) -> None:
        if not self.closed:
            self.close()
            self.gone(self.endpoint)  # replies owed are lost, as over ZeroMQ: timeouts resend

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            fd = self.sock.fileno()
            self.loop.remove_reader(fd)
            if self._out:
                self.loop.remove_writer(fd)
            self.sock.close()


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


class AsyncPool:
    """The router link plus one link per worker endpoint, sharing one request-id space (the
    asyncio twin of connection.Pool). Replies to ``request`` go to their awaiting coroutine;
    every other reply to ``on_reply``. A link whose connection closes fails the ``request``s in
    flight on it with ``ConnectionLostError`` and calls ``on_lost(endpoint)`` (None: the router),
    as ``Pool`` does."""

    def __init__(self, bootstrap: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 on_reply=None, keys: CurveKeys | None = None, on_lost=None):
        self.router_endpoint = parse_bootstrap(bootstrap)
        self.keys = keys
        self.connect_timeout_ms = connect_timeout_ms
        self.on_reply = on_reply
        self.on_lost = on_lost
        self._ids = itertools.count(1)
        self._ctx: zmq.Context | None = None
        self._links: dict[str, object] = {}
        self._waiting: dict[int, asyncio.Future] = {}
        self._waiting_on: dict[int, str] = {}  # request id -> the endpoint its request went to (``request``)
        self._connected = connect_timeout_ms <= 0 or self.router_endpoint.startswith(unixwire.SCHEME)
        self._handshake: asyncio.Future | None = None
        self.closed = False

    def _link(self, endpoint: str):
        link = self._links.get(endpoint)
        if link is None:
            if self.closed:
                raise ConnectionError("the client is closed")
            if endpoint.startswith(unixwire.SCHEME):
                link = _UnixLink(asyncio.get_running_loop(), endpoint, self._deliver, self._lost)
            else:
                if self._ctx is None:
                    self._ctx = zmq.Context()
                monitor = endpoint == self.router_endpoint and not self._connected
                link = _ZmqLink(asyncio.get_running_loop(), self._ctx, endpoint, self._deliver, monitor, self.keys, self._lost)
            self._links[endpoint] = link
        return link

    def _lost(self, endpoint: str) -> None:
        """The connection to ``endpoint`` closed: what was in flight on it will not be answered."""
        if endpoint.startswith(unixwire.SCHEME):
            self.forget(endpoint)
        for rid, ep in list(self._waiting_on.items()):
            if ep == endpoint:
                f = self._waiting.pop(rid, None)
                del self._waiting_on[rid]
                if f is not None and not f.done():
                    f.set_exception(ConnectionLostError(
                        f"{endpoint} closed the connection before replying to request {rid} (a broker process "
                        "stopped, or a message over its frame limit): its fate is unknown"))
        if self.on_lost is not None:
            self.on_lost(None if endpoint == self.router_endpoint else endpoint)

    def settle(self) -> None:
        """(``Pool.settle``: the event loop reads each close as it comes, nothing is left over.)"""

    def _deliver(self, r: Reply) -> None:
        f = self._waiting.pop(r.request_id, None)
        if f is not None:
            if not f.done():
                f.set_result(r)
        elif self.on_reply is not None:
            self.on_reply(r)

    def send(self, endpoint: str | None, op: int, topic, partition: int, header: bytes = P.EMPTY_MAP, body=None) -> int:
        """Send one request now (never waits); returns its id. A worker's Unix socket that is
        gone sends it through the router instead."""
        return self._send(endpoint, op, topic, partition, header, body)[0]

    def _send(self, endpoint: str | None, op: int, topic, partition: int, header: bytes, body) -> tuple[int, str]:
        """``send``, and the endpoint the request went to."""
        rid = next(self._ids)
        frames = request_frames(op, topic, partition, rid, header, body)
        if endpoint is not None and endpoint != self.router_endpoint:
            try:
                self._link(endpoint).send(frames)
                return rid, endpoint
            except OSError:  # the worker is gone (or not on this host): the router path works
                self.forget(endpoint)
        self._link(self.router_endpoint).send(frames)
        return rid, self.router_endpoint

    async def connected(self) -> None:
        """Return once the router completed a handshake (at once after the first time); raise
        ``BrokerUnavailableError`` after ``connect_timeout_ms`` without one."""
        if self._connected:
            return
        link = self._link(self.router_endpoint)
        if self._handshake is None:
            self._handshake = asyncio.ensure_future(link.handshake(self.connect_timeout_ms))
        try:
            await asyncio.shield(self._handshake)
        except BrokerUnavailableError:
            self._handshake = None
            link.close()
            self._links.pop(self.router_endpoint, None)
            raise
        self._connected = True

    async def request(self, op: int, topic="", partition: int = -1, header: bytes = P.EMPTY_MAP, body=None,
                      timeout_ms: int = 10_000, endpoint: str | None = None) -> Reply:
        """One round trip through the router (or to ``endpoint``); raises the reply's error."""
        await self.connected()
        rid, via = self._send(endpoint, op, topic, partition, header, body)
        self._waiting_on[rid] = via
        f = self._waiting[rid] = asyncio.get_running_loop().create_future()
        try:
            r = await asyncio.wait_for(f, timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise TimeoutError_(f"no reply from {endpoint or self.router_endpoint} within {timeout_ms} ms") from None
        finally:
            self._waiting.pop(rid, None)
            self._waiting_on.pop(rid, None)
        r.raise_for_code()
        return r

    @property
    def direct(self) -> dict:
        """The links to workers (endpoint -> link), as ``Pool.direct``."""
        return {ep: link for ep, link in self._links.items() if ep != self.router_endpoint}

    def forget(self, endpoint: str) -> None:
        link = self._links.pop(endpoint, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        self.closed = True
        for link in self._links.values():
            link.close()
        self._links.clear()
        for f in self._waiting.values():
            if not f.done():
                f.cancel()
        self._waiting.clear()
        self._waiting_on.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


class AsyncRoutes(Routes):
    """``Routes`` whose DESCRIBE requests run as tasks: addressing never waits for one (until it
    is answered, a partition goes through the router)."""

    def __init__(self, pool: AsyncPool, direct: bool = True, same_host: bool = False):
        super().__init__(pool.router_endpoint, direct, same_host)
        self.pool = pool
        self._describing: dict[str, asyncio.Task] = {}

    async def describe(self, topic: str) -> int:
        r = await self.pool.request(P.Op.DESCRIBE_TOPIC, topic)
        return self.learn(topic, P.decoder(P.DescribeReply).decode(r.header))

    async def partitions(self, topic: str) -> int:
        n = self.partitions_of.get(topic)
        if n is None:
            return await self.describe(topic)
        self.endpoint(topic, 0)  # stale: described again in the background (a grown topic)
        return n

    def endpoint(self, topic: str, partition: int) -> str | None:
        if self.due(topic) and topic not in self._describing:
            self._describing[topic] = asyncio.ensure_future(self._describe_later(topic))
        return self.route(topic, partition)

    async def _describe_later(self, topic: str) -> None:
        try:
            await self.describe(topic)
        except Exception:  # noqa: BLE001 - the router path works meanwhile
            self.failed(topic)
        finally:
            self._describing.pop(topic, None)

    def close(self) -> None:
        for t in self._describing.values():
            t.cancel()
        self._describing.clear()


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

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> asyncio.Future:
        """Queue one record now; the returned future resolves with its ``Ack`` (or raises the
        error that stopped it). ``await p.send(...)`` waits for the acknowledgement."""
        fut = self.loop.create_future()
        if self.closed:
            fut.set_exception(RuntimeError("the producer is closed"))
            return fut
        n = self.routes.partitions_of.get(topic)
        if topic in self._waiting_meta or (n is None and (partition is None or self.routes.direct)):
            # learn the topic first (as the blocking producer does, inline): where its partitions
            # are, so even the first request goes straight to the owner; behind earlier sends
            self._wait_meta(topic, ("one", value, key, partition, fut))
            return fut
        self._queue_item(topic, ("one", value, key, partition, fut), n)
        self._kick()
        return fut

    def _queue_item(self, topic: str, item, n: int) -> None:
        """Queue a send whose topic's partition count ``n`` is known: now, or behind the sends
        waiting for room in ``buffer_memory`` (its future raises ``TimeoutError_`` if none comes
        within ``max_block_ms``). A record over the broker's batch limit fails at once."""
        kind, values, keys, partition, fut = item
        if kind == "one":
            exc = self._too_large(values, keys)
            if exc is not None:
                fut.set_exception(exc)
                return
            nbytes = len(values) + (0 if keys is None else len(keys))
        elif kind == "buffers":  # values: (values, value_offsets, keys, key_offsets) of one joined batch
            nbytes = len(values[0]) + (0 if values[2] is None else len(values[2]))
        else:
            nbytes = sum(map(len, values)) + (0 if keys is None else sum(map(len, keys)))
        if self._blocked or not self._room(nbytes):
            self._blocked.append((time.monotonic() + self.max_block_s, nbytes, topic, item, n))
            return
        if kind == "one":
            self._add((topic, self._choose(topic, keys, partition, n)), values, keys, fut)
            return
        if kind == "buffers":
            tp = (topic, partition)
            self._queue_buffers(tp, *values)
            frame, count, _w = self._ready[tp][-1]
            self._ready[tp][-1] = (frame, count, [fut])
            return
        futs = []
        groups = [(partition, values, keys)] if partition is not None else self._split_batch(topic, values, keys, n)
        for p, vs, ks in groups:
            futs += self._queue_futures((topic, p), vs, ks)
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

    def send_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes] | None = None,
                   partition: int | None = None) -> asyncio.Future:
        """Queue many values now (grouped as ``Producer.send_batch`` does); the future resolves
        with one ``Ack`` per batch sent (its first record's offset)."""
        if not values:
            f = self.loop.create_future()
            f.set_result([])
            return f
        known = topic in self.routes.partitions_of and topic not in self._waiting_meta
        f = self.loop.create_future()
        if known or (partition is not None and not self.routes.direct):
            self._queue_item(topic, ("batch", values, keys, partition, f), self.routes.partitions_of.get(topic, 0))
        else:
            self._wait_meta(topic, ("batch", values, keys, partition, f))
            return f
        self._kick()
        return f

    def send_buffers(self, topic: str, values, value_offsets, partition: int | None = None, keys=None,
                     key_offsets=None) -> asyncio.Future:
        """``Producer.send_buffers``: one pre-joined batch; resolves with its first offset's ``Ack``
        (the partition must be given, or the topic's partitions known: ``await partitions_for``)."""
        if partition is None:
            n = self.routes.partitions_of.get(topic)
            if n is None:
                raise ValueError(f"partitions of {topic!r} not known yet: await partitions_for({topic!r}) first")
            partition = self._choose(topic, None, None, n)
        f = self.loop.create_future()
        # held back like every send while buffer_memory is full (``_queue_item``)
        self._queue_item(topic, ("buffers", (values, value_offsets, keys, key_offsets), None, partition, f), 0)
        self._kick()
        return f

    def _queue_futures(self, tp, values, keys) -> list:
        before = len(self._ready.get(tp, ()))
        self._queue_batch(tp, values, keys)
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
            partition, fut = item[3], item[4]
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
        return await group_mod.run_async(
            gen, lambda op, topic, header: self.pool.request(op, topic, header=header, timeout_ms=timeout), self._group_assigned)

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


class AsyncAdmin:
    """``Admin`` for asyncio: the same operations, awaited."""

    def __init__(self, bootstrap: str | None = None, timeout_ms: int = 10_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, *, key_file=None, server_key=None):
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, keys=curve_keys(key_file, server_key))
        self.timeout_ms = timeout_ms

    async def _call(self, c: Call):
        return c.parse(await self.pool.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms))

    async def create_topic(self, name: str, partitions: int, ring_bytes: int = 0, config: dict | None = None) -> P.TopicInfo:
        return await self._call(AdminCalls.create_topic(name, partitions, ring_bytes, config))

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

    async def delete_topic(self, name: str) -> P.TopicInfo:
        return await self._call(AdminCalls.delete_topic(name))

    async def list_groups(self) -> list[P.GroupInfo]:
        return await self._call(AdminCalls.list_groups())

    async def describe_group(self, group: str) -> P.GroupInfo:
        return await self._call(AdminCalls.describe_group(group))

    async def delete_group(self, group: str) -> None:
        return await self._call(AdminCalls.delete_group(group))

    async def committed(self, group: str, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
        return await self._call(AdminCalls.committed(group, topics))

    async def reset_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        return await self._call(AdminCalls.commit(group, offsets))

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

