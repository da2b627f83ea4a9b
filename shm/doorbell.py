"""Doorbells: one-byte Unix datagrams that wake a process blocked in poll.

The flusher's kicks (a worker says b"D": a durable ack waits; b"F": plain data waits; b"N": it
adopted a new partition) and its sync notices to the workers (b"D" after every sync, b"E" after a
latched I/O error) go straight from one process's main thread to the other's: one ``sendto`` on a
Unix datagram socket bound in the broker's 0700 ipc directory, one ``recv`` at the other end. Over
ZeroMQ each also crossed the I/O threads of both ends, so a kick or a sync notice woke three
threads instead of one, on the durable ack's path (docs/BENCHMARKS.md, "The flusher's cycle
under single-message load").

A bell is rung, not queued: when its queue is full (its owner has not looked yet) ``ring`` drops
the datagram and still reports True, since the owner wakes for those already waiting. A bell
whose owner is gone (a new process binds the same path when it starts) makes ``ring`` return
False. Nothing a bell carries is data: a lost ring costs latency, and every user also looks on a
timer (the flusher once per tick, a worker with durable waiters every 20 ms).
"""

from __future__ import annotations

import os
import select
import socket

DRAIN_MAX = 10_000  # datagrams read per drain (each is one byte; the queue holds a few hundred)


class Doorbell:
    """The bound end: poll ``fileno()``, then ``drain()``."""

    def __init__(self, path: str):
        self.path = path
        try:
            os.unlink(path)  # a previous owner's (killed, or stopped uncleanly)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o077)  # owner only, like the worker's request socket (client/unixwire.py)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.setblocking(False)
        self._inode = os.stat(path).st_ino
        self._poll = select.poll()  # not select.select: a worker's fds can pass 1024
        self._poll.register(self.sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> bytes:
        """Every ring waiting, joined (b"" if none)."""
        got = []
        for _ in range(DRAIN_MAX):
            try:
                got.append(self.sock.recv(64))
            except BlockingIOError:
                break
        return b"".join(got)

    def wait(self, timeout_s: float) -> bool:
        """Whether a ring waits (blocks up to ``timeout_s``)."""
        return bool(self._poll.poll(max(0, int(timeout_s * 1000))))

    def close(self) -> None:
        self.sock.close()
        try:
            if os.stat(self.path).st_ino == self._inode:  # not a successor's bell
                os.unlink(self.path)
        except FileNotFoundError:
            pass


class Ringer:
    """The other end: rings bells by path from one unbound socket."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def ring(self, path: str, message: bytes) -> bool:
        """Ring ``path``; False if nobody has it bound (its owner is gone or not started)."""
        try:
            self.sock.sendto(message, path)
        except BlockingIOError:  # its queue is full: the owner wakes for those already there
            pass
        except OSError:  # nobody bound (FileNotFoundError, ConnectionRefusedError), or no access
            return False
        return True

    def close(self) -> None:
        self.sock.close()
