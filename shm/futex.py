"""Wake-ups through a futex word in shared memory (Linux, x86-64), for same-host ring readers.

Writers (a worker at the first append of a loop turn and, for what came after, at its end; the
flusher after a sync) store a new value into the control table's ``wake`` word and call FUTEX_WAKE on it; a reader that found nothing to
read calls FUTEX_WAIT with the value it loaded *before* it looked. The kernel compares and queues
atomically, so a store between the reader's look and its wait makes the wait return at once: no
wake-up is lost, and an idle reader costs nothing. The word is process-shared (no
FUTEX_PRIVATE_FLAG): its key is the tmpfs page, the same in every process that maps it, and
a wait needs only read access, so readers keep their PROT_READ mapping.

Values are ``(count << 8 | writer id) mod 2**32``: two writers never store the same value, so
the stores need no atomic read-modify-write from Python. Both calls go through libc's
``syscall`` via ctypes (which releases the GIL while waiting).
"""

from __future__ import annotations

import ctypes
import errno
import time

SYS_FUTEX = 202  # x86-64
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAKE_ALL = 0x7FFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_SYS_FUTEX, _WAIT, _WAKE = ctypes.c_long(SYS_FUTEX), ctypes.c_long(FUTEX_WAIT), ctypes.c_long(FUTEX_WAKE)
_WAKE_ALL, _ZERO = ctypes.c_long(WAKE_ALL), ctypes.c_long(0)


def wake(addr: ctypes.c_void_p) -> int:
    """Wake every process waiting on the word at ``addr``; returns how many were woken.
    (Argument objects built once: a worker calls this once or twice in a loop turn that appended.)"""
    return _syscall(_SYS_FUTEX, addr, _WAKE, _WAKE_ALL, None, None, _ZERO)


def wait(addr: ctypes.c_void_p, expected: int, timeout_s: float) -> bool:
    """Sleep until the word at ``addr`` is woken, unless it no longer holds ``expected``, for at
    most ``timeout_s``. Returns False when it timed out (or the call is not available)."""
    ts = _Timespec(int(timeout_s), int((timeout_s - int(timeout_s)) * 1e9))
    r = _syscall(_SYS_FUTEX, addr, _WAIT, ctypes.c_long(expected & 0xFFFFFFFF), ctypes.byref(ts), None, _ZERO)
    if r == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EAGAIN, errno.EINTR):
        return True
    if err != errno.ETIMEDOUT:  # no futex here (another kernel or CPU): poll instead
        time.sleep(min(timeout_s, 0.001))
    return False
