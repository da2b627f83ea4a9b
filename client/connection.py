"""A client connection: one DEALER socket, many requests in flight, replies matched by id.

The ZeroMQ context is created lazily and per process id: a connection object that crosses a
fork (Spark's Python workers are forked and reuse pickled objects) builds a fresh context and
socket in the child instead of touching the parent's, which ZeroMQ forbids.

Some facts about a ZeroMQ connection that closes:

- The broker reads every message part into a frame limit (ZMQ_MAXMSGSIZE: its max_batch_bytes
  plus 1 MiB); a larger part makes libzmq close that TCP (or ipc) connection without a word, and
  a router or worker process that stops or is killed closes its connections too.
- A DEALER that connected reconnects by itself (every 100 ms) under a new identity, so the
  replies owed on the old connection are never sent; requests still queued in the socket go out
  on the new one. Nothing of this reaches the application: a request in flight would wait out its
  whole timeout (a 4 MB line waited 66 s).
- A socket monitor (``get_monitor_socket``) reports ``EVENT_DISCONNECTED`` when a connection
  that was up closes; a connect that fails while the peer is down reports other events, not this.

What this means for us: every ZeroMQ connection keeps a monitor for ``EVENT_DISCONNECTED`` for
its whole life, and its socket joins the poll the client already waits in (``Pool.recv``,
``Connection.wait_for``; the asyncio client's event loop). A monitor event is rare, so no
message pays for it. When one comes, the replies already received are taken first (they came
before the close), then the requests still in flight on that connection are lost: ``Pool`` hands
the endpoint to ``on_lost`` (the producer resends idempotent batches, the consumer refetches), and
a round trip raises ``ConnectionLostError``. A request sent in the moment between the close and
the event may be counted lost too, though it goes out on the new connection: it is resent or
fails with an unknown fate, never waits. A worker's Unix socket shows a close as end of file and
is handled the same way.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as P
from . import unixwire
from .errors import (AuthenticationFailedError, BootstrapError, BrokerUnavailableError, ConnectionLostError,
                     InvalidRequestError, TimeoutError_, error_for)
from .security import CurveKeys

DEFAULT_BOOTSTRAP = "tcp://127.0.0.1:7420"
ENV_BOOTSTRAP = "TAILRACE_BOOTSTRAP"  # the broker's address when a client is given none (as the CLI)
CONNECT_TIMEOUT_MS = 1500  # a first request fails this soon when no broker completes a handshake
# what the handshake monitor watches: success, or a refusal (CURVE keys wrong or missing)
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
DROP_EVENTS = zmq.EVENT_DISCONNECTED  # what the monitor watches for a socket's whole life (the docstring)


def handshake_refused(event: int, endpoint: str, secured: bool) -> AuthenticationFailedError | None:
    """The error for a refused handshake (None for success): wrong, unknown or missing keys."""
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return None
    why = ("the broker refused this client's key (not in its allow-list, or the server key is wrong)"
           if secured else "the broker requires CURVE authentication: give key_file and server_key")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and secured:
        why = "the handshake failed (a broker without --auth curve, or a wrong server key)"
    return AuthenticationFailedError(f"{endpoint}: {why}")


def take_drops(monitor: zmq.Socket, handshakes: list | None = None) -> bool:
    """Read every event waiting on a socket monitor (never waits); whether one was
    ``EVENT_DISCONNECTED``. Handshake events go to ``handshakes`` when given (a connection that
    has not seen its first handshake yet waits for it: ``Connection.connected``), else nowhere
    (a handshake after a reconnect needs nothing)."""
    dropped = False
    while P.socket_events(monitor) & zmq.POLLIN:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
        except zmq.Again:
            break
        if event == zmq.EVENT_DISCONNECTED:
            dropped = True
        elif handshakes is not None and event & HANDSHAKE_EVENTS:
            handshakes.append(event)
    return dropped


def default_bootstrap() -> str:
    """The address a client given no ``bootstrap`` uses: ``$TAILRACE_BOOTSTRAP``, else
    ``DEFAULT_BOOTSTRAP`` (the same rule as the command line's ``--bootstrap``)."""
    return os.environ.get(ENV_BOOTSTRAP) or DEFAULT_BOOTSTRAP


def parse_bootstrap(value: str | int | None) -> str:
    """The ZeroMQ endpoint for a bootstrap address: ``tcp://host:port``, ``host:port`` (Kafka's
    form), a bare port (loopback), or an ``ipc://`` path; a worker's ``unix:`` address as is.

    ``None`` is ``default_bootstrap()``. Anything else raises ``BootstrapError`` with a one-line
    reason."""
    if value is None:
        value = default_bootstrap()
    text = str(value).strip()
    if "," in text and not text.startswith(("ipc://", unixwire.SCHEME)):
        return first_reachable([parse_bootstrap(item) for item in text.split(",") if item.strip()])
    if text.startswith(("ipc://", unixwire.SCHEME)):
        if len(text.split("://", 1)[-1]) == 0 or text == unixwire.SCHEME:
            raise BootstrapError(f"bad bootstrap {value!r}: the socket path is empty")
        return text
    rest = text[len("tcp://"):] if text.startswith("tcp://") else text
    if "://" in rest:
        raise BootstrapError(f"bad bootstrap {value!r}: only tcp:// and ipc:// addresses are spoken")
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", rest
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise BootstrapError(f"bad bootstrap {value!r}: expected host:port, tcp://host:port or a port (1-65535)")
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not inner or not all(c.isalnum() or c in ".-_:" for c in inner) or (":" in inner and inner == host):
        raise BootstrapError(f"bad bootstrap {value!r}: {host!r} is not a host name or address")
    return f"tcp://{host}:{int(port)}"


def first_reachable(endpoints: list[str], timeout_s: float = 0.5) -> str:
    """Of a bootstrap list (``h1:p1,h2:p2``: a cluster's brokers, Kafka's ``bootstrap.servers``),
    the first that accepts a TCP connection now, else the first: any broker of a cluster answers
    for all of it, so one is enough."""
    if not endpoints:
        raise BootstrapError("bad bootstrap: an empty list")
    for endpoint in endpoints:
        if not endpoint.startswith("tcp://"):
            return endpoint  # a same-host socket: nothing to probe
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return endpoint
        except OSError:
            continue
    return endpoints[0]


@dataclass
class Reply:
    op: int
    code: int
    partition: int
    request_id: int
    topic: bytes
    header: bytes
    body: bytes | zmq.Frame | None
    via: str = ""  # the endpoint it came from

    def raise_for_code(self) -> None:
        if self.code != P.ErrorCode.OK:
            details = {}
            try:
                err = P.decoder(P.ErrorReply).decode(self.header)
                message, details = err.message, {"log_start_offset": err.log_start_offset, "high_watermark": err.high_watermark,
                                                 "endpoint": err.endpoint}
            except Exception:
                message = "(undecodable error reply)"
            raise error_for(self.code, f"{P.ErrorCode(self.code).name}: {message}", **details)


def request_frames(op: int, topic: str | bytes, partition: int, rid: int, header: bytes = P.EMPTY_MAP,
                   body=None) -> list:
    """The frames of one request (docs/PROTOCOL.md): routing header, header map, body if any.
    A topic name over the limit raises ``InvalidRequestError`` here (the broker would drop the
    huge frame unread, and say nothing)."""
    t = topic.encode() if isinstance(topic, str) else topic
    if len(t) > P.MAX_TOPIC_BYTES:
        raise InvalidRequestError(f"topic name of {len(t)} bytes: at most {P.MAX_TOPIC_BYTES} (not sent)")
    frames = [P.pack_routing(op, partition, rid, t), header]
    if type(body) is list:  # one frame per partition (PRODUCE_MULTI)
        frames.extend(body)
    elif body is not None:
        frames.append(body)
    return frames


def parse_reply(frames: list, via: str) -> Reply:
    """A reply's frames (``bytes``, or ``zmq.Frame`` as received without copying: a body of
    64 KiB or more stays a zero-copy frame) as a ``Reply``."""
    routing = frames[0] if isinstance(frames[0], bytes) else frames[0].bytes
    header = P.EMPTY_MAP
    if len(frames) > 1:
        header = frames[1] if isinstance(frames[1], bytes) else frames[1].bytes
    _v, op, code, partition, rid, topic = P.unpack_routing(routing)
    if op == P.Op.FETCH_MULTI and code == P.ErrorCode.OK:  # one body frame per partition with data
        # kept as received, however small: each is read once into columns (a copy of each here
        # was a third of a 10,000-partition reader's page faults)
        body = frames[2:]
        return Reply(op, code, partition, rid, topic, header, body, via)
    body = frames[2] if len(frames) > 2 else None
    if body is not None and not isinstance(body, bytes) and len(body) < P.COPY_THRESHOLD:
        body = body.bytes
    return Reply(op, code, partition, rid, topic, header, body, via)


class Connection:
    """``connect_timeout_ms``: a request made before the connection ever completed a ZeroMQ
    handshake with a broker fails with ``BrokerUnavailableError`` after this long (ZeroMQ itself
    would retry the connect silently for ever); once a broker has answered, a request in flight
    when the connection closes raises ``ConnectionLostError`` at once (the module docstring), and
    a request sent while the broker is away waits its own timeout, through broker restarts too."""

    def __init__(self, endpoint: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 keys: CurveKeys | None = None):
        self.endpoint = parse_bootstrap(endpoint)
        self.connect_timeout_ms = connect_timeout_ms
        self.keys = keys  # CURVE (client/security.py), or None
        self.is_unix = self.endpoint.startswith(unixwire.SCHEME)  # a worker's same-host socket
        self._pid = None
        self._ctx = None
        self._sock = None
        self._monitor = None  # the socket's monitor: handshake events (see connected), then DROP_EVENTS
        self._poller = None  # zmq.Poller of the socket and its monitor (wait_for)
        # handshake events a look for drops took off the monitor before ``connected`` asked
        # (a Pool polls every monitor it has: the router's first handshake may be read there)
        self._handshakes: list[int] = []
        self._connected = self.is_unix or connect_timeout_ms <= 0  # <= 0: no check
        self._ids = itertools.count(1)
        self._early: dict[int, Reply] = {}  # replies that arrived while waiting for another id

    def __getstate__(self):
        return {"endpoint": self.endpoint, "connect_timeout_ms": self.connect_timeout_ms, "keys": self.keys}

    def __setstate__(self, state):
        keys = state.get("keys")
        self.__init__(state["endpoint"], state.get("connect_timeout_ms", CONNECT_TIMEOUT_MS),
                      CurveKeys(*keys) if keys is not None else None)

    @property
    def sock(self) -> zmq.Socket:
        if self._pid != os.getpid():
            if self.is_unix:
                self._ctx = None
                self._sock = unixwire.UnixSocket(self.endpoint)
                self._pid = os.getpid()
                self._early.clear()
                return self._sock
            self._ctx = zmq.Context()
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.SNDHWM, 100_000)
            self._sock.setsockopt(zmq.RCVHWM, 100_000)
            if self.keys is not None:
                self.keys.apply(self._sock)
            self._handshakes.clear()  # a new socket: its own handshake
            self._monitor = self._sock.get_monitor_socket(
                DROP_EVENTS if self._connected else HANDSHAKE_EVENTS | DROP_EVENTS)
            self._monitor.setsockopt(zmq.LINGER, 0)
            self._poller = zmq.Poller()
            self._poller.register(self._sock, zmq.POLLIN)
            self._poller.register(self._monitor, zmq.POLLIN)
            try:
                self._sock.connect(self.endpoint)
            except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
                self._pid = os.getpid()
                self.close()
                raise BootstrapError(f"cannot connect to {self.endpoint}: {exc}") from None
            self._pid = os.getpid()
            self._early.clear()
        return self._sock

    def send(self, op: int, topic: str | bytes, partition: int, header: bytes = P.EMPTY_MAP, body=None) -> int:
        rid = next(self._ids)
        frames = request_frames(op, topic, partition, rid, header, body)
        sock = self.sock
        if self.is_unix:
            sock.send_frames(frames)
        else:
            P.send_frames(sock, frames)  # int flags: pyzmq's send_multipart builds enums per frame
        return rid

    @property
    def poll_key(self):
        """What to register in a zmq.Poller: the ZeroMQ socket, or a Unix socket's fd (the
        poller reports plain fds as ints)."""
        sock = self.sock
        return sock.fileno() if self.is_unix else sock

    def pending(self) -> bool:
        """Whether a reply is already here (read ahead), so a poll of the socket would miss it."""
        return bool(self._early) or (self.is_unix and self._sock is not None and bool(self._sock.ready))

    def recv(self, timeout_ms: int) -> Reply | None:
        """Next reply, or None after ``timeout_ms`` (0 = don't wait, -1 = forever)."""
        if self._early:
            rid = next(iter(self._early))
            return self._early.pop(rid)
        sock = self.sock
        if self.is_unix:  # poll reads and waits for a whole message
            try:
                if not sock.poll(timeout_ms):
                    return None
            except OSError:  # the worker went away: its replies are lost, as over ZeroMQ
                self.close()
                return None
        elif timeout_ms != -1 and not sock.poll(timeout_ms):
            return None
        return self._recv_ready()

    def _recv_ready(self) -> Reply:
        """The reply a poll said is waiting (large bodies stay zero-copy frames)."""
        if self.is_unix:  # already bytes
            return parse_reply(self.sock.recv_frames(), self.endpoint)
        return parse_reply(P.recv_frames_nocopy(self.sock), self.endpoint)

    @property
    def monitor(self) -> zmq.Socket | None:
        """The socket's monitor (``DROP_EVENTS``), None for a Unix socket."""
        return None if self.is_unix else self._monitor

    def dropped(self) -> bool:
        """Whether the monitor reported a closed connection since the last look (never waits)."""
        return (self._monitor is not None and self._pid == os.getpid()
                and take_drops(self._monitor, None if self._connected else self._handshakes))

    def _lost(self, rid: int) -> ConnectionLostError:
        return ConnectionLostError(f"{self.endpoint} closed the connection before replying to request {rid} "
                                   "(a broker process stopped, or a message over its frame limit): its fate is unknown")

    def answered(self, rid: int) -> bool:
        """Whether the reply to ``rid`` is here (taking what the socket holds, without waiting)."""
        while rid not in self._early and self._sock is not None and self.sock.poll(0):
            r = self._recv_ready()
            self._early[r.request_id] = r
        return rid in self._early

    def wait_for(self, rid: int, timeout_ms: int) -> Reply:
        """The reply to ``rid``; ``TimeoutError_`` after ``timeout_ms``, ``ConnectionLostError``
        as soon as the connection it went on closes."""
        if rid in self._early:
            return self._early.pop(rid)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                raise TimeoutError_(f"no reply from {self.endpoint} within {timeout_ms} ms")
            sock = self.sock
            if self.is_unix:
                try:
                    if not sock.poll(left):
                        continue
                except OSError:  # end of file: the worker closed the connection
                    self.close()
                    raise self._lost(rid) from None
            else:
                ready = dict(self._poller.poll(left))
                if sock not in ready:  # the monitor only: replies that came before a close go first
                    if ready and self.dropped():
                        raise self._lost(rid)
                    continue
            r = self._recv_ready()
            if r.request_id == rid:
                return r
            self._early[r.request_id] = r

    def connected(self) -> None:
        """Return once a broker has completed a handshake on this connection (at once after the
        first time); raise ``BrokerUnavailableError`` after ``connect_timeout_ms`` without one."""
        if self._connected and self._pid == os.getpid():
            return
        self.sock
        if self._connected:  # a connection that was up before a fork
            return
        deadline = time.monotonic() + self.connect_timeout_ms / 1000
        while not self._handshakes:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0 or not self._monitor.poll(left):
                raise BrokerUnavailableError(
                    f"no broker answered at {self.endpoint} within {self.connect_timeout_ms / 1000:g} s "
                    "(is `tailrace serve` running?)")
            take_drops(self._monitor, self._handshakes)  # (a close before its handshake says nothing yet)
        event = self._handshakes.pop(0)
        self._handshakes.clear()
        refused = handshake_refused(event, self.endpoint, self.keys is not None)
        if refused is not None:
            self.close()  # final: nothing of it is kept (a later request starts a new handshake)
            raise refused
        self._connected = True

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(0)
            self._monitor = None
        self._poller = None

    def request(self, op: int, topic="", partition: int = -1, header: bytes = P.EMPTY_MAP, body=None,
                timeout_ms: int = 10_000) -> Reply:
        self.connected()
        self.dropped()  # a close seen before this request is not its loss (it goes on the new connection)
        r = self.wait_for(self.send(op, topic, partition, header, body), timeout_ms)
        r.raise_for_code()
        return r

    def close(self) -> None:
        if self._sock is not None and self._pid == os.getpid():
            self._stop_monitor()
            self._sock.close(0)
            if self._ctx is not None:
                self._ctx.term()
        self._sock = self._ctx = self._pid = None


class Pool:
    """The router connection plus one connection per worker endpoint, sharing one id space.

    Client-side addressing: a request for a partition can go straight to the worker that owns
    it (its endpoint comes from DESCRIBE_TOPIC), saving the router hop both ways; ``None`` as
    the endpoint means "through the router". Replies from all of them come out of ``recv``.

    A connection that closes (the module docstring) is handed to ``on_lost(endpoint)`` (``None``:
    the router) from inside ``recv``, after the replies that came on it before the close: every
    request in flight on it is lost. The owner resends or fails them; nothing waits a timeout.
    """

    def __init__(self, bootstrap: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 keys: CurveKeys | None = None):
        self._ids = itertools.count(1)
        self.keys = keys
        self.router = Connection(bootstrap, connect_timeout_ms, keys)
        self.router._ids = self._ids
        self.direct: dict[str, Connection] = {}  # endpoint -> connection
        self.on_lost = None  # callable(endpoint | None), or None: lost requests wait their timeouts
        self._poller: zmq.Poller | None = None
        self._by_sock: dict = {}  # poll key -> connection (this pid's sockets)
        self._by_monitor: dict = {}  # monitor socket -> connection
        self._pid = None

    def conn(self, endpoint: str | None) -> Connection:
        if endpoint is None:
            return self.router
        c = self.direct.get(endpoint)
        if c is None:
            c = self.direct[endpoint] = Connection(endpoint, connect_timeout_ms=0, keys=self.keys)  # named by the broker
            c._ids = self._ids
            self._poller = None
        return c

    def send(self, endpoint: str | None, op: int, topic, partition: int, header: bytes = P.EMPTY_MAP, body=None) -> int:
        c = self.conn(endpoint)
        if c._sock is None or (c.is_unix and c._pid != os.getpid()):
            self._poller = None  # a new socket: register it (and its monitor) at the next recv
        if c.is_unix:
            try:
                return c.send(op, topic, partition, header, body)
            except OSError:  # the worker is gone (or not on this host): the router path works
                self.forget(endpoint)
                return self.router.send(op, topic, partition, header, body)
        return c.send(op, topic, partition, header, body)

    def settle(self) -> None:
        """Forget the closes seen while nothing was in flight (call before sending with nothing
        in flight): a request sent after a close goes on the new connection and is not lost."""
        for c in (self.router, *self.direct.values()):
            c.dropped()

    def _build_poller(self, conns: list) -> None:
        self._poller = zmq.Poller()
        self._by_sock, self._by_monitor = {}, {}
        for c in conns:
            if c._sock is None or c._pid != os.getpid():
                if c.is_unix:
                    continue  # a Unix connection closed after its worker went: nothing to hear
                c.sock
            self._poller.register(c.poll_key, zmq.POLLIN)
            self._by_sock[c.poll_key] = c
            if c.monitor is not None:
                self._poller.register(c.monitor, zmq.POLLIN)
                self._by_monitor[c.monitor] = c
        self._pid = os.getpid()

    def _lost(self, c: Connection) -> None:
        if self.on_lost is not None:
            self.on_lost(None if c is self.router else c.endpoint)

    def recv(self, timeout_ms: int) -> Reply | None:
        """The next reply from any connection, or None after ``timeout_ms`` (0 = don't wait,
        -1 = forever) or at once after a closed connection was reported to ``on_lost``."""
        conns = [self.router, *self.direct.values()] if self.direct else [self.router]
        for c in conns:
            if c.pending():
                return c.recv(0)
        if self._poller is None or self._pid != os.getpid():
            self._build_poller(conns)
        deadline = None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            events = self._poller.poll(left)
            if not events:
                return None
            key = events[0][0]
            c = self._by_sock.get(key)
            if c is None:  # a monitor: replies that came before a close go first
                c = next((self._by_sock[k] for k, _e in events if k in self._by_sock), None)
            if c is None:
                lost = [self._by_monitor[k] for k, _e in events if self._by_monitor[k].dropped()]
                for c in lost:
                    self._lost(c)
                if lost:
                    return None  # the caller resends what was lost before waiting on
            elif not c.is_unix:
                return c._recv_ready()  # no second poll: it is waiting
            else:
                r = c.recv(0)  # a Unix socket: readable, but maybe not a whole message yet
                if c._sock is None:  # ... or closed by its worker (end of file): poll without it
                    self._poller = None
                    self._lost(c)
                    return r
                if r is not None:
                    return r
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def forget(self, endpoint: str) -> None:
        c = self.direct.pop(endpoint, None)
        if c is not None:
            c.close()
            self._poller = None

    def close(self) -> None:
        for c in self.direct.values():
            c.close()
        self.direct.clear()
        self.router.close()
        self._poller = None
