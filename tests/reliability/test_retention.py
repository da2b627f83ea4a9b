"""Time-based retention with real processes (persistence/retention.py): log starts advance,
segments go, readers below the log start get OFFSET_OUT_OF_RANGE and ``auto_offset_reset`` does
what it says, index files shrink; a restart, a kill -9 of everything, and a kill -9 of the
flusher at each step of a deletion leave recovery consistent: log starts never move back, no
acknowledged record inside retention is lost, offsets go on where they were.

Timing without races: topic ``r`` keeps records 1.5 s; the old records are written, expire and
their segments go; only then is the topic told to keep records for ever (``retention.ms=-1``)
and the new ones written, so nothing a test reads can expire under it."""

from __future__ import annotations

import os
import time

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client.errors import OffsetOutOfRangeError
from tailrace.persistence.retention import read_log_starts
from tests.helpers import hard_kill_all, wait_restarted

BROKER = dict(segment_bytes=2 << 20, max_batch_bytes=256 << 10, retention_check_ms=200)
OLD, NEW = 10_000, 3_000  # records of ~1 KiB, alternating over 2 partitions: 5,000 + 1,500 each
EXPIRED = OLD // 2  # each partition's log start once the old records are gone


def _value(tag: bytes, i: int) -> bytes:
    return tag + b"%06d" % i + b"." * 1000


def _produce(b, tag: bytes, n: int) -> None:
    with Producer(b.bootstrap, acks="durable", linger_ms=1, batch_bytes=128 << 10) as p:
        for i in range(n):
            p.send("r", _value(tag, i), partition=i % 2)
        assert p.flush(60_000) == n


def _expected() -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value, for every record ever written."""
    out = {(i % 2, i // 2): _value(b"old", i) for i in range(OLD)}
    out.update({(i % 2, EXPIRED + i // 2): _value(b"new", i) for i in range(NEW)})
    return out


def _segments(b) -> list[str]:
    return sorted(n for n in os.listdir(b.data_dir / "journal") if n.endswith(".log"))


def _offsets(b) -> list[tuple[int, int]]:
    with Admin(b.bootstrap) as a:
        return [(o.log_start_offset, o.high_watermark) for o in a.list_offsets("r")]


def _wait(b, what, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: offsets {_offsets(b)}, segments {_segments(b)}")
        time.sleep(0.1)


def _read_from_start(b) -> dict[tuple[int, int], bytes]:
    """Everything from each partition's log start to its high watermark."""
    ends = [hw for _s, hw in _offsets(b)]
    with Consumer(b.bootstrap, max_wait_ms=100, auto_offset_reset="earliest") as c:
        c.assign("r", start=0)
        got, deadline = {}, time.monotonic() + 30
        while any(c.position("r", p) < ends[p] for p in (0, 1)) and time.monotonic() < deadline:
            for r in c.poll(200):
                got[(r.partition, r.offset)] = r.value
    return got


def _check_all_kept(b) -> None:
    """Every record from each log start on is there, byte-identical, with no gap. Retention goes
    on deleting while this reads (a crashed deletion finishing, say): a record below the log
    start as it is after the read may be gone, none at or above it, and nothing is read from
    below the log start before the read."""
    before, got, after, want = _offsets(b), _read_from_start(b), _offsets(b), _expected()
    for p, ((start, hw), (start_after, hw_after)) in enumerate(zip(before, after)):
        assert hw_after == hw and start_after >= start, (p, before, after)
        mine = sorted(o for (q, o) in got if q == p)
        missing = sorted(set(range(start_after, hw)) - set(mine))
        assert not missing, (p, start, start_after, hw, missing[:3], missing[-3:])
        assert all(start <= o < hw for o in mine), (p, start, hw, mine[:3], mine[-3:])
    assert all(want[k] == v for k, v in got.items())


def _expire_old(b, alter: bool = True) -> None:
    """Old records written to a topic keeping 1.5 s; wait until they and their segments are gone,
    then keep everything (if ``alter``) and write the new ones."""
    _wait(b, lambda: _offsets(b) == [(EXPIRED, EXPIRED)] * 2 and len(_segments(b)) <= 2)
    if alter:
        with Admin(b.bootstrap) as a:
            assert a.alter_configs("r", {"retention.ms": -1}).config["retention.ms"] == "-1"
        _produce(b, b"new", NEW)


def test_records_expire_segments_go_readers_reset_and_a_crash_keeps_it_all(make_broker):
    b = make_broker(**BROKER)
    with Admin(b.bootstrap) as a:
        info = a.create_topic("r", 2, config={"retention.ms": 1500})
        assert info.config == {"retention.ms": "1500", "retention.bytes": "-1", "ring.bytes": str(8 << 20),
                               "message.timestamp.type": "CreateTime", "compression.type": "producer",
                               "message.timestamp.before.max.ms": "-1", "message.timestamp.after.max.ms": "3600000"}
    _produce(b, b"old", OLD)
    _expire_old(b)
    assert _offsets(b) == [(EXPIRED, EXPIRED + NEW // 2)] * 2
    with Consumer(b.bootstrap, max_wait_ms=100) as c:  # the default, "error": nothing skipped unseen
        c.assign("r", [0], start=0)
        with pytest.raises(OffsetOutOfRangeError) as err:
            for _ in range(20):
                c.poll(200)
        assert err.value.details["log_start_offset"] == EXPIRED
    _check_all_kept(b)  # "earliest": from the log start, every record inside retention, byte-identical
    with Consumer(b.bootstrap, max_wait_ms=100, auto_offset_reset="latest") as c:
        c.assign("r", [1], start=0)
        assert c.poll(500) == [] and c.position("r", 1) == EXPIRED + NEW // 2
    index = b.data_dir / "index" / "1.index"
    assert index.stat().st_size == (EXPIRED + NEW // 2) * 16
    # the entries below the log start are punched out: what stays allocated is the live entries and
    # the pages at either edge (filesystems differ by a page or two), not the 80 KB below the start
    assert index.stat().st_blocks * 512 <= NEW // 2 * 16 + 4 * 4096 < EXPIRED * 16
    assert read_log_starts(b.data_dir) == {0: EXPIRED, 1: EXPIRED}

    b.stop()  # a clean restart: the same log starts, the same records
    b.start()
    assert _offsets(b) == [(EXPIRED, EXPIRED + NEW // 2)] * 2
    _check_all_kept(b)
    hard_kill_all(b)  # kill -9 of everything: recovery from the checkpoint, over deleted segments
    b.start()
    assert _offsets(b) == [(EXPIRED, EXPIRED + NEW // 2)] * 2
    _check_all_kept(b)
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:  # offsets go on
        p.send("r", b"after", partition=0)
        assert p.flush() == 1
    assert _offsets(b)[0] == (EXPIRED, EXPIRED + NEW // 2 + 1)


@pytest.mark.parametrize("step", ["log_starts_written", "one_segment_deleted"])
@pytest.mark.parametrize("then", ["flusher_restarts", "everything_killed"])
def test_a_kill_at_each_step_of_a_deletion_leaves_recovery_consistent(make_broker, step, then):
    """The flusher dies (as kill -9) right after writing new log starts, or between two segment
    deletions; supervisord restarts it, or everything is then killed and started again. Log starts
    never move back, every acknowledged record from the log starts on is still there, offsets go
    on, and deletion goes on."""
    b = make_broker(**BROKER, debug_crash_at=step)
    with Admin(b.bootstrap) as a:
        a.create_topic("r", 2, config={"retention.ms": 1500})
    pids = b.pids()
    _produce(b, b"old", OLD)
    marker = b.data_dir / f"debug-crashed-{step}"
    _wait(b, marker.exists)
    starts_at_crash = read_log_starts(b.data_dir)
    if then == "flusher_restarts":
        wait_restarted(b, pids, ["flusher"])
        flusher_log = b.data_dir / "logs" / "flusher.log"  # booted again (the table stayed READY meanwhile)
        _wait(b, lambda: flusher_log.read_text().count("flusher ready") >= 2)
    else:
        time.sleep(0.3)
        hard_kill_all(b)
        b.start()
    now = _offsets(b)
    assert all(start >= starts_at_crash.get(p, 0) for p, (start, _hw) in enumerate(now)), (now, starts_at_crash)
    assert [hw for _s, hw in now] == [EXPIRED, EXPIRED], now
    _check_all_kept(b)
    _expire_old(b)
    _check_all_kept(b)
    hard_kill_all(b)
    b.start()
    assert _offsets(b) == [(EXPIRED, EXPIRED + NEW // 2)] * 2
    _check_all_kept(b)
    assert f"debug_crash_at={step}: dying here" in (b.data_dir / "logs" / "flusher.log").read_text()


def test_a_byte_limit_keeps_the_journal_bounded_at_full_speed(make_broker):
    """retention.bytes of 4 MiB per partition, 10x that produced per partition as fast as a durable
    producer goes, 2 MiB segments: the journal directory never holds more than what retention keeps
    plus 2 segments (byte limits are applied at each roll and again before the next segment is
    pre-written, at half full; 3 when they were applied at the roll only), and every record from the log starts on reads back byte-identical. The partitions are written
    in step: the journal is shared, so a partition written more slowly than the others keeps their
    segments longer, as a long-retention topic does (docs/DESIGN.md, "Retention")."""
    import threading

    seg, limit, parts = 2 << 20, 4 << 20, 2
    b = make_broker(segment_bytes=seg, max_batch_bytes=256 << 10, write_buffer_bytes=512 << 10, retention_check_ms=1000)
    with Admin(b.bootstrap) as a:
        a.create_topic("b", parts, config={"retention.bytes": limit, "retention.ms": -1})
    journal = b.data_dir / "journal"
    peak, stop, peak_at = [0], threading.Event(), []

    def watch():
        while not stop.is_set():
            try:
                size = sum(e.stat().st_size for e in os.scandir(journal) if e.name.endswith(".log"))
            except FileNotFoundError:  # a segment deleted between the listing and its stat
                continue
            if size > peak[0]:
                peak[0] = size
                peak_at.append(sorted(e.name for e in os.scandir(journal)))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    per_batch, size = 100, 1000
    batches = 10 * limit // (per_batch * size) + 1
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:  # the partitions in step (see the docstring)
        for j in range(batches):
            for part in range(parts):
                first = j * per_batch
                p.send_batch("b", [b"%d-%08d" % (part, first + i) + b"." * (size - 10) for i in range(per_batch)], partition=part)
            p.flush(60_000)
        assert p.flush(60_000) == batches * per_batch * parts
    time.sleep(2.5)  # the last passes
    stop.set()
    watcher.join()
    print(f"journal peak {peak[0]} bytes: retention {parts * limit} + {(peak[0] - parts * limit) / seg:.2f} segments")
    assert peak[0] <= parts * limit + 2 * seg, f"journal reached {peak[0]} bytes: {peak_at[-1]}"
    with Admin(b.bootstrap) as a:
        offs = a.list_offsets("b")
    for po in offs:
        assert po.high_watermark == batches * per_batch
        kept = (po.high_watermark - po.log_start_offset) * size
        assert limit * 0.8 <= kept <= limit, (po, kept)  # whole batches: within one batch of the limit
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("b", start="earliest")
        got, deadline = {}, time.monotonic() + 30
        want = sum(po.high_watermark - po.log_start_offset for po in offs)
        while len(got) < want and time.monotonic() < deadline:
            for r in c.poll(200):
                got[(r.partition, r.offset)] = r.value
    assert len(got) == want
    assert all(v == b"%d-%08d" % k + b"." * (size - 10) for k, v in got.items())


def _wait_cleared(b, slots, timeout_s: float = 10) -> None:
    from tailrace.persistence.retire import cleared

    deadline = time.monotonic() + timeout_s
    while not all(cleared(b.settings, s) for s in slots):
        assert time.monotonic() < deadline, f"slots {slots} not cleared"
        time.sleep(0.05)


@pytest.mark.parametrize("client", ["blocking", "async"])
def test_a_topic_made_again_on_a_deleted_topics_slots_reads_back_every_record_round_after_round(make_broker, client):
    """The benchmark's loop, scaled down (issue item 0): an 8-partition topic written past its rings
    (so it is read back from the journal), read, deleted; a 1-partition topic made and deleted;
    again. From the second round on the topic lands on the slots the first one had, and the
    workers' disk readers had the old index files open by slot: every fetch read the deleted
    topic's entries, found their segments gone and answered OFFSET_OUT_OF_RANGE at log start 0."""
    import asyncio

    from tailrace.client.aio import AsyncConsumer

    b = make_broker(workers=2, segment_bytes=1 << 20, ring_bytes=1 << 20, max_batch_bytes=256 << 10,
                    retention_check_ms=100)
    parts, per_part, per_batch = 8, 20_000, 2_000  # 2 MB a partition through a 1 MiB ring
    value = [b"v" * 100] * per_batch

    async def read_async(n):
        async with AsyncConsumer(b.bootstrap, auto_offset_reset="error", max_wait_ms=100) as c:
            await c.assign("big", start="earliest")
            got, deadline = 0, time.monotonic() + 30
            while got < n and time.monotonic() < deadline:
                got += sum(len(cols) for _t, _p, cols in await c.poll_columns(200))
            return got

    def read_blocking(n):
        with Consumer(b.bootstrap, auto_offset_reset="error", max_wait_ms=100) as c:
            c.assign("big", start="earliest")
            got, deadline = 0, time.monotonic() + 30
            while got < n and time.monotonic() < deadline:
                got += sum(len(cols) for _t, _p, cols in c.poll_columns(200))
            return got

    from tailrace.broker.catalog import Catalog

    slots_seen = []
    for rnd in range(4):
        with Admin(b.bootstrap) as a:
            a.create_topic("big", parts)
        slots_seen.append(Catalog(b.data_dir).get("big").slots)
        with Producer(b.bootstrap, acks="memory", linger_ms=1) as p:
            for i in range(parts * per_part // per_batch):
                p.send_batch("big", value, partition=i % parts)
            assert p.flush(60_000) == parts * per_part
        n = parts * per_part
        got = asyncio.run(read_async(n)) if client == "async" else read_blocking(n)
        with Admin(b.bootstrap) as a:
            offs = [(o.log_start_offset, o.high_watermark) for o in a.list_offsets("big")]
            assert got == n, f"round {rnd}: {got} of {n} records read back; offsets {offs}"
            a.delete_topic("big")
            a.create_topic("one", 1)
            one = Catalog(b.data_dir).get("one").slots
            a.delete_topic("one")
        _wait_cleared(b, [*slots_seen[-1], *one])  # so the next round takes the same slots
    assert slots_seen[1] == slots_seen[0], slots_seen  # the case: a new topic on a deleted one's slots
    assert "oldest kept record" in (b.data_dir / "logs" / "flusher.log").read_text()  # retention ran
