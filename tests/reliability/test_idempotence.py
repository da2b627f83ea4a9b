"""The idempotent producer's dedup window: a retried batch gets its original offsets back, also
after the owning worker was killed and after a full restart; a retry older than the window, or a
base sequence that skips ahead, is refused OUT_OF_ORDER_SEQUENCE and nothing is stored.

Batches are sent by hand over a plain connection (through the router), so that a "retry" is
exactly the same bytes: producer id, base sequence and record count as the first attempt.
"""

from __future__ import annotations

import time

import pytest

from tailrace import Admin
from tailrace.client import protocol as P
from tailrace.client.connection import Connection
from tailrace.client.errors import OutOfOrderSequenceError, TailraceError
from tailrace.client.records import encode_batch

from tests.helpers import wait_restarted

PRODUCER_ID = 0x1DE4_0000_0001
COUNT = 5
BATCHES = 12
KEEP = 8  # actors/dedup.py: batches remembered per producer


def _send(conn: Connection, frame: bytes, timeout_s: float = 30) -> int:
    """Durable produce of one batch, retried on retriable errors; returns its base offset."""
    deadline = time.monotonic() + timeout_s
    header = P.encode(P.ProduceRequest(acks=P.Acks.DURABLE))
    while True:
        try:
            r = conn.request(P.Op.PRODUCE, "idem", 0, header, frame, timeout_ms=3000)
            return P.decoder(P.ProduceReply).decode(r.header).base_offset
        except TailraceError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _high_watermark(b) -> int:
    with Admin(b.bootstrap) as admin:
        return admin.list_offsets("idem")[0].high_watermark


def test_retries_get_original_offsets_within_the_window_across_a_worker_kill_and_a_restart(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("idem", 1)
    frames = [encode_batch([b"%d-%d" % (k, i) for i in range(COUNT)], producer_id=PRODUCER_ID, base_sequence=COUNT * k)
              for k in range(BATCHES)]
    conn = Connection(b.bootstrap)
    try:
        bases = [_send(conn, f) for f in frames]
        end = COUNT * BATCHES
        assert bases == list(range(0, end, COUNT))
        window = range(BATCHES - KEEP, BATCHES)
        assert [_send(conn, frames[k]) for k in window] == [bases[k] for k in window]
        assert _high_watermark(b) == end
        seen = {"live": len(window)}

        owner = Admin(b.bootstrap).describe_topic("idem").partitions[0].worker
        old = b.pids()
        b.kill9(f"worker-{owner}")  # the new owner rebuilds the window from the ring's batch headers
        wait_restarted(b, old, [f"worker-{owner}"])
        assert [_send(conn, frames[k]) for k in window] == [bases[k] for k in window]
        assert _high_watermark(b) == end
        seen["after kill -9 of the owner"] = len(window)
    finally:
        conn.close()

    assert b.stop() == 0  # rings unlinked: the window is rebuilt from the last batches on disk
    b.start()
    conn = Connection(b.bootstrap)
    try:
        assert [_send(conn, frames[k]) for k in window] == [bases[k] for k in window]
        assert _high_watermark(b) == end
        seen["after a full restart"] = len(window)
        # Out of the window: the oldest batch is refused, not appended a second time.
        with pytest.raises(OutOfOrderSequenceError, match="expects %d" % end):
            _send(conn, frames[0])
        assert _high_watermark(b) == end
        seen["older than the window, refused"] = 1
    finally:
        conn.close()
    print(f"\nidempotence: {BATCHES} batches of {COUNT} from one producer; retries of the last {KEEP} answered with "
          f"their original offsets {seen}, log end stayed {end}")


def test_a_base_sequence_that_skips_ahead_is_refused_out_of_order_and_the_next_one_is_taken(make_broker):
    """Kafka's rule: a known producer's batch must start at the last one's base sequence + count
    (or be a retry of a recent one). 1000 after a batch ending at 60 is OUT_OF_ORDER_SEQUENCE and
    stores nothing; 60 is then taken. A producer id the partition never saw may start anywhere."""
    b = make_broker(workers=1)
    Admin(b.bootstrap).create_topic("idem", 1)
    conn = Connection(b.bootstrap)
    try:
        def batch(seq, pid=PRODUCER_ID):
            return encode_batch([b"s%d-%d" % (seq, i) for i in range(COUNT)], producer_id=pid, base_sequence=seq)

        bases = [_send(conn, batch(seq)) for seq in range(0, 60, COUNT)]  # 12 batches: sequences 0..59
        assert bases == list(range(0, 60, COUNT))
        with pytest.raises(OutOfOrderSequenceError, match="base_sequence=1000: this partition expects 60"):
            _send(conn, batch(1000))
        with pytest.raises(OutOfOrderSequenceError):  # behind the last batch, not a retry of it
            _send(conn, batch(57))
        assert _high_watermark(b) == 60
        assert _send(conn, batch(60)) == 60
        assert _send(conn, batch(55)) == 55  # a retry of the batch before: its original offsets
        assert _send(conn, batch(1000, pid=PRODUCER_ID + 1)) == 65  # a new producer: anywhere
        assert _send(conn, batch(1005, pid=PRODUCER_ID + 1)) == 70
        assert _high_watermark(b) == 75
    finally:
        conn.close()


def test_a_one_way_batch_after_a_gap_is_stored_so_a_refused_one_way_batch_never_wedges_the_partition(make_broker):
    """An acks=none producer never reads a refusal: when one of its one-way batches is refused
    (a full ring: BACKPRESSURE; a full disk: STORAGE_FULL) the next one comes with a gap in its
    sequence. The sequence rule would refuse that one, and every one after it, without a word:
    a one-way batch is taken across a gap. Duplicates are still answered as such, and a
    memory-acked batch still may not skip ahead."""
    b = make_broker(workers=1)
    Admin(b.bootstrap).create_topic("idem", 1)
    conn = Connection(b.bootstrap)
    oneway = P.encode(P.ProduceRequest(acks=P.Acks.NONE))
    try:
        def batch(seq):
            return encode_batch([b"s%d-%d" % (seq, i) for i in range(COUNT)], producer_id=PRODUCER_ID, base_sequence=seq)

        assert _send(conn, batch(0)) == 0
        conn.send(P.Op.PRODUCE, "idem", 0, oneway, batch(10))  # 5..9 were "refused": a gap
        conn.send(P.Op.PRODUCE, "idem", 0, oneway, batch(15))
        conn.send(P.Op.PRODUCE, "idem", 0, oneway, batch(15))  # a duplicate: not stored again
        assert _send(conn, batch(15)) == 10  # the closing round trip of acks=none: a duplicate
        with pytest.raises(OutOfOrderSequenceError):
            _send(conn, batch(100))
        assert _high_watermark(b) == 15
    finally:
        conn.close()
