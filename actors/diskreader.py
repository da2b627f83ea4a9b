"""The worker's disk-reader thread: every fetch that must read the journal runs here."""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import zmq

from tailrace.client import protocol as P
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.log import DiskRead, FetchResult, PartitionLog

log = logging.getLogger("tailrace.worker")

READS_ENDPOINT = "inproc://tailrace-disk-reads"
UNLINKED_SWEEP_S = 1.0  # how often cached journal files are checked for deletion by retention


class DiskReader(threading.Thread):
    """A consumer far behind (cold reads, page-cache misses) never stalls produce or hot fetches
    on the worker's loop. The loop hands over a ``DiskRead`` and a callback; the thread reads
    through its own ``PartitionLog`` per slot (its own index descriptors, its own journal
    handles; the preads release the GIL), puts ``(callback, result)`` on a queue and pokes the
    loop over an inproc socket; the loop sends the reply (ZeroMQ sockets stay on the loop's
    thread). One thread: cold reads of a worker queue behind each other, not behind produce.

    Concurrency contract: ``submit``, ``finish`` and ``pending`` are the loop thread's; ``logs``
    and ``journal`` are this thread's alone; the two queues are the only things both touch.
    """

    def __init__(self, ctx: zmq.Context, rows: np.ndarray, data_dir: str, segment_bytes: int):
        super().__init__(name="disk-reader", daemon=True)
        self.ctx = ctx
        self.rows = rows  # the control table's rows, read only (PartitionLog)
        self.data_dir = data_dir
        self.journal = JournalReader(data_dir, segment_bytes)
        self.logs: dict[int, PartitionLog] = {}  # slot -> this thread's view of its log
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()  # of (DiskRead, callback), None to stop
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # of (callback, FetchResult)
        self.pending = 0  # reads handed over and not yet answered (loop thread only)

    def _log(self, slot: int) -> PartitionLog:
        plog = self.logs.get(slot)
        if plog is None:
            plog = self.logs[slot] = PartitionLog(self.rows[slot], self.data_dir, slot, self.journal)
        return plog

    def submit(self, job: DiskRead, callback) -> None:
        self.pending += 1
        self.jobs.put((job, callback))

    def run(self) -> None:
        poke = self.ctx.socket(zmq.PUSH)
        poke.setsockopt(zmq.SNDHWM, 1)
        poke.connect(READS_ENDPOINT)
        swept = time.monotonic()
        try:
            while True:
                if time.monotonic() - swept > UNLINKED_SWEEP_S:  # segments retention deleted: let their blocks go
                    self.journal.drop_unlinked()
                    for slot in [k for k, plog in self.logs.items() if plog.index_unlinked()]:
                        self.logs.pop(slot).close()  # a deleted topic's: let its blocks go
                    swept = time.monotonic()
                try:
                    item = self.jobs.get(timeout=UNLINKED_SWEEP_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                job, callback = item
                try:
                    res = self._log(job.slot).read(job)
                except FileNotFoundError:  # its segment went with retention since the fetch came in
                    res = FetchResult(P.ErrorCode.OFFSET_OUT_OF_RANGE, [], job.offset, "disk")
                except Exception as exc:  # a failed read is an error reply, not a dead thread
                    log.exception("disk read slot=%d offset=%d failed", job.slot, job.offset)
                    res = FetchResult(P.ErrorCode.INTERNAL, [], job.offset, f"disk: {type(exc).__name__}")
                self.done.put((callback, res))
                try:
                    poke.send(b"", zmq.NOBLOCK)  # one poke pending is enough: the loop drains all
                except zmq.Again:
                    pass
        finally:
            poke.close(0)
            self.journal.close()
            for plog in self.logs.values():
                plog.close()

    def finish(self) -> None:
        """Loop thread: send the replies of every read that completed."""
        while True:
            try:
                callback, res = self.done.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            callback(res)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.jobs.put(None)
        self.join(timeout_s)
