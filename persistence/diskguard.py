"""The disk guard: what the flusher does when the journal's filesystem fills up.

Some facts about a full disk:

- The journal pre-writes each segment before it is needed (persistence/journal.py), so a disk
  that fills shows up first as a segment that cannot be pre-written, then as a write error the
  flusher latches (STORAGE_UNAVAILABLE, a flusher restart). Acknowledged records are safe through
  that, but every produce fails in the hardest way and the flusher crash-loops until room returns.
- The journal's filesystem is often shared (another file, another program's logs): its free
  space can vanish without a byte written by us, and come back the same way.
- Kafka and Redpanda stop accepting writes when the disk is nearly full (Redpanda:
  ``storage_min_free_bytes``, a degraded mode with an alert) and delete nothing inside
  retention. RocketMQ instead deletes its oldest commit-log files past ``diskMaxUsedSpaceRatio``.

What this means for us: every ``DISK_CHECK_NS`` (and after every retention pass) the flusher
looks at the filesystem (one ``statvfs``). Fuller than ``disk_max_used_ratio`` is *storage full*:

- ``disk_full_policy = refuse`` (the default): the flusher stores 1 in the control table
  header's ``storage_full`` word (shm/layout.py; ``FlusherHeader``) and every worker answers
  PRODUCE with ``STORAGE_FULL``, a retriable code (the client backs off and retries), after one
  load of that word per request. Nothing inside retention is deleted: a record acknowledged
  durable stays until its retention says otherwise. Reads, commits and admin go on. Once the
  filesystem is no fuller than ``disk_max_used_ratio - RESUME_MARGIN`` (someone freed space, or
  retention deleted segments) the word goes back to 0 and produce resumes, without a restart.
  The margin keeps the state from flapping with every segment written or deleted.
- ``disk_full_policy = delete_oldest`` (opt in, RocketMQ's): first the oldest journal segments
  go, inside retention, one at a time while the filesystem is still too full; every partition
  with records in a deleted segment has its log start moved past it (durably first,
  ``Retention.expire_below``). Never a segment written to within
  ``disk_force_delete_min_age_ms`` (default 1 hour): its modification time is at or after the
  append time of its youngest record, so no record younger than that is ever deleted. Nor the
  checkpoint's segment or a later one (recovery needs them). Every record and segment deleted
  this way is counted (``journal_records_forced``, ``journal_segments_forced`` in the flusher's
  stats: Prometheus counters, ``tailrace status``). When nothing more may go, produce is refused
  as under ``refuse``.

``disk_max_used_ratio = 1`` turns the guard off (a disk that fills then fails as described first).

The guard takes narrow handles (persistence/handles.py): the ``Storage`` (settings, the
journal bounds), the header word it owns (shm/rows.py ``FlusherHeader``) and the retention pass
whose public ``expire_below`` and ``delete_segments`` it asks to delete; never the flusher.

Thread-safety: the flusher's main thread only; the header word has this one writer.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.shm.rows import FlusherHeader

from .handles import Storage
from .journal import list_segments

log = logging.getLogger("tailrace.diskguard")

REFUSE = "refuse"
DELETE_OLDEST = "delete_oldest"
DISK_CHECK_NS = 100_000_000  # a statvfs this often: at 500 MB/s the disk fills 50 MB past the ratio at most
RESUME_MARGIN = 0.02  # produce resumes once the used ratio is this far below the limit (hysteresis)


def used_ratio(path) -> float:
    """The fraction of the filesystem under ``path`` that an unprivileged writer cannot use."""
    st = os.statvfs(path)
    return 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0


class DiskGuard:
    """The flusher's disk check (``check``), its ``storage_full`` word and what it deleted."""

    def __init__(self, store: Storage, header: FlusherHeader, retention):
        self.s = store.s
        self.bounds = store.bounds
        self.journal_dir = Path(self.s.data_dir) / JOURNAL_DIR
        self.r = retention  # persistence/retention.py Retention: expire_below, delete_segments
        self.header = header
        self.full = False  # as last published in the header
        self.header.storage_full = 0  # a word left by the flusher before us is stale (boot: nothing is served yet)
        self.used = 0.0  # the used ratio at the last check
        self.next_ns = 0
        self.segments_forced = 0  # segments deleted inside retention (delete_oldest)
        self.records_forced = 0  # records those deletions took below their retention
        self.stuck = False  # delete_oldest over the ratio with nothing it may delete (logged once)

    def due(self, now_ns: int) -> bool:
        return now_ns >= self.next_ns

    def check(self, now_ns: int) -> None:
        """Look at the filesystem, force-delete if the policy says so, publish storage full or not."""
        self.next_ns = now_ns + DISK_CHECK_NS
        ratio = self.s.disk_max_used_ratio
        if ratio >= 1.0:
            return self._publish(False)
        used = self.used = used_ratio(self.journal_dir)
        if used > ratio and self.s.disk_full_policy == DELETE_OLDEST:
            used = self.used = self._force_delete(used, ratio)
        self._publish(used > ratio if not self.full else used > ratio - RESUME_MARGIN)

    def _publish(self, full: bool) -> None:
        if full == self.full:
            return
        self.full = full
        self.header.storage_full = int(full)
        ratio = self.s.disk_max_used_ratio
        if full:
            log.error("storage full: the journal's filesystem is %.1f%% used (disk_max_used_ratio %.0f%%): produce is "
                      "refused with STORAGE_FULL until it is %.0f%% or less (disk_full_policy=%s)",
                      self.used * 100, ratio * 100, (ratio - RESUME_MARGIN) * 100, self.s.disk_full_policy)
        else:
            log.warning("storage no longer full: the journal's filesystem is %.1f%% used: produce is accepted again",
                        self.used * 100)

    def _force_delete(self, used: float, ratio: float) -> float:
        """Delete the oldest segments inside retention while ``used`` is over ``ratio`` and one may
        go (older than the minimum age, below the checkpoint's segment); the used ratio after."""
        r, seg_bytes = self.r, self.s.segment_bytes
        keep = self.bounds.keep_from(seg_bytes)
        written_before_s = time.time() - self.s.disk_force_delete_min_age_ms / 1000
        for seg in list_segments(self.journal_dir):
            if used <= ratio:
                self.stuck = False
                return used
            path = self.journal_dir / segment_name(seg)
            try:
                young = os.stat(path).st_mtime > written_before_s
            except FileNotFoundError:
                continue  # retention deleted it just now
            if seg + seg_bytes > keep or young:
                break
            records = r.expire_below(seg + seg_bytes)
            deleted = r.segments_deleted
            r.delete_segments()
            self.segments_forced += r.segments_deleted - deleted
            self.records_forced += records
            log.warning("disk guard (disk_full_policy=delete_oldest): the journal's filesystem was %.1f%% used (limit "
                        "%.0f%%): deleted segment %s inside retention, %d records below their retention "
                        "(%d records in %d segments so far)", used * 100, ratio * 100, segment_name(seg), records,
                        self.records_forced, self.segments_forced)
            used = used_ratio(self.journal_dir)
        if used > ratio and not self.stuck:
            self.stuck = True
            log.error("disk guard: the journal's filesystem is %.1f%% used (limit %.0f%%) and no segment may be deleted "
                      "(the oldest was written within disk_force_delete_min_age_ms=%d, or is the checkpoint's)",
                      used * 100, ratio * 100, self.s.disk_force_delete_min_age_ms)
        return used
