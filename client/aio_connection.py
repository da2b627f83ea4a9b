"""The I/O under the asyncio client (aio.py): ``AsyncPool`` and ``AsyncRoutes``.

The asyncio twins of connection.Pool and routes.BlockingRoutes. ZeroMQ DEALERs and the workers'
same-host Unix sockets (unixwire.py) are both read with the event loop's ``add_reader`` on their
file descriptors (_ZmqLink says why not ``zmq.asyncio``). No thread, no per-call executor; works
under uvloop.
"""

from __future__ import annotations

import asyncio
import itertools
import socket

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as P
from . import unixwire
from .connection import (CONNECT_TIMEOUT_MS, DROP_EVENTS, HANDSHAKE_EVENTS, Reply, handshake_refused, parse_bootstrap,
                         parse_reply, request_frames, take_drops)
from .security import CurveKeys
from .errors import BootstrapError, BrokerUnavailableError, ConnectionLostError, TimeoutError_
from .routes import Routes

__all__ = ["AsyncPool", "AsyncRoutes"]


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
