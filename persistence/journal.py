"""The journal: one append-only byte log shared by every partition of the host.

File format. The journal is a series of segment files ``<journal_dir>/<start position, 20
digits>.log``, each exactly ``segment_bytes`` long and pre-written with zeros before use. A
segment holds record batches back to back, each padded to 8 bytes, exactly as they sat in the
partition ring (broker fields stamped). A batch never straddles two segments: when the next batch
does not fit, the rest of the segment stays zero and writing goes on at the next segment's start.
So a reader that meets a zero ``length`` knows the segment's data ended there.

::

    00000000000000000000.log              00000000000067108864.log
    +--------+--------+-----+--------+---+ +--------+-----
    | batch  | batch  | ... | batch  | 0 | | batch  | ...
    +--------+--------+-----+--------+---+ +--------+-----
    ^position 0                             ^position 67108864

Writes. The flusher writes 4 KiB-aligned spans: a span starts at the block holding the journal's
unaligned end (that block's head is carried in the staging buffer and written again, with the
same bytes, so a torn rewrite cannot change data already there) and ends padded with zeros to the
next 4 KiB. With O_DIRECT the page cache is bypassed (about 2 GiB/s here, and steady).

Some facts about fsync: after a failed fsync the kernel may have dropped the dirty pages, and a
later fsync can succeed without the data ever reaching the disk. What this means for us: the
first write or sync error is latched; every later write and sync raises it again until restart,
and nothing written after it is ever acknowledged as durable.

Pre-writing (zero-fill + fsync) instead of fallocate: on this machine kind it cut fdatasync
latency by 31-47 %; fallocate'd extents cost a metadata update at every sync.

Thread-safety: one writer (the flusher main thread) plus one pre-writer thread that only creates
files not yet in use. Readers (workers) open segments read-only.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from pathlib import Path

from tailrace.broker import datadir
from tailrace.broker.datadir import JOURNAL_DIR, SEGMENT_SUFFIX, fsync_dir, segment_name

log = logging.getLogger("tailrace.journal")

BLOCK = 4096


class StorageError(OSError):
    """Raised when the journal cannot be written; latched until the flusher restarts."""


def list_segments(journal_dir: Path) -> list[int]:
    out = []
    for p in journal_dir.glob("*" + SEGMENT_SUFFIX):
        stem = p.name[: -len(SEGMENT_SUFFIX)]
        if len(stem) == 20 and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def _open_direct(path: Path, want_direct: bool) -> tuple[int, bool]:
    if want_direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDWR | os.O_DIRECT), True
        except OSError:
            pass
    return os.open(path, os.O_RDWR), False


def check_segments(journal_dir: Path, segment_bytes: int) -> None:
    """Refuse a journal written with another segment size; pad a short last segment.

    Segment names are start positions, so a journal is only readable with the segment size it
    was written with: a segment name that is not a multiple of ``segment_bytes``, or a segment
    a whole multiple of it in size, means the setting changed (StorageError, nothing touched). A segment that is
    merely short (cut by a crash or by hand) is grown back with zeros so positions stay where
    they were; whatever it lost is then a torn tail for recovery to cut."""
    segs = list_segments(journal_dir)
    for start in segs:
        path = journal_dir / segment_name(start)
        size = path.stat().st_size
        if size > segment_bytes and size % segment_bytes:
            # bytes past the end are never addressed: garbage appended, not another segment size
            log.warning("journal segment %s is %d bytes, past %d: trimming the excess", path, size, segment_bytes)
            os.truncate(path, segment_bytes)
            size = segment_bytes
        if start % segment_bytes or size > segment_bytes:
            raise StorageError(
                f"journal segment {path} ({size} bytes) does not fit segment_bytes={segment_bytes}: "
                f"was the journal written with another segment size? Start with the segment_bytes it was made with")
        if size < segment_bytes:
            log.warning("journal segment %s is %d bytes, short of %d: padding it with zeros", path, size, segment_bytes)
            os.truncate(path, segment_bytes)


class Journal:
    """The writer side of the journal (flusher only)."""

    def __init__(self, data_dir: str | os.PathLike, segment_bytes: int, direct_io: bool = True):
        self.dir = Path(data_dir) / JOURNAL_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.want_direct = direct_io
        self.direct = False
        self.error: BaseException | None = None
        self.fd = -1
        self.segment_start = -1
        self._unsynced_fds: set[int] = set()
        self._old_fds: list[int] = []
        self._prewrite_from = 1 << 62  # journal position past which the next segment is pre-written
        # The flusher sets defer_prewrite: at half full it is told (prewrite_wanted) and applies byte
        # limits first, so the segments they free go before the next one is written (the journal's bound)
        self.defer_prewrite = False
        self.prewrite_wanted = False
        self._prewrite_lock = threading.Lock()
        self._prewrite_thread: threading.Thread | None = None

    # --- files ---------------------------------------------------------------------------
    def path(self, start: int) -> Path:
        return self.dir / segment_name(start)

    def segment_of(self, position: int) -> int:
        return position - position % self.segment_bytes

    def _prewrite(self, start: int) -> None:
        """Create a zero-filled, fsynced segment file at ``start`` if it does not exist yet.

        Never replaces an existing segment: one of another size is an error (check_segments)."""
        with self._prewrite_lock:
            final = self.path(start)
            if final.exists():
                size = final.stat().st_size
                if size != self.segment_bytes:
                    raise StorageError(f"journal segment {final} is {size} bytes, segment_bytes={self.segment_bytes}")
                return
            tmp = final.with_name(datadir.temp_name(final.name))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                zeros = bytes(min(self.segment_bytes, 1 << 20))
                left = self.segment_bytes
                while left:
                    left -= os.write(fd, zeros[: min(left, len(zeros))])
                os.fsync(fd)
            except OSError:
                os.close(fd)
                tmp.unlink(missing_ok=True)  # give the space back: the disk may be full
                raise
            else:
                os.close(fd)
            os.replace(tmp, final)
            fsync_dir(self.dir)

    def prewrite_next_async(self) -> None:
        nxt = self.segment_start + self.segment_bytes
        if self.path(nxt).exists() or (self._prewrite_thread and self._prewrite_thread.is_alive()):
            return
        self._prewrite_thread = threading.Thread(target=self._prewrite_safely, args=(nxt,), daemon=True)
        self._prewrite_thread.start()

    def _prewrite_safely(self, start: int) -> None:
        try:
            self._prewrite(start)
        except OSError as exc:  # surfaced when the segment is needed
            log.warning("pre-writing segment %s failed: %s", segment_name(start), exc)

    def open_segment(self, start: int) -> None:
        """Make the segment at ``start`` the one being written (pre-writing it if needed)."""
        self._check()
        try:
            self._prewrite(start)
            fd, direct = _open_direct(self.path(start), self.want_direct)
        except OSError as exc:
            self._latch(exc)
        if self.fd >= 0:
            self._old_fds.append(self.fd)
        self.fd, self.direct, self.segment_start = fd, direct, start
        self._prewrite_from = start + self.segment_bytes // 2  # the next one is pre-written once this is half full

    # --- writing -------------------------------------------------------------------------
    def _check(self) -> None:
        if self.error is not None:
            raise StorageError(f"journal unavailable after an earlier error: {self.error}") from self.error

    def _latch(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            log.error("journal write failed, latched until restart: %s", exc)
        raise StorageError(f"journal write failed: {exc}") from exc

    def write_aligned(self, buf: mmap.mmap, length: int, position: int) -> None:
        """Write ``buf[:length]`` (length a multiple of 4096) at journal ``position`` (aligned)."""
        self._check()
        assert position % BLOCK == 0 and length % BLOCK == 0, (position, length)
        assert self.segment_start <= position and position + length <= self.segment_start + self.segment_bytes
        try:
            mv = memoryview(buf)[:length]
            try:
                done = 0
                while done < length:
                    done += os.pwrite(self.fd, mv[done:], position - self.segment_start + done)
            finally:
                mv.release()
        except OSError as exc:
            self._latch(exc)
        self._unsynced_fds.add(self.fd)
        if position + length >= self._prewrite_from:  # half full: pre-write the next segment now, not
            self._prewrite_from = 1 << 62               # at the roll (nor earlier: it is disk retention cannot free)
            if self.defer_prewrite:
                self.prewrite_wanted = True
            else:
                self.prewrite_next_async()

    def sync(self) -> None:
        self._check()
        try:
            for fd in list(self._unsynced_fds):
                os.fdatasync(fd)
                self._unsynced_fds.discard(fd)
        except OSError as exc:
            self._latch(exc)
        for fd in self._old_fds:
            if fd not in self._unsynced_fds:
                os.close(fd)
        self._old_fds = [fd for fd in self._old_fds if fd in self._unsynced_fds]

    @property
    def dirty(self) -> bool:
        return bool(self._unsynced_fds)

    def close(self) -> None:
        if self._prewrite_thread is not None:
            self._prewrite_thread.join(timeout=30)
        for fd in [*self._old_fds, self.fd]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = -1
        self._old_fds = []


class JournalReader:
    """Read-only access to journal bytes by position (workers' cold reads, recovery)."""

    def __init__(self, data_dir: str | os.PathLike, segment_bytes: int):
        self.dir = Path(data_dir) / JOURNAL_DIR
        self.segment_bytes = segment_bytes
        self._fds: dict[int, int] = {}

    def _fd(self, start: int) -> int:
        fd = self._fds.get(start)
        if fd is None:
            fd = os.open(self.dir / segment_name(start), os.O_RDONLY)
            if len(self._fds) > 64:
                for old in list(self._fds)[:32]:
                    os.close(self._fds.pop(old))
            self._fds[start] = fd
        return fd

    def read_into(self, out: memoryview, position: int) -> None:
        """Fill ``out`` with journal bytes from ``position`` (one copy, no new allocation)."""
        start = position - position % self.segment_bytes
        done = os.preadv(self._fd(start), [out], position - start)
        if done != out.nbytes:
            raise OSError(f"short journal read at position={position}: wanted {out.nbytes}, got {done}")

    def read(self, position: int, length: int) -> bytes:
        start = position - position % self.segment_bytes
        data = os.pread(self._fd(start), length, position - start)
        if len(data) != length:
            raise OSError(f"short journal read at position={position}: wanted {length}, got {len(data)}")
        return data

    def drop_unlinked(self) -> int:
        """Close the cached files of segments that retention deleted: an open descriptor keeps a
        deleted file's blocks on the disk. Returns how many were closed."""
        gone = [start for start, fd in self._fds.items() if os.fstat(fd).st_nlink == 0]
        for start in gone:
            os.close(self._fds.pop(start))
        return len(gone)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
