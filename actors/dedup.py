"""Producer state for idempotent produce (as Kafka's idempotent producer).

A producer stamps every batch with a random 63-bit ``producer_id`` and, per partition, a
``base_sequence`` that counts the records it sent there (both inside the CRC). When a producer
retries a batch whose acknowledgement it never saw, the owner finds the same (producer id,
base sequence, count) among that producer's recent batches and answers with the original
offsets instead of appending again.

Sequence order (Kafka's rule). For a producer the partition knows, a batch is one of:

- a duplicate: the same (base sequence, count) as one of its last ``KEEP`` batches; answered
  with the original offsets, nothing appended;
- the next one: its base sequence is the last batch's base sequence + count (modulo 2^31, the
  client's wrap): appended;
- anything else (a sequence that skips ahead, or one behind the window): ``OUT_OF_ORDER_SEQUENCE``,
  nothing appended. A retry older than the window lands here too, never appended twice.

The first batch of a producer id the partition does not know is accepted at any sequence.
Kafka makes a new producer start at 0 because its brokers snapshot the producer state; ours
is a window rebuilt at every takeover (after a worker crash, a move or a restart) from the
batch headers still in the ring, and from the last batches on disk when the ring holds few
(no separate file), and least recently used producers beyond ``MAX_PRODUCERS`` are forgotten:
a producer whose last batch fell out of that window must be able to go on where it is.

With the producer's default of one batch in flight per partition a retry is always the newest
batch, well inside the window, and a retry of a batch whose reply was lost is a duplicate. A gap
appears only when a batch failed for good (refused, or given up after ``delivery_timeout_ms``)
and the producer went on counting: its later batches to that partition are then refused until
it takes a new producer id (Kafka's producer resets its id, or bumps its epoch, then).
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

KEEP = 8  # batches remembered per producer
MAX_PRODUCERS = 20_000  # least recently used producers beyond this are forgotten
SEQUENCE_MOD = 1 << 31  # base sequences count records modulo 2^31 (the client wraps there)


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

    def expected(self, pid: int) -> int | None:
        """The base sequence ``pid``'s next batch must have (None: any, the producer is unknown
        here or not idempotent). Ask after ``find``: a duplicate is answered before this rule."""
        q = self.by_pid.get(pid) if pid >= 0 else None
        if not q:
            return None
        last_seq, last_count = q[-1][0], q[-1][1]
        return (last_seq + last_count) % SEQUENCE_MOD

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

    def truncate(self, offset: int) -> None:
        """Forget the batches at or past ``offset``: the log was cut back there (actors/truncate.py),
        so a retry of one of them is a new batch, and a producer's next sequence follows its last
        batch that is left. One step per producer, at a cut only."""
        for pid in list(self.by_pid):
            q = self.by_pid[pid]
            while q and q[-1][2] >= offset:
                q.pop()
            if not q:
                del self.by_pid[pid]

    def load(self, pids: np.ndarray, seqs: np.ndarray, counts: np.ndarray, bases: np.ndarray, times: np.ndarray) -> None:
        """Feed batches in append order (at takeover only: one step per recent batch)."""
        keep = pids >= 0
        for pid, seq, n, base, t in zip(pids[keep].tolist(), seqs[keep].tolist(), counts[keep].tolist(),
                                        bases[keep].tolist(), times[keep].tolist()):
            self.record(pid, seq, n, base, t)
