"""Producer state for idempotent produce (as Kafka's idempotent producer).

A producer stamps every batch with a random 63-bit ``producer_id`` and, per partition, a
``base_sequence`` that counts the records it sent there (both inside the CRC). When a producer
retries a batch whose acknowledgement it never saw, the owner finds the same (producer id,
base sequence, count) among that producer's recent batches and answers with the original
offsets instead of appending again.

The state is rebuilt whenever an actor takes a partition over (after a worker crash, a move or
a restart) from the batch headers still in the ring, and from the last batches on disk when the
ring holds few: no separate file. The window is the last ``KEEP`` batches per producer, and a
retry older than that is appended again: with the producer's default of one batch in flight per
partition a retry is always the newest batch, well inside the window.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

KEEP = 8  # batches remembered per producer
MAX_PRODUCERS = 20_000  # least recently used producers beyond this are forgotten


class ProducerState:
    def __init__(self):
        self.by_pid: OrderedDict[int, deque] = OrderedDict()  # pid -> deque of (base_seq, count, base_offset, append_time_us)

    def find(self, pid: int, base_seq: int, count: int):
        if pid < 0:
            return None
        q = self.by_pid.get(pid)
        if q is None:
            return None
        for e in q:
            if e[0] == base_seq and e[1] == count:
                return e
        return None

    def record(self, pid: int, base_seq: int, count: int, base_offset: int, append_time_us: int) -> None:
        if pid < 0:
            return
        q = self.by_pid.get(pid)
        if q is None:
            q = self.by_pid[pid] = deque(maxlen=KEEP)
            if len(self.by_pid) > MAX_PRODUCERS:
                self.by_pid.popitem(last=False)
        else:
            self.by_pid.move_to_end(pid)
        q.append((base_seq, count, base_offset, append_time_us))

    def load(self, pids: np.ndarray, seqs: np.ndarray, counts: np.ndarray, bases: np.ndarray, times: np.ndarray) -> None:
        """Feed batches in append order (at takeover only: one step per recent batch)."""
        keep = pids >= 0
        for pid, seq, n, base, t in zip(pids[keep].tolist(), seqs[keep].tolist(), counts[keep].tolist(),
                                        bases[keep].tolist(), times[keep].tolist()):
            self.record(pid, seq, n, base, t)
