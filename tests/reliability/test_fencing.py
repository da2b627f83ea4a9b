"""Fencing: two workers told to own one partition never both write it; a killed worker comes back.

The race is forced by speaking to the workers as the router does (identity ``b"router"``, an
assign frame naming the slot and an owner epoch), one socket per worker, with the real router
stopped (a worker hears one peer per identity: see tests/helpers.py). Epochs are above every assignment
of the stopped router generation, so when the router starts again its new generation takes the
partition back, and the log is read through it with the ordinary Consumer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.broker.catalog import Catalog
from tailrace.client.records import encode_batch

from tests.helpers import ASSIGN, Raw, reply_code, supervisorctl, wait_restarted, winning_epoch
from tailrace.bench.audit import Produced, audit, produce_until

REFUSED = {P.ErrorCode.NOT_OWNER, P.ErrorCode.NOT_READY}


@dataclass
class Writer:
    """A test socket speaking to one worker as the router, producing tagged one-record batches."""

    name: bytes
    raw: Raw
    assign: bytes
    sent: dict = field(default_factory=dict)  # request id -> (seq, monotonic send time)
    acked: dict = field(default_factory=dict)  # seq -> base offset
    acked_sent_at: dict = field(default_factory=dict)  # seq -> monotonic send time
    refused: list = field(default_factory=list)  # (seq, code name, send time)
    seq: int = 0
    rid: int = 0

    def send(self, seq: int | None = None) -> int:
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        self.rid += 1
        value = self.name + b":%06d" % seq
        self.raw.send([self.name, self.assign, P.pack_routing(P.Op.PRODUCE, 0, self.rid, b"fence"),
                       P.encode(P.ProduceRequest(acks=P.Acks.MEMORY)), encode_batch([value])])
        self.sent[self.rid] = (seq, time.monotonic())
        return seq

    def take_replies(self, timeout_ms: int = 0) -> list[tuple[int, int]]:
        """(seq, code) of every reply waiting (the first one waited for up to timeout_ms)."""
        out = []
        while (frames := self.raw.recv(timeout_ms)) is not None:
            timeout_ms = 0
            _op, code, rid = reply_code(frames, router_mode=True)
            seq, t = self.sent.pop(rid)
            if code == P.ErrorCode.OK:
                self.acked[seq] = P.decoder(P.ProduceReply).decode(frames[2]).base_offset
                self.acked_sent_at[seq] = t
            else:
                self.refused.append((seq, P.ErrorCode(code).name, t))
            out.append((seq, code))
        return out

    def send_and_wait(self, seq: int | None = None, timeout_ms: int = 5000) -> int:
        seq = self.send(seq)
        while self.sent:
            assert self.take_replies(timeout_ms), f"{self.name!r}: no reply in {timeout_ms} ms"
        return P.ErrorCode.OK if seq in self.acked else P.ErrorCode[self.refused[-1][1]]

    def close(self) -> None:
        self.raw.close()


def _writers(b, epochs: tuple[int, int]) -> tuple[Writer, Writer]:
    slot = Catalog(b.data_dir).slot_of("fence", 0)
    supervisorctl(b, "stop", "router")
    return (Writer(b"A", Raw(b.settings.worker_endpoint(0), identity=b"router"), ASSIGN.pack(slot, epochs[0])),
            Writer(b"B", Raw(b.settings.worker_endpoint(1), identity=b"router"), ASSIGN.pack(slot, epochs[1])))


def _read_log(bootstrap: str) -> list[tuple[int, bytes]]:
    with Consumer(bootstrap, max_wait_ms=100) as cons:
        end = cons.list_offsets("fence")[0].high_watermark
        cons.assign("fence", start="earliest")
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(out) < end and time.monotonic() < deadline:
            out += [(r.offset, r.value) for r in cons.poll(300)]
    return out


def _restart_router_and_append(b, writers, marker: bytes) -> int:
    """Close the test sockets, start the router (a new generation), append through it."""
    for w in writers:
        w.close()
    supervisorctl(b, "start", "router")
    b.wait_ready()
    bases = []
    with Producer(b.bootstrap, acks="durable", on_ack=lambda _t, _p, base, _n: bases.append(base)) as prod:
        prod.send("fence", marker, partition=0)
        prod.flush(30_000)
    return bases[0]


def test_a_lower_epoch_writer_is_refused_once_a_higher_epoch_writer_owns_the_partition(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("fence", 1)
    e = winning_epoch(b)
    a, bw = _writers(b, (e, e + 1))
    try:
        for _ in range(20):  # A owns the partition at epoch E and writes
            assert a.send_and_wait(timeout_ms=10_000) == P.ErrorCode.OK
        # The race: A keeps 8 appends in flight without pause while B (epoch E + 1) takes over,
        # B retrying NOT_READY until A's worker has let the partition go.
        b_first_ok_at = None
        b_not_ready = 0
        deadline = time.monotonic() + 20
        pending_b = bw.send()
        while time.monotonic() < deadline:
            while len(a.sent) < 8:
                a.send()
            a.take_replies(1)
            for seq, code in bw.take_replies(0):
                if code == P.ErrorCode.OK:
                    b_first_ok_at = b_first_ok_at or time.monotonic()
                    pending_b = None
                else:
                    assert code == P.ErrorCode.NOT_READY, P.ErrorCode(code).name
                    b_not_ready += 1
                    pending_b = seq
            if pending_b is not None and not bw.sent:
                bw.send(pending_b)
            elif pending_b is None and not bw.sent:
                if b_first_ok_at and time.monotonic() - b_first_ok_at > 0.5:
                    break
                pending_b = bw.send()
        assert b_first_ok_at is not None, "the higher epoch never got the partition"
        while a.sent:  # what A still had in flight
            assert a.take_replies(5000)
        for _ in range(20):  # A goes on trying after the fence: every append refused
            assert a.send_and_wait() in REFUSED
        for _ in range(20):  # B goes on succeeding
            assert bw.send_and_wait() == P.ErrorCode.OK
        refused_codes = Counter(code for _s, code, _t in a.refused)
        late_a = [seq for seq, _code, t in a.refused if t > b_first_ok_at]
        late_a_acked = [seq for seq, t in a.acked_sent_at.items() if t > b_first_ok_at]
        assert not late_a_acked, f"A appended after B's first ack: {late_a_acked[:5]}"
    finally:
        marker_base = _restart_router_and_append(b, (a, bw), b"router after the fence")
    log = _read_log(b.bootstrap)
    offsets = [o for o, _v in log]
    assert offsets == list(range(len(log))), "offsets not dense"
    by_value = {v: o for o, v in log}
    a_in_log = {int(v[2:]) for v in by_value if v.startswith(b"A:")}
    b_in_log = {int(v[2:]) for v in by_value if v.startswith(b"B:")}
    assert a_in_log == set(a.acked), f"refused A appends in the log: {sorted(a_in_log - set(a.acked))[:5]}"
    assert b_in_log == set(bw.acked), f"refused B appends in the log: {sorted(b_in_log - set(bw.acked))[:5]}"
    for seq, base in {**{(b"A", s): o for s, o in a.acked.items()}, **{(b"B", s): o for s, o in bw.acked.items()}}.items():
        assert log[base][1] == seq[0] + b":%06d" % seq[1], f"ack for {seq} said offset {base}"
    last_a, first_b = max(a.acked.values()), min(bw.acked.values())
    assert last_a < first_b, f"A wrote offset {last_a} after B's first write at {first_b}: interleaved"
    assert np.all(np.diff([o for s, o in sorted(bw.acked.items())]) > 0), "B's own appends out of order"
    assert log[-1] == (marker_base, b"router after the fence") and marker_base == len(log) - 1
    print(f"\nfencing race: A (epoch E) acked {len(a.acked)} appends at offsets 0..{last_a}, refused {len(a.refused)} "
          f"({dict(refused_codes)}; {len(late_a)} sent after B's first ack); B (epoch E+1) got NOT_READY {b_not_ready}x "
          f"while A let go, then acked {len(bw.acked)} at offsets {first_b}..{max(bw.acked.values())}; "
          f"log of {len(log)} records dense, no refused append in it, no A after B; the restarted router appended at {marker_base}")


def test_two_workers_given_the_same_epoch_never_both_write(make_broker):
    """Equal epochs pass the epoch check on both sides: the slot's flock alone decides."""
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("fence", 1)
    e = winning_epoch(b)
    a, bw = _writers(b, (e, e))
    try:
        assert a.send_and_wait(timeout_ms=10_000) == P.ErrorCode.OK
        codes = Counter()
        for _ in range(30):
            codes[P.ErrorCode(a.send_and_wait()).name, "A"] += 1
            codes[P.ErrorCode(bw.send_and_wait()).name, "B"] += 1
        assert codes[("OK", "A")] == 30 and codes[("NOT_READY", "B")] == 30, codes
    finally:
        marker_base = _restart_router_and_append(b, (a, bw), b"router after the tie")
    log = _read_log(b.bootstrap)
    assert [o for o, _v in log] == list(range(len(log)))
    assert [v for _o, v in log] == [b"A:%06d" % i for i in range(31)] + [b"router after the tie"]
    print(f"\nequal epochs: A (holds the lock) acked {len(a.acked)}, B refused {len(bw.refused)}x with "
          f"{dict(Counter(c for _s, c, _t in bw.refused))}; log holds only A's records, then the router's at {marker_base}")


def test_a_killed_worker_is_restarted_and_its_partitions_take_writes_again_with_acked_data_intact(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("back", 4)
    owners = {p.partition: p.worker for p in Admin(b.bootstrap).describe_topic("back").partitions}
    mine = [p for p, w in owners.items() if w == 0]
    assert mine, owners
    stop = threading.Event()
    produced = Produced()
    producer = threading.Thread(target=produce_until, args=(b.bootstrap, "back", 4, "durable", stop), kwargs={"out": produced})
    tail_seen: dict[int, int] = {}
    gaps: list = []  # (partition, expected offset, first offset received): checked in the main thread

    def tail():
        with Consumer(b.bootstrap, max_wait_ms=100, request_timeout_ms=1000) as c:
            c.assign("back", start="earliest")
            while not stop.is_set():
                for _t, p, cols in c.poll_columns(200):
                    if int(cols.offsets[0]) != tail_seen.get(p, 0):
                        gaps.append((p, tail_seen.get(p, 0), int(cols.offsets[0])))
                    tail_seen[p] = int(cols.offsets[-1]) + 1

    tailer = threading.Thread(target=tail)
    producer.start()
    tailer.start()
    try:
        time.sleep(1.0)
        before = dict(produced.acked)
        old = b.pids()
        b.kill9("worker-0")
        wait_restarted(b, old, ["worker-0"])
        restarted_at = dict(produced.acked)
        time.sleep(1.5)
    finally:
        stop.set()
        producer.join(120)
        tailer.join(30)
    after = dict(produced.acked)
    result = audit(b.bootstrap, "back", produced, isolation="durable")
    now_owners = {p.partition: p.worker for p in Admin(b.bootstrap).describe_topic("back").partitions}
    print(f"\nworker-0 kill -9: its partitions {mine} had acked {[before[p] for p in mine]} records, "
          f"{[restarted_at[p] for p in mine]} when it was back, {[after[p] for p in mine]} at the end "
          f"(owners {owners} -> {now_owners}); audit read back {sum(result.found.values())} of {sum(after.values())} "
          f"acked (durable isolation): lost {sum(result.lost.values())}, duplicated {sum(result.duplicated.values())}; "
          f"a consumer tailing through the kill read {sum(tail_seen.values())} records, {len(gaps)} gaps or repeats")
    assert not produced.errors, produced.errors
    assert not gaps and sum(tail_seen.values()) > 0, gaps[:3]
    assert all(after[p] > restarted_at[p] for p in range(4)), "a partition took no writes after the restart"
    assert result.ok, result
