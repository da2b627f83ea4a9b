"""The same-host transport: tailrace's multipart messages over a Unix stream socket.

Every worker also listens on a Unix socket (``unix://<ipc dir>/worker-<id>.sock``, in the broker's
0700 ipc directory). A same-host client sends exactly the frames it would send a worker over
ZeroMQ (routing, header, body: docs/PROTOCOL.md), each message framed as::

    u32 total (bytes after this field) | u16 nframes | u32 length x nframes | the frames, back to back

little-endian, and gets replies framed the same way. There is no ZeroMQ I/O thread on either
side: a request is one ``sendmsg`` and one ``recv`` per end, which on a 2-vCPU VM costs a
quarter of a ZeroMQ round trip's CPU (docs/BENCHMARKS.md, "The transport floor").

A stream cannot skip a bad message, so a framing error (a length over the limit, a frame count
out of range, lengths that do not add up) is answered with MALFORMED and the connection is
closed; anything inside well-framed frames is the worker's ordinary request handling.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
MAX_FRAMES = 16
SCHEME = "unix://"
RECV_BYTES = 1 << 18


class WireError(Exception):
    """The byte stream does not hold a well-framed message (the connection must be closed)."""


def encode(frames) -> list:
    """The buffers of one framed message (for ``sendmsg``: no join, no copy of the frames)."""
    lens = [len(f) for f in frames]
    n = len(lens)
    head = U32.pack(2 + 4 * n + sum(lens)) + U16.pack(n) + struct.pack(f"<{n}I", *lens)
    return [head, *frames]


class FrameReader:
    """Splits a received byte stream into messages (lists of ``bytes`` frames)."""

    def __init__(self, limit: int):
        self.limit = limit  # largest ``total`` accepted
        self.buf = bytearray()
        self.error: WireError | None = None  # the framing error met, once met (the stream is over)

    def feed(self, data) -> None:
        if self.error is None:
            self.buf += data

    def messages(self) -> list[list[bytes]]:
        """Every complete message buffered. The well-framed messages in front of a framing error
        are returned first (their order does not depend on how the kernel cut the stream); the
        error is raised by the call that finds it with nothing before it, or by the next call."""
        if self.error is not None:
            raise self.error
        out = []
        buf = self.buf
        pos, end = 0, len(buf)
        with memoryview(buf) as mv:
            while end - pos >= 4:
                total = U32.unpack_from(buf, pos)[0]
                if total < 6 or total > self.limit:
                    self.error = WireError(f"message of {total} bytes (limit {self.limit})")
                    break
                if end - pos - 4 < total:
                    break
                n = U16.unpack_from(buf, pos + 4)[0]
                if not 1 <= n <= MAX_FRAMES or 2 + 4 * n > total:
                    self.error = WireError(f"{n} frames in a message of {total} bytes (1..{MAX_FRAMES} allowed)")
                    break
                lens = struct.unpack_from(f"<{n}I", buf, pos + 6)
                at = pos + 6 + 4 * n
                if at + sum(lens) != pos + 4 + total:
                    self.error = WireError(f"frame lengths {list(lens)} do not add up to the message's {total} bytes")
                    break
                frames = []
                for length in lens:
                    frames.append(bytes(mv[at : at + length]))
                    at += length
                out.append(frames)
                pos = at
        if self.error is not None:
            buf.clear()
            if not out:
                raise self.error
            return out
        if pos:
            del buf[:pos]
        return out


def path_of(endpoint: str) -> str:
    return endpoint[len(SCHEME):]


class UnixSocket:
    """The client end, with the parts of the ZeroMQ socket API that client/connection.py uses
    (``poll``, ``fileno`` for zmq.Poller, ``close``); ``send_frames``/``recv_frames`` instead of
    multipart calls. Blocking sends (a client waits for room like a full ZeroMQ pipe)."""

    def __init__(self, endpoint: str, limit: int = 1 << 30):
        self.endpoint = endpoint
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path_of(endpoint))
        self.reader = FrameReader(limit)
        self.ready: list[list[bytes]] = []
        self.closed = False
        # One receive buffer, reused: ``recv(n)`` allocates n bytes per call, and above glibc's
        # mmap threshold that is an mmap, page faults and an munmap for every message.
        self._rbuf = bytearray(RECV_BYTES)
        self._rmv = memoryview(self._rbuf)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_frames(self, frames) -> None:
        bufs = encode(frames)
        total = sum(len(b) for b in bufs)
        sent = self.sock.sendmsg(bufs, [], socket.MSG_NOSIGNAL)  # a gone worker: EPIPE, not SIGPIPE
        if sent < total:  # the kernel buffer was full: send the rest as it drains
            rest = memoryview(b"".join(bufs))[sent:]
            while rest:
                rest = rest[self.sock.send(rest, socket.MSG_NOSIGNAL):]

    def poll(self, timeout_ms: int) -> bool:
        """Whether a whole message is waiting (reads what the kernel has; waits up to
        ``timeout_ms``, -1 = forever)."""
        if self.ready:
            return True
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            r, _, _ = select.select([self.sock], [], [], left)
            if r:
                self._read()
                if self.ready:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _read(self) -> None:
        n = self.sock.recv_into(self._rbuf)
        if not n:
            raise ConnectionError(f"{self.endpoint}: the worker closed the connection")
        self.reader.feed(self._rmv[:n])
        try:
            self.ready.extend(self.reader.messages())
        except WireError as exc:
            raise ConnectionError(f"{self.endpoint}: {exc}") from exc

    def recv_frames(self) -> list[bytes]:
        """The next message (call after ``poll`` said one is waiting)."""
        return self.ready.pop(0)

    def close(self, linger: int = 0) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


def listen(path: str) -> socket.socket:
    """A non-blocking listening socket at ``path`` (a stale file from a killed worker is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        s.bind(path)
    finally:
        os.umask(old)
    s.listen(256)
    s.setblocking(False)
    return s


WOULD_BLOCK = (errno.EAGAIN, errno.EWOULDBLOCK)
