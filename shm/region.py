"""Create, attach and unlink named POSIX shared-memory regions; reclaim stale ones.

Some facts about POSIX shared memory on Linux: a region is a file in /dev/shm (tmpfs). It
outlives every process that maps it until it is unlinked, and its pages are only freed when the
last mapping goes. Fresh pages are slow to touch the first time (about 1 GiB/s here, against
14 GiB/s for memcpy). The control table and the small regions are mapped with MAP_POPULATE at
creation; rings are not (``populate=False``): a fresh partition's ring costs only the pages its
first batches touch, so 1,000 new partitions are written to at once instead of first faulting in
8 GiB (measured: the first write to 1,000 fresh partitions 16.3 s with MAP_POPULATE).

What this means for us: a region outlives a crash of any broker process. That is what makes an
acknowledgement at level ``memory`` survive a process crash; it is also why regions must be
unlinked on a clean shutdown and why stale ones must be found by name at boot. Names carry an
instance id derived from the data directory (``Settings.instance``, broker/settings.py), so two
brokers on one host never share a region.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from pathlib import Path

import posix_ipc

SHM_DIR = Path("/dev/shm")
NAME_PREFIX = "tailrace-"
MODE = 0o600  # owner-only


def control_name(instance: str) -> str:
    return f"/{NAME_PREFIX}{instance}-ctl"


def ring_name(instance: str, slot: int) -> str:
    return f"/{NAME_PREFIX}{instance}-r{slot}"


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, size: int, prot: int, flags: int, fdless: bool):
    """A shared mapping of ``fd``: CPython's mmap (which keeps a duplicate of the descriptor
    open as long as the mapping lives), or with ``fdless`` libc's mmap behind a memoryview that
    keeps none: 10,000 rings were 10,000 open files in the flusher and the workers. The fd-less
    mapping is unmapped when the last view of it goes (a finalizer on the ctypes array every
    view holds), as an mmap's pages stay while a buffer of them is exported. Returns (buffer,
    address or 0)."""
    if not fdless:
        return mmap.mmap(fd, size, flags=flags, prot=prot), 0
    addr = _libc.mmap(None, size, prot, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
    arr = (ctypes.c_char * size).from_address(addr)
    weakref.finalize(arr, _libc.munmap, addr, size)
    view = memoryview(arr).cast("B")
    return (view if prot & mmap.PROT_WRITE else view.toreadonly()), addr


class Region:
    """One mapped shared-memory region. ``buf`` is the mapping (an mmap, or a memoryview of an
    fd-less one: ``_map``), writable unless attached read only."""

    def __init__(self, name: str, size: int, created: bool, mm, inode: int = 0, addr: int = 0):
        self.name = name
        self.size = size
        self.created = created
        self.buf = mm
        self.inode = inode  # of the /dev/shm file mapped: a region re-made under the name has another
        self.addr = addr  # the fd-less mapping's address (0: an mmap object)

    @classmethod
    def create(cls, name: str, size: int, populate: bool = True, fdless: bool = False) -> "Region":
        """Create a new region exclusively (fails with posix_ipc.ExistentialError if it exists);
        ``populate``: fault every page in now (MAP_POPULATE), else as first touched."""
        shm = posix_ipc.SharedMemory(name, flags=posix_ipc.O_CREX, mode=MODE, size=size)
        try:
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mm, addr = _map(shm.fd, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fdless)
        finally:
            shm.close_fd()
        return cls(name, size, True, mm, addr=addr)

    @classmethod
    def attach(cls, name: str, read_only: bool = False, populate: bool = True, fdless: bool = False) -> "Region":
        """Map an existing region. ``read_only``: opened O_RDONLY and mapped PROT_READ (same-host
        readers: a stray store faults instead of corrupting the broker's memory), and not
        pre-faulted (a reader touches only the pages it reads)."""
        shm = posix_ipc.SharedMemory(name, read_only=read_only)
        try:
            size = shm.size
            inode = os.fstat(shm.fd).st_ino
            if read_only:
                mm, addr = _map(shm.fd, size, mmap.PROT_READ, mmap.MAP_SHARED, fdless)
            else:
                flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
                mm, addr = _map(shm.fd, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fdless)
        finally:
            shm.close_fd()
        return cls(name, size, False, mm, inode, addr)

    def madvise(self, option: int, start: int, length: int) -> None:
        """``madvise`` on ``[start, start + length)`` of the region (page aligned)."""
        if not self.addr:
            self.buf.madvise(option, start, length)
        elif _libc.madvise(self.addr + start, length, option) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise({option}) of {length} bytes: {os.strerror(err)}")

    def is_current(self) -> bool:
        """Whether the name still names the region mapped here (not unlinked, not re-made)."""
        try:
            return (SHM_DIR / self.name.lstrip("/")).stat().st_ino == self.inode
        except FileNotFoundError:
            return False

    def close(self) -> None:
        if self.addr:  # fd-less: unmapped once the last view of it goes (_map)
            self.buf = None
            return
        try:
            self.buf.close()
        except BufferError:
            # numpy views still reference the mapping; the process is going away anyway.
            pass

    def unlink(self) -> None:
        unlink(self.name)


def exists(name: str) -> bool:
    return (SHM_DIR / name.lstrip("/")).exists()


def unlink(name: str) -> bool:
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def list_instance_regions(instance: str) -> list[str]:
    prefix = f"{NAME_PREFIX}{instance}-"
    try:
        return sorted("/" + p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return []


def resident_bytes(instance: str) -> int:
    """The memory an instance's regions hold now: their tmpfs blocks (rings are sparse files; a
    page counts once written, until given back). One stat per region."""
    prefix, total = f"{NAME_PREFIX}{instance}-", 0
    try:
        with os.scandir(SHM_DIR) as it:
            for entry in it:
                if entry.name.startswith(prefix):
                    try:
                        total += entry.stat().st_blocks * 512
                    except FileNotFoundError:  # unlinked meanwhile
                        pass
    except FileNotFoundError:
        pass
    return total


def reclaim_rings(instance: str) -> list[str]:
    """Unlink every ring region of an instance (used at a full boot, before any actor runs)."""
    gone = []
    for name in list_instance_regions(instance):
        if name != control_name(instance) and unlink(name):
            gone.append(name)
    return gone
