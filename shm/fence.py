"""Fencing: one writer per partition, even against a worker that was declared dead and returns.

Some facts: CPython cannot do an atomic compare-and-swap on shared memory, so an epoch check
followed by a write is a race on its own (the new owner may start between the check and the
write). ``flock`` locks, on the other hand, are released by the kernel when the holding process
dies, whatever the way it dies, and cost nothing while held.

What this means for us: ownership is an epoch *and* a lease. A new owner first writes its higher
epoch into the partition's control-table row (the fence: the old owner sees it at its next
append, or within one loop turn when idle, and lets go), then takes the partition's lock file
``<ipc_dir>/slot-<n>.lock``; only with the lock held *and* its own epoch still in the row may it
append. Two writers can therefore never overlap; a new owner whose predecessor is hung but alive
waits (answering NOT_READY, retriable) instead of writing beside it.
"""

from __future__ import annotations

import fcntl
import os


class OwnerLock:
    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.held = False

    def try_acquire(self) -> bool:
        if not self.held:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
            except BlockingIOError:
                return False
        return True

    def release(self) -> None:
        if self.held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False

    def close(self) -> None:
        self.release()
        os.close(self.fd)
