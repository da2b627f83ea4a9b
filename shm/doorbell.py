"""Doorbells: one-byte Unix datagrams that wake a process blocked in poll.

The flusher's kicks (a worker rings ``KICK_DURABLE``: a durable ack waits; ``KICK_DATA``: plain
data waits; ``KICK_ADOPTED``: it adopted a new partition) and its notices to the workers
(``SYNCED`` after every sync, ``IO_ERROR`` after a latched I/O error) go straight from one process's main thread to the other's: one ``sendto`` on a
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

# The messages: one byte each. Every sender and receiver uses these names.
KICK_DURABLE = b"D"  # worker -> flusher: a durable ack waits; sync soon (group commit)
KICK_DATA = b"F"  # worker -> flusher: plain data waits past the kick threshold
KICK_ADOPTED = b"N"  # worker -> flusher: I adopted a partition; its control row is active now
SYNCED = b"D"  # flusher -> workers: a sync finished; durable watermarks moved
IO_ERROR = b"E"  # flusher -> workers: the journal latched an I/O error

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
