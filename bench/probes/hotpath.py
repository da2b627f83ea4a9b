"""Per-call cost of the per-message hot paths, in one process, no sockets: what a same-host
single-message produce costs the worker, and what a tailing read costs the consumer.

    python -m tailrace.bench.probes.hotpath [--calls 10000] [--rounds 7]

- ``handle``: ``Worker.handle`` of a one-record produce (100 B, acks memory) addressed straight
  to the worker, as the same-host path delivers it (reply frames built, not sent);
- ``tail-read``: ``PartitionTail.read`` of the newest batch of a ring (client/ring_reader.py);
- ``columns``: ``iter_batches`` + ``batches_to_columns`` of that one batch (what
  ``Consumer.poll_columns`` does per read);
- ``columns-3``: the same for a read of the three newest batches (a tailing consumer a little
  behind);
- ``encode-one``: ``encode_batch`` of one 100 B record (what a producer's single-message send
  seals: the client side of ``handle``);
- ``flush-cycle``: the flusher's ``do_work`` when each of 8 partitions holds two new one-record
  batches (what a cycle finds under durable-single/64), CPU time per cycle (``process_time``:
  the journal's O_DIRECT write is real, its wait is not counted; no fdatasync).

Real shared memory and files on a temporary directory (bench/inprocess.py, the stack the unit
tests use). Prints the minimum and the median over the rounds, in microseconds per call: compare
before/after in one sitting, the machine is noisy.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from tailrace.actors.unix_server import UNIX_IDENT, UnixIdent
from tailrace.actors.worker import Worker
from tailrace.client import protocol as P
from tailrace.client.records import batches_to_columns, encode_batch, iter_batches
from tailrace.persistence.recovery import data_dir_id
from tailrace.shm.layout import COL
from tailrace.client.ring_reader import SharedRings
from tailrace.bench.inprocess import make_storage


class _Port:
    """Takes the worker's replies and counts their codes."""

    backlog = False

    def __init__(self):
        self.codes: dict[int, int] = {}

    def send(self, frames) -> bool:
        code = P.unpack_routing(frames[1])[2]
        self.codes[code] = self.codes.get(code, 0) + 1
        return True


def _rounds(fn, calls: int, rounds: int, between=None) -> tuple[float, float]:
    per_call = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn(calls)
        per_call.append((time.perf_counter() - t) / calls * 1e6)
        if between is not None:
            between()
    return min(per_call), statistics.median(per_call)


def _flush_cycle(data_dir: str, cycles: int, rounds: int) -> tuple[float, float]:
    st = make_storage(data_dir, partitions=8, ring_bytes=4 << 20, segment_bytes=256 << 20, write_buffer_bytes=1 << 20,
                      flush_interval_ms=1 << 30, flush_bytes=1 << 40)
    try:
        frame = encode_batch([bytes(100)])
        per_cycle = []
        for _ in range(rounds):
            spent = 0
            for _ in range(cycles):
                for a in st.actors:
                    assert a.append(frame, 1 << 14)[0] == 0 and a.append(frame, 1 << 14)[0] == 0
                t = time.process_time_ns()
                st.flusher.do_work()
                spent += time.process_time_ns() - t
            per_cycle.append(spent / cycles / 1e3)
        assert all(a.high_watermark == 2 * cycles * rounds for a in st.actors)
        assert int(st.flusher.table.rows[st.actors[0].slot, COL["flushed_offset"]]) == 2 * cycles * rounds
        return min(per_cycle), statistics.median(per_cycle)
    finally:
        st.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tailrace.bench.probes.hotpath", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tailrace-hotpath-") as d:
        st = make_storage(f"{d}/data", partitions=1, ring_bytes=64 << 20, max_batch_bytes=1 << 18,
                          segment_bytes=64 << 20, write_buffer_bytes=1 << 20)
        try:
            w = Worker(st.s, 0, st.flusher.table)
            w.port = _Port()
            actor = st.actors[0]
            w.actors[actor.slot] = actor
            ident = UnixIdent(UNIX_IDENT + b"\x01\x00\x00\x00")
            header = P.encode(P.ProduceRequest(acks=P.Acks.MEMORY))
            frame = encode_batch([bytes(100)])

            times = []
            for _ in range(args.rounds):
                reqs = [[ident, P.pack_routing(P.Op.PRODUCE, 0, i, b"t"), header, frame] for i in range(args.calls)]
                t = time.perf_counter()  # the requests are built outside the timing
                for r in reqs:
                    w.handle(r)
                times.append((time.perf_counter() - t) / args.calls * 1e6)
                st.flusher.do_work()  # the ring stays far from full
            handle = (min(times), statistics.median(times))
            assert set(w.port.codes) == {P.ErrorCode.OK}, w.port.codes

            rings = SharedRings(st.s.instance, data_dir_id(st.s.data_dir))
            try:
                tail = rings.partition(actor.slot, actor.topic_id, actor.partition)
                newest = actor.high_watermark - 1
                body = tail.read(newest, 1 << 20, 1 << 20).body
                body3 = tail.read(newest - 2, 1 << 20, 1 << 20).body
                assert len(iter_batches(body3)) == 3

                def read(n: int) -> None:
                    for _ in range(n):
                        tail.read(newest, 1 << 20, 1 << 20)

                def columns(n: int) -> None:
                    for _ in range(n):
                        batches_to_columns(iter_batches(body), newest)

                def columns3(n: int) -> None:
                    for _ in range(n):
                        batches_to_columns(iter_batches(body3), newest - 2)

                def encode_one(n: int) -> None:
                    value = bytes(100)
                    for _ in range(n):
                        encode_batch([value])

                results = {"handle": handle, "encode-one": _rounds(encode_one, args.calls, args.rounds),
                           "tail-read": _rounds(read, args.calls, args.rounds),
                           "columns": _rounds(columns, args.calls, args.rounds),
                           "columns-3": _rounds(columns3, args.calls, args.rounds)}
            finally:
                rings.close()
        finally:
            st.close()
        results["flush-cycle"] = _flush_cycle(f"{d}/flush", max(args.calls // 5, 1), args.rounds)
    for name, (lo, med) in results.items():
        print(f"{name:10s} min {lo:6.1f} us   median {med:6.1f} us   ({args.rounds} rounds of {args.calls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
