"""A client connection: one DEALER socket, many requests in flight, replies matched by id.

The ZeroMQ context is created lazily and per process id: a connection object that crosses a
fork (Spark's Python workers are forked and reuse pickled objects) builds a fresh context and
socket in the child instead of touching the parent's, which ZeroMQ forbids.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol as P
from . import unixwire
from .errors import (AuthenticationFailedError, BootstrapError, BrokerUnavailableError, InvalidRequestError,
                     TimeoutError_, error_for)
from .security import CurveKeys

DEFAULT_BOOTSTRAP = "tcp://127.0.0.1:7420"
ENV_BOOTSTRAP = "TAILRACE_BOOTSTRAP"  # the broker's address when a client is given none (as the CLI)
CONNECT_TIMEOUT_MS = 1500  # a first request fails this soon when no broker completes a handshake
# what the handshake monitor watches: success, or a refusal (CURVE keys wrong or missing)
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def handshake_refused(event: int, endpoint: str, secured: bool) -> AuthenticationFailedError | None:
    """The error for a refused handshake (None for success): wrong, unknown or missing keys."""
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return None
    why = ("the broker refused this client's key (not in its allow-list, or the server key is wrong)"
           if secured else "the broker requires CURVE authentication: give key_file and server_key")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and secured:
        why = "the handshake failed (a broker without --auth curve, or a wrong server key)"
    return AuthenticationFailedError(f"{endpoint}: {why}")


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
                message, details = err.message, {"log_start_offset": err.log_start_offset, "high_watermark": err.high_watermark}
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
    if body is not None:
        frames.append(body)
    return frames


def parse_reply(frames: list, via: str) -> Reply:
    """A reply's frames (``bytes``, or ``zmq.Frame`` as received without copying: a body of
    64 KiB or more stays a zero-copy frame) as a ``Reply``."""
    routing = frames[0] if isinstance(frames[0], bytes) else frames[0].bytes
    header = P.EMPTY_MAP
    if len(frames) > 1:
        header = frames[1] if isinstance(frames[1], bytes) else frames[1].bytes
    body = frames[2] if len(frames) > 2 else None
    if body is not None and not isinstance(body, bytes) and len(body) < P.COPY_THRESHOLD:
        body = body.bytes
    _v, op, code, partition, rid, topic = P.unpack_routing(routing)
    return Reply(op, code, partition, rid, topic, header, body, via)


class Connection:
    """``connect_timeout_ms``: a request made before the connection ever completed a ZeroMQ
    handshake with a broker fails with ``BrokerUnavailableError`` after this long (ZeroMQ itself
    would retry the connect silently for ever); once a broker has answered, requests wait their
    own timeout, through broker restarts too."""

    def __init__(self, endpoint: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 keys: CurveKeys | None = None):
        self.endpoint = parse_bootstrap(endpoint)
        self.connect_timeout_ms = connect_timeout_ms
        self.keys = keys  # CURVE (client/security.py), or None
        self.is_unix = self.endpoint.startswith(unixwire.SCHEME)  # a worker's same-host socket
        self._pid = None
        self._ctx = None
        self._sock = None
        self._monitor = None  # handshake events until the first one (see connected)
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
            self._monitor = None
            if not self._connected:
                self._monitor = self._sock.get_monitor_socket(HANDSHAKE_EVENTS)
                self._monitor.setsockopt(zmq.LINGER, 0)
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

    def wait_for(self, rid: int, timeout_ms: int) -> Reply:
        if rid in self._early:
            return self._early.pop(rid)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                raise TimeoutError_(f"no reply from {self.endpoint} within {timeout_ms} ms")
            sock = self.sock
            if not sock.poll(left):
                continue
            r = self._recv_now()
            if r.request_id == rid:
                return r
            self._early[r.request_id] = r

    def _recv_now(self) -> Reply:
        saved, self._early = self._early, {}
        try:
            return self.recv(-1)
        finally:
            self._early = saved

    def connected(self) -> None:
        """Return once a broker has completed a handshake on this connection (at once after the
        first time); raise ``BrokerUnavailableError`` after ``connect_timeout_ms`` without one."""
        if self._connected and self._pid == os.getpid():
            return
        self.sock
        if self._monitor is None:  # a connection that was up before a fork
            self._connected = True
            return
        if not self._monitor.poll(self.connect_timeout_ms):
            raise BrokerUnavailableError(
                f"no broker answered at {self.endpoint} within {self.connect_timeout_ms / 1000:g} s "
                "(is `tailrace serve` running?)")
        refused = handshake_refused(recv_monitor_message(self._monitor)["event"], self.endpoint, self.keys is not None)
        if refused is not None:
            self.close()  # final: nothing of it is kept (a later request starts a new handshake)
            raise refused
        self._stop_monitor()
        self._connected = True

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(0)
            self._monitor = None

    def request(self, op: int, topic="", partition: int = -1, header: bytes = P.EMPTY_MAP, body=None,
                timeout_ms: int = 10_000) -> Reply:
        self.connected()
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
    """

    def __init__(self, bootstrap: str | None = None, connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
                 keys: CurveKeys | None = None):
        self._ids = itertools.count(1)
        self.keys = keys
        self.router = Connection(bootstrap, connect_timeout_ms, keys)
        self.router._ids = self._ids
        self.direct: dict[str, Connection] = {}  # endpoint -> connection
        self._poller: zmq.Poller | None = None
        self._by_sock: dict = {}  # socket -> connection (for this pid's sockets)
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
        if c.is_unix:
            if c._sock is None or c._pid != os.getpid():
                self._poller = None  # a new socket: register it at the next recv
            try:
                return c.send(op, topic, partition, header, body)
            except OSError:  # the worker is gone (or not on this host): the router path works
                self.forget(endpoint)
                return self.router.send(op, topic, partition, header, body)
        return c.send(op, topic, partition, header, body)

    def recv(self, timeout_ms: int) -> Reply | None:
        if not self.direct:
            return self.router.recv(timeout_ms)
        conns = [self.router, *self.direct.values()]
        for c in conns:
            if c.pending():
                return c.recv(0)
        if self._poller is None or self._pid != os.getpid():
            self._poller = zmq.Poller()
            self._by_sock = {}
            for c in conns:
                if c.is_unix and (c._sock is None or c._pid != os.getpid()):
                    continue  # a Unix connection closed after its worker went: nothing to hear
                self._poller.register(c.poll_key, zmq.POLLIN)
                self._by_sock[c.poll_key] = c
            self._pid = os.getpid()
        deadline = None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000
        while True:
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            events = self._poller.poll(left)
            if not events:
                return None
            c = self._by_sock[events[0][0]]
            if not c.is_unix:
                return c._recv_ready()  # no second poll: it is waiting
            r = c.recv(0)  # a Unix socket: readable, but maybe not a whole message yet
            if c._sock is None:  # ... or closed by its worker: poll without it
                self._poller = None
                return r
            if r is not None or (deadline is not None and time.monotonic() >= deadline):
                return r

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
