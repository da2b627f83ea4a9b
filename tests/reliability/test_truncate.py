"""A partition's log cut back to an offset on a running broker (a cluster follower's truncation:
REPLICA_APPEND's ``truncate_to``, actors/truncate.py), then the new batches appended from there,
read back from the ring and from disk, across a clean restart, a kill -9 of everything, and a
flusher dying in the middle of the cut.

REPLICA_APPEND is an internal op the router sends to its own workers (router/replicas.py): these
tests speak to the worker as the router does (identity ``b"router"``, an assign frame with an
owner epoch above the router's: tests/helpers.py), with the real router stopped, then start the
router again and read the partition with the ordinary Consumer. The old log is produced through
the router, batch by batch (3 records each: boundaries at 0, 3, 6, ...); the new batches are
stamped with their offsets as a leader's FETCH would send them.
"""

from __future__ import annotations

import time

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.broker.catalog import Catalog
from tailrace.broker.datadir import CHECKPOINT_FILE, JOURNAL_DIR
from tailrace.client import protocol as P
from tailrace.client.records import STAMP, STAMP_AT, encode_batch, iter_batches, now_us
from tailrace.persistence.truncation import read_truncations

from tests.helpers import ASSIGN, Raw, supervisorctl, winning_epoch

TOPIC = "cut"
BATCH = 3
OLD_BATCHES = 10  # offsets 0..29
_append_reply = P.decoder(P.ReplicaAppendReply)
_error_reply = P.decoder(P.ErrorReply)


def _produce_old(b) -> None:
    Admin(b.bootstrap).create_topic(TOPIC, 1)
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as prod:
        for i in range(OLD_BATCHES):
            prod.send_batch(TOPIC, [b"old-%d" % (BATCH * i + j) for j in range(BATCH)], partition=0)
            prod.flush(30_000)


class AsRouter:
    """REPLICA_APPEND to the partition's worker, as the router sends it."""

    def __init__(self, b):
        supervisorctl(b, "stop", "router")
        self.raw = Raw(b.settings.worker_endpoint(0), identity=P.ROUTER_IDENTITY)
        cat = Catalog(b.data_dir)
        self.topic_id = cat.get(TOPIC).topic_id
        self.assign = ASSIGN.pack(cat.slot_of(TOPIC, 0), winning_epoch(b))
        self.rid = 0

    def ask(self, body: bytes = b"", **fields) -> tuple[int, object]:
        self.rid += 1
        self.raw.send([b"test", self.assign, P.pack_routing(P.Op.REPLICA_APPEND, 0, self.rid, TOPIC.encode()),
                       P.encode(P.ReplicaAppendRequest(leader=1, **fields)), body])
        while True:
            frames = self.raw.recv(10_000)
            assert frames is not None, "no reply from the worker"
            _v, _op, code, _p, rid, _t = P.unpack_routing(frames[1])
            if rid == self.rid:
                return code, (_append_reply if code == P.ErrorCode.OK else _error_reply).decode(frames[2])

    def cut(self, target: int, timeout_s: float = 30) -> int:
        """Ask until the cut is done (NOT_READY meanwhile, as the router would); the new log end."""
        deadline, not_ready = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            code, r = self.ask(truncate_to=target)
            if code == P.ErrorCode.OK:
                return r.log_end
            assert code == P.ErrorCode.NOT_READY and r.message == f"truncating to {target}", (P.ErrorCode(code).name, r)
            not_ready += 1
            time.sleep(0.02)
        raise AssertionError(f"no cut to {target} in {timeout_s}s ({not_ready} NOT_READY)")

    def append_new(self, start: int, batches: int) -> int:
        """Stamped batches of values new-<offset> from ``start``, in one REPLICA_APPEND; the log end."""
        frames = []
        for i in range(batches):
            base = start + BATCH * i
            frame = bytearray(encode_batch([b"new-%d" % (base + j) for j in range(BATCH)]))
            STAMP.pack_into(frame, STAMP_AT, base, now_us(), 0, 99)  # the leader's stamp (its own topic id)
            frames.append(bytes(frame))
        code, r = self.ask(b"".join(frames))
        assert code == P.ErrorCode.OK, (P.ErrorCode(code).name, r)
        code, synced = self.ask(wait_sync=True)  # answered once the copy is synced to its end
        assert code == P.ErrorCode.OK and synced.durable_end == r.log_end, synced
        return r.log_end

    def close(self, b) -> None:
        self.raw.close()
        supervisorctl(b, "start", "router")
        b.wait_ready()


def _read(b, isolation: str, start: int = 0) -> tuple[list[tuple[int, bytes]], set[str]]:
    """The partition's records from ``start`` as (offset, value), and the sources the replies
    came from (``ring``, ``disk``)."""
    with Consumer(b.bootstrap, max_wait_ms=100, isolation=isolation) as c:
        po = c.list_offsets(TOPIC)[0]
        end = po.durable_watermark if isolation == "durable" else po.high_watermark
        c.assign(TOPIC, start=start)
        out, sources = [], set()
        deadline = time.monotonic() + 30
        while len(out) < end - start and time.monotonic() < deadline:
            for _state, start, reply, body in c.poll_raw(300):
                sources.add(reply.source)
                for v in iter_batches(body):
                    out += [(v.base_offset + i, v.value(i)) for i in range(v.record_count) if v.base_offset + i >= start]
    return out, sources


def _expected(cut: int, end: int) -> list[tuple[int, bytes]]:
    return [(o, b"old-%d" % o) for o in range(cut)] + [(o, b"new-%d" % o) for o in range(cut, end)]


def _check(b, cut: int, end: int) -> set[str]:
    """The log read whole, from just below the cut (a journal read across it) and from the cut,
    in both isolations; the sources of the reads from the cut."""
    sources = set()
    for isolation in ("memory", "durable"):
        got, _src = _read(b, isolation)
        assert got == _expected(cut, end), (isolation, got[:3], got[cut - 2:cut + 2])
        got, src = _read(b, isolation, cut - 1)
        assert got == _expected(cut, end)[cut - 1:] and src == {"disk"}, (isolation, got[:3], src)
        got, src = _read(b, isolation, cut)
        assert got == _expected(cut, end)[cut:], (isolation, got[:3])
        sources |= src
    return sources


def test_a_cut_then_new_batches_read_back_from_the_ring_and_from_disk_and_after_a_restart(make_broker):
    b = make_broker(workers=1)
    _produce_old(b)
    r = AsRouter(b)
    try:
        assert r.cut(30) == 30 and r.cut(100) == 30  # at or past the end: nothing to cut
        assert r.cut(16) == 15  # inside the batch 15..17: cut at its base
        assert r.cut(15) == 15  # asked again: nothing more to cut
        code, err = r.ask(truncate_to=40)  # past the end after the cut: the end, at once
        assert code == P.ErrorCode.OK and err.log_end == 15
        end = r.append_new(15, 4)  # new-15 .. new-26
        assert end == 27
    finally:
        r.close(b)
    marks = read_truncations(b.data_dir)
    assert [t for _p, t in next(iter(marks.values())).cuts] == [15]
    assert _check(b, 15, 27) == {"ring"}  # the new tail from the ring (the ring's window starts at the cut)
    b.stop()
    b.cleanup_shm()
    b.start()  # fresh rings: everything cold from the journal now
    assert _check(b, 15, 27) == {"disk"}


@pytest.mark.parametrize("how", ["kill9", "host-crash-no-checkpoint"])
def test_a_cut_survives_kill9_of_the_whole_broker(make_broker, how):
    """``kill9``: every program killed, the shared memory kept (what a process crash leaves:
    the flusher reconciles, the workers take the rows over); ``host-crash-no-checkpoint``: the
    shared memory gone too and the checkpoint deleted, so recovery scans the whole journal."""
    b = make_broker(workers=1)
    _produce_old(b)
    r = AsRouter(b)
    try:
        assert r.cut(12) == 12
        end = r.append_new(12, 5)  # 12..26
    finally:
        r.close(b)
    b.hard_kill_all()
    if how != "kill9":
        b.cleanup_shm()
        (b.data_dir / JOURNAL_DIR / CHECKPOINT_FILE).unlink()
    b.start()
    _check(b, 12, end)
    if how != "kill9":
        assert "recovery scanned" in (b.data_dir / "logs" / "flusher.log").read_text()


def test_a_flusher_killed_right_after_the_marker_is_durable_finishes_the_cut_when_it_is_back(make_broker):
    """The flusher dies (as kill -9 would) once the marker is written, before the index is cut and
    before its checkpoint; supervisord starts it again: recovery honours the marker, the request
    still in the row is made again, and the follower's asking goes on to the end."""
    b = make_broker(workers=1, debug_crash_at="truncate_marker_written")
    _produce_old(b)
    flusher_pid = b.pids()["flusher"]
    r = AsRouter(b)
    try:
        assert r.cut(9) == 9
        end = r.append_new(9, 3)
    finally:
        r.close(b)
    assert b.pids()["flusher"] != flusher_pid
    assert "debug_crash_at=truncate_marker_written: dying here" in (b.data_dir / "logs" / "flusher.log").read_text()
    _check(b, 9, end)
    b.hard_kill_all()
    b.start()
    _check(b, 9, end)


def test_a_cut_below_the_log_start_is_refused(make_broker):
    b = make_broker(workers=1, retention_check_ms=100)
    Admin(b.bootstrap).create_topic(TOPIC, 1, config={"retention.bytes": 300})  # the last batch or two (~120 bytes each)
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as prod:
        for i in range(4):
            prod.send_batch(TOPIC, [b"old-%d" % (BATCH * i + j) for j in range(BATCH)], partition=0)
            prod.flush(30_000)
    with Consumer(b.bootstrap) as c:
        deadline = time.monotonic() + 20
        while c.list_offsets(TOPIC)[0].log_start_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        start = c.list_offsets(TOPIC)[0].log_start_offset
    assert start in (6, 9), start  # whole batches went, some are left
    r = AsRouter(b)
    try:
        code, err = r.ask(truncate_to=start - 1)
        assert code == P.ErrorCode.OFFSET_OUT_OF_RANGE and f"below the log start {start}" in err.message, err
        assert err.log_start_offset == start and err.high_watermark == 12
        assert r.cut(start + 1) == start  # in the first batch left: cut at its base, the log start
    finally:
        r.close(b)
