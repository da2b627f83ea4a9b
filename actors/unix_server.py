"""A worker's Unix-socket listener: same-host clients without ZeroMQ (client/unixwire.py).

Connections are non-blocking and watched by an epoll object: the worker's own, given as ``ep``,
beside its ZeroMQ sockets' fds (its loop hands each ready fd it does not own to ``on_event``), so
the loop stays single-threaded and one ``epoll_wait`` covers everything; without ``ep`` the
server keeps one of its own, served by ``service``. A request becomes the
same frame list a ZeroMQ client's would, with an identity frame of its own type (``UnixIdent``:
``UNIX_IDENT`` + the connection number) in front: ``Worker.handle`` cannot tell the transports apart, and every reply
(immediate, parked fetch, durable ack) comes back through ``PortMux.send``, which routes it by
that identity's type (a ZeroMQ peer can choose any identity bytes, never the type).

Limits, as ReplyPort's for ZeroMQ peers: a connection's unsent replies wait in a byte-counted
queue of at most ``PEER_BACKLOG_BYTES`` (replies beyond it are dropped whole, never cut), all
connections' at most ``BACKLOG_BYTES``; a connection whose queue has not moved for
``BACKLOG_STALL_S`` is closed. A framing error is answered with MALFORMED and the connection is
closed (a stream cannot skip a bad message); frames inside are checked by the worker as usual.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import struct
import time
from collections import deque

from tailrace.broker.reply_port import BACKLOG_BYTES, BACKLOG_STALL_S, PEER_BACKLOG_BYTES, ReplyPort
from tailrace.client import protocol as P
from tailrace.client.unixwire import RECV_BYTES, WOULD_BLOCK, FrameReader, WireError, encode, listen

UNIX_IDENT = b"\x00UNX\x00"  # readable prefix of a Unix connection's identity (logs)
_CONN = struct.Struct("<I")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

ACCEPT_MAX = 64  # connections accepted per event
ACCEPT_PAUSE_S = 0.1  # after accept() failed for want of fds: stop listening this long


class UnixIdent(bytes):
    """A Unix connection's identity frame. Replies are routed by this *type*, not by the bytes:
    a ZeroMQ peer may set any identity, these 9 bytes included, but its frames are plain bytes."""


class _Conn:
    __slots__ = ("sock", "ident", "uid", "reader", "out", "out_bytes", "moved_at")

    def __init__(self, sock, ident: bytes, limit: int, uid: int):
        self.sock = sock
        self.ident = ident
        self.uid = uid  # the peer's user id (SO_PEERCRED): its principal with --auth curve
        self.reader = FrameReader(limit)
        self.out: deque = deque()  # memoryviews of bytes waiting to be written, in order
        self.out_bytes = 0
        self.moved_at = 0.0


class UnixServer:
    def __init__(self, path: str, log, what: str, max_message: int, allowed_uids: frozenset[int] | None = None,
                 ep: select.epoll | None = None):
        self.path = path
        self.allowed_uids = allowed_uids  # SO_PEERCRED: the user ids served (None: any that reach the socket)
        self.refused = 0
        self.log, self.what = log, what
        self.listener = listen(path)
        self._own_ep = ep is None
        self.ep = select.epoll() if ep is None else ep
        self.listener_fd = self.listener.fileno()
        self.ep.register(self.listener_fd, select.EPOLLIN)
        self.conns: dict[int, _Conn] = {}  # fd -> connection
        self.by_ident: dict[bytes, _Conn] = {}
        self.max_message = max_message
        self.total_backlog = 0
        self.accept_paused_until = 0.0  # > 0: the listener is out of the epoll set until then
        self.dropped = 0
        self._ids = itertools.count(1)
        self._logged_at = float("-inf")
        # One receive buffer for every connection (one thread), reused: ``recv(n)`` allocates n
        # bytes per call, an mmap + page faults + munmap per message at this size.
        self._rbuf = bytearray(RECV_BYTES)
        self._rmv = memoryview(self._rbuf)
        self.on_close = None  # called with a connection's identity when it closes (its WATCH ends)

    @property
    def backlog(self) -> bool:
        """Work for ``flush`` (the worker calls it, and polls at 2 ms, while this is true)."""
        return self.total_backlog > 0 or self.accept_paused_until > 0

    # --- reading ---------------------------------------------------------------------------
    def service(self, handle) -> None:
        """With an epoll of its own: accept, read and hand every complete request to ``handle``
        (frames with identity)."""
        for fd, ev in self.ep.poll(0):
            self.on_event(fd, ev, handle)

    def on_event(self, fd: int, ev: int, handle) -> None:
        """One ready fd of this server's (the listener or a connection; any other is ignored)."""
        if fd == self.listener_fd:
            self._accept()
            return
        c = self.conns.get(fd)
        if c is None:
            return
        if ev & select.EPOLLOUT:
            self._write(c)
        if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
            self._read(c, handle)

    def _accept(self) -> None:
        for _ in range(ACCEPT_MAX):
            try:
                s, _addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of fds (EMFILE/ENFILE) or buffers: stop accepting a while
                self.log.warning("%s: cannot accept Unix-socket clients (%s); pausing for %.1f s",
                                 self.what, exc, ACCEPT_PAUSE_S)
                self.ep.unregister(self.listener_fd)  # level-triggered: it would spin
                self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            _pid, uid, _gid = _PEERCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            if self.allowed_uids is not None:
                if uid not in self.allowed_uids:
                    self.refused += 1
                    self.log.warning("%s: refused a Unix-socket client of uid %d (pid %d): not in the allowed user ids %s",
                                     self.what, uid, _pid, sorted(self.allowed_uids))
                    s.close()
                    continue
            s.setblocking(False)
            c = _Conn(s, UnixIdent(UNIX_IDENT + _CONN.pack(next(self._ids) & 0xFFFFFFFF)), self.max_message, uid)
            self.conns[s.fileno()] = c
            self.by_ident[c.ident] = c
            self.ep.register(s.fileno(), select.EPOLLIN)

    def _read(self, c: _Conn, handle) -> None:
        try:
            n = c.sock.recv_into(self._rbuf)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self._close(c)
            return
        c.reader.feed(self._rmv[:n])
        try:
            msgs = c.reader.messages()
        except WireError as exc:
            self._bad_framing(c, exc)
            return
        for frames in msgs:
            handle([c.ident, *frames])
            if c.sock.fileno() not in self.conns:
                return  # closed while handling (a reply it could not take)
        if c.reader.error is not None:  # the requests in front of it were served, in order
            self._bad_framing(c, c.reader.error)

    def _bad_framing(self, c: _Conn, exc: WireError) -> None:
        self.log.warning("%s: closing a Unix-socket client after a framing error: %s", self.what, exc)
        head = P.pack_routing(0, -1, 0, b"", P.ErrorCode.MALFORMED)
        self.send(c.ident, [head, P.encode(P.ErrorReply(f"bad framing, connection closed: {exc}"))])
        self._close(c)

    def uid_of(self, ident: bytes) -> int | None:
        """The user id of the connection ``ident`` (None once it is gone)."""
        c = self.by_ident.get(ident)
        return c.uid if c is not None else None

    # --- writing ---------------------------------------------------------------------------
    def send(self, ident: bytes, frames) -> bool:
        """Send or queue one reply to the connection ``ident``; False if it was dropped."""
        c = self.by_ident.get(ident)
        if c is None:
            return self._drop("gone")
        bufs = encode(frames)
        size = sum(len(b) for b in bufs)
        if not c.out:
            try:
                sent = c.sock.sendmsg(bufs, [], socket.MSG_NOSIGNAL)
            except OSError as exc:
                if exc.errno not in WOULD_BLOCK:
                    self._close(c)
                    return self._drop("gone")
                sent = 0
            if sent == size:
                return True
            # The rest of a message already started must follow, whatever the limits say: the
            # stream has to stay framed. Later replies are what the limits drop.
            bufs = [memoryview(b"".join(bufs))[sent:]]
            size -= sent
            c.moved_at = time.monotonic()
            self.ep.modify(c.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        elif c.out_bytes + size > PEER_BACKLOG_BYTES or self.total_backlog + size > BACKLOG_BYTES:
            return self._drop("not reading")
        else:
            bufs = [memoryview(b"".join(bufs))]
        c.out.extend(bufs)
        c.out_bytes += size
        self.total_backlog += size
        return True

    def _write(self, c: _Conn) -> None:
        while c.out:
            mv = c.out[0]
            try:
                n = c.sock.send(mv, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return
            except OSError:
                self._close(c)
                return
            c.moved_at = time.monotonic()
            c.out_bytes -= n
            self.total_backlog -= n
            if n < len(mv):
                c.out[0] = mv[n:]
                return
            c.out.popleft()
        self.ep.modify(c.sock.fileno(), select.EPOLLIN)

    def flush(self) -> None:
        """Close connections whose unsent replies have not moved for BACKLOG_STALL_S; listen
        again after an accept pause."""
        now = time.monotonic()
        if self.accept_paused_until and now >= self.accept_paused_until:
            self.accept_paused_until = 0.0
            self.ep.register(self.listener_fd, select.EPOLLIN)
        for c in [c for c in self.conns.values() if c.out and now - c.moved_at > BACKLOG_STALL_S]:
            self._drop(f"not reading for {BACKLOG_STALL_S:.0f} s")
            self._close(c)

    def _close(self, c: _Conn) -> None:
        fd = c.sock.fileno()
        if self.conns.pop(fd, None) is None:
            return
        self.by_ident.pop(c.ident, None)
        if self.on_close is not None:
            self.on_close(c.ident)
        self.total_backlog -= c.out_bytes
        c.out.clear()
        c.out_bytes = 0
        try:
            self.ep.unregister(fd)
        except (OSError, ValueError):
            pass
        c.sock.close()

    def _drop(self, why: str) -> bool:
        self.dropped += 1
        now = time.monotonic()
        if now - self._logged_at >= 5.0:
            self.log.warning("%s: dropped %d replies to Unix-socket clients (latest: %s)", self.what, self.dropped, why)
            self._logged_at = now
        return False

    def close(self) -> None:
        for c in list(self.conns.values()):
            self._close(c)
        if self._own_ep:
            self.ep.close()
        elif not self.accept_paused_until:
            self.ep.unregister(self.listener_fd)
        self.listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class PortMux:
    """The worker's one reply port: a frame list whose identity is a Unix connection's goes to
    the UnixServer, any other to the ZeroMQ ReplyPort."""

    def __init__(self, zmq_port: ReplyPort, unix: UnixServer | None):
        self.zmq, self.unix = zmq_port, unix

    def send(self, frames) -> bool:
        if type(frames[0]) is UnixIdent:
            return self.unix.send(frames[0], frames[1:])
        return self.zmq.send(frames)

    @property
    def backlog(self) -> bool:
        return bool(self.zmq.backlog) or (self.unix is not None and self.unix.backlog)

    def flush(self) -> None:
        if self.zmq.backlog:
            self.zmq.flush()
        if self.unix is not None and self.unix.backlog:
            self.unix.flush()
