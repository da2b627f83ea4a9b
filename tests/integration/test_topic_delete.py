"""Deleting topics (``tailrace topic delete``, ``Admin.delete_topic``) with real processes: the
topic's clients get UNKNOWN_TOPIC, same-host ring readers included; its slots, rings, budget and
index files come back; a topic of the same name is a new one; recovery skips the deleted
topic's batches and keeps everything else; 200 topics of 10 partitions made and deleted in a
loop leave the broker where it started."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client.errors import UnknownTopicError
from tailrace.shm import region

from ..helpers import hard_kill_all, wait_restarted


def _tailrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailrace", *args], capture_output=True, text=True, timeout=60)


def _catalog(b) -> dict:
    return json.loads((b.data_dir / "topics.json").read_text())


def _wait(cond, timeout_s: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what or cond}"
        time.sleep(0.05)


def _cleared(b) -> bool:
    """Every retired slot has neither an index file nor a ring (persistence/retire.py)."""
    rings = set(b.shm_regions())
    return all(not (b.data_dir / "index" / f"{s}.index").exists() and region.ring_name(b.settings.instance, s) not in rings
               for s in _catalog(b).get("retired", []))


def _read_all(b, topic: str, n: int, **kw) -> list:
    with Consumer(b.bootstrap, max_wait_ms=100, **kw) as c:
        c.assign(topic, start="earliest")
        got, deadline = [], time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            got += c.poll(200)
        time.sleep(0.2)
        got += c.poll(100)
        return got


def test_a_deleted_topic_is_gone_for_everyone_and_its_name_starts_again(make_broker):
    b = make_broker(ring_bytes=2 << 20)
    with Admin(b.bootstrap) as a:
        a.create_topic("d", 2)
        a.create_topic("keep", 2)
        before = a.status()["shm_used_bytes"]
    with Producer(b.bootstrap, acks="durable", linger_ms=1) as p:
        for i in range(600):  # interleaved in the journal: recovery must skip d's batches, not cut at them
            p.send("d", b"old-%d" % i)
            p.send("keep", b"keep-%d" % i)
        assert p.flush(30_000) == 1200
    ring_reader = Consumer(b.bootstrap, same_host=True, max_wait_ms=100)
    ring_reader.assign("d", start="earliest")
    got, deadline = 0, time.monotonic() + 10
    while got < 600 and time.monotonic() < deadline:
        got += len(ring_reader.poll(100))
    assert got == 600
    slots = _catalog(b)["topics"]["d"]["slots"]
    producer = Producer(b.bootstrap, acks="memory", linger_ms=0)
    producer.send("d", b"still here")
    assert producer.flush(10_000) == 1

    with Admin(b.bootstrap) as a:
        info = a.delete_topic("d")
        assert info.name == "d" and info.partitions == 2
        assert [t.name for t in a.list_topics()] == ["keep"]
        with pytest.raises(UnknownTopicError):
            a.describe_topic("d")
        with pytest.raises(UnknownTopicError):
            a.delete_topic("d")
        assert a.status()["shm_used_bytes"] < before  # the budget at once
    time.sleep(0.5)  # the workers look at the catalog every quarter second
    producer.send("d", b"after the delete")
    with pytest.raises(UnknownTopicError):
        producer.flush(10_000)
    producer.close()
    with pytest.raises(UnknownTopicError):  # a consumer of it, through the router or its rings
        for _ in range(50):
            ring_reader.poll(100)
    ring_reader.close()
    with Consumer(b.bootstrap, max_wait_ms=100) as c, pytest.raises(UnknownTopicError):
        c.assign("d", start="earliest")
        c.poll(100)

    _wait(lambda: _cleared(b), what="the deleted topic's slots cleared")
    assert sorted(_catalog(b)["retired"]) == sorted(slots)
    out = _tailrace("topic", "create", "d", "--partitions", "2", "--bootstrap", b.bootstrap)
    assert out.returncode == 0, out.stderr
    cat = _catalog(b)
    assert sorted(cat["topics"]["d"]["slots"]) == sorted(slots) and cat["retired"] == []  # the same slots, again
    assert cat["topics"]["d"]["topic_id"] > info.topic_id
    with Admin(b.bootstrap) as a:
        assert [o.high_watermark for o in a.list_offsets("d")] == [0, 0]  # starts at offset 0
    with Producer(b.bootstrap, acks="durable", linger_ms=1) as p:
        for i in range(3):
            p.send("d", b"new-%d" % i, partition=0)
        assert p.flush() == 3
    for kw in ({}, {"same_host": True}):  # nothing of the old topic, by fetch or by ring
        assert sorted(r.value for r in _read_all(b, "d", 3, **kw)) == [b"new-0", b"new-1", b"new-2"]

    # a full rescan of the journal (no checkpoint) meets the old d's batches among keep's: skipped
    hard_kill_all(b)
    (b.data_dir / "journal" / "checkpoint").unlink()
    b.start()
    # keep holds 600 records (waiting for 1200 ran _read_all to its 20 s deadline every time)
    assert sorted(r.value for r in _read_all(b, "keep", 600)) == sorted(b"keep-%d" % i for i in range(600))
    assert sorted(r.value for r in _read_all(b, "d", 3)) == [b"new-0", b"new-1", b"new-2"]
    flusher_log = (b.data_dir / "logs" / "flusher.log").read_text()
    assert "batches of deleted topics; skipped" in flusher_log and "cut there" not in flusher_log
    out = _tailrace("topic", "delete", "keep", "--bootstrap", b.bootstrap)
    assert out.returncode == 0 and "deleted topic keep" in out.stdout, out.stderr
    out = _tailrace("topic", "delete", "keep", "--bootstrap", b.bootstrap)
    assert out.returncode != 0 and "UNKNOWN_TOPIC" in out.stderr + out.stdout


def test_two_hundred_topics_made_and_deleted_leave_the_broker_where_it_started(make_broker):
    """200 x (create a topic of 10 partitions, write to each partition, delete it): the shared
    memory budget in use, the rings, the index files and the slots in use come back to where they
    were. The first 20 wait for the slots to be cleared each time: the same 10 slots serve every
    one of them. The other 180 go as fast as the client can (about 7 ms each here): slots are used
    again as fast as the flusher clears them (every 0.1 s), so fewer than 2,001 are ever used."""
    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("base", 1)
        start = a.status()["shm_used_bytes"]
    regions_before = len(b.shm_regions())
    with Admin(b.bootstrap) as a, Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        for i in range(200):
            a.create_topic(f"t{i}", 10)
            for part in range(10):
                p.send(f"t{i}", b"x", partition=part)
            assert p.flush(10_000) == 10 * (i + 1), p.errors
            a.delete_topic(f"t{i}")
            if i < 20:
                _wait(lambda: _cleared(b), what="the deleted topic's slots cleared")
                assert _catalog(b)["next_slot"] == 11  # base's slot and the same 10 again
        assert a.status()["shm_used_bytes"] == start
    _wait(lambda: _cleared(b), timeout_s=30, what="every deleted topic's slots cleared")
    cat = _catalog(b)
    assert list(cat["topics"]) == ["base"]
    assert len(b.shm_regions()) == regions_before
    assert sorted(p.name for p in (b.data_dir / "index").iterdir()) == [f"{s}.index" for s in cat["topics"]["base"]["slots"]]
    used_slots = cat["next_slot"]
    print(f"200 topics x 10 partitions made and deleted: {used_slots} slot numbers ever used")
    assert used_slots < 1 + 10 * 200, used_slots
    with Admin(b.bootstrap) as a:  # every slot ever used is free again: a new topic takes the lowest
        a.create_topic("again", 10)
    assert _catalog(b)["topics"]["again"]["slots"] == list(range(1, 11))


@pytest.mark.parametrize("step", ["retire_rows_cleared", "retire_one_index_removed", "everything_killed"])
def test_a_kill_in_the_middle_of_a_delete_leaves_recovery_consistent(make_broker, step):
    """The flusher dies (as kill -9) after clearing a deleted topic's rows and rings, or between
    removing two of its index files (supervisord restarts it); or every process is killed right
    after the delete's reply and the broker started again. Clearing finishes, the other topic keeps
    every acknowledged record and goes on at its offsets, the deleted one stays deleted, and its
    name starts again at offset 0 on its old slots."""
    b = make_broker(ring_bytes=2 << 20, **({} if step == "everything_killed" else {"debug_crash_at": step}))
    with Admin(b.bootstrap) as a:
        a.create_topic("gone", 4)
        a.create_topic("kept", 2)
    with Producer(b.bootstrap, acks="durable", linger_ms=1) as p:
        for i in range(2000):
            p.send("gone", b"g-%d" % i)
            p.send("kept", b"k-%d" % i)
        assert p.flush(30_000) == 4000
    pids = b.pids()
    slots = _catalog(b)["topics"]["gone"]["slots"]
    with Admin(b.bootstrap) as a:
        a.delete_topic("gone")
    if step == "everything_killed":
        hard_kill_all(b)
        b.start()
    else:
        _wait(lambda: (b.data_dir / f"debug-crashed-{step}").exists(), what="the flusher's crash")
        wait_restarted(b, pids, ["flusher"])
    _wait(lambda: _cleared(b), what="the deleted topic's slots cleared")
    assert sorted(r.value for r in _read_all(b, "kept", 2000)) == sorted(b"k-%d" % i for i in range(2000))
    with Admin(b.bootstrap) as a, Producer(b.bootstrap, acks="durable", linger_ms=1) as p:
        assert [t.name for t in a.list_topics()] == ["kept"]
        a.create_topic("gone", 4)
        assert sorted(_catalog(b)["topics"]["gone"]["slots"]) == sorted(slots)
        assert [o.high_watermark for o in a.list_offsets("gone")] == [0] * 4
        p.send("gone", b"anew", partition=3)
        p.send("kept", b"k-more", partition=0)
        assert p.flush() == 2
        assert sum(o.high_watermark for o in a.list_offsets("kept")) == 2001
    assert [r.value for r in _read_all(b, "gone", 1)] == [b"anew"]
    hard_kill_all(b)  # and once more from the journal alone
    b.start()
    assert [r.value for r in _read_all(b, "gone", 1)] == [b"anew"]
    assert len(_read_all(b, "kept", 2001)) == 2001


def test_a_flusher_that_finds_an_active_ring_gone_passes_it_over_and_keeps_flushing_the_others(make_broker):
    """An active row with batches to stage whose ring region is gone (a slot's ring unlinked
    under its owner: what clearing a slot twice once did) cannot be staged. The flusher says so
    in its log once and goes on with every other partition: it does not exit at every restart
    with durable produce stopped everywhere."""
    import os
    import signal

    b = make_broker()
    with Admin(b.bootstrap) as a:
        a.create_topic("lost", 1)
        a.create_topic("kept", 1)
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:
        p.send("lost", b"before")
        p.send("kept", b"before")
        assert p.flush(10_000) == 2
    slot = _catalog(b)["topics"]["lost"]["slots"][0]
    pids = b.pids()
    os.kill(pids["flusher"], signal.SIGKILL)
    assert region.unlink(region.ring_name(b.settings.instance, slot))
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:  # its owner still appends to the ring it holds
        for i in range(20):
            p.send("lost", b"after-%d" % i)
        assert p.flush(10_000) == 20
    pids = wait_restarted(b, pids, ["flusher"])
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:
        for i in range(100):
            p.send("kept", b"k-%d" % i)
        assert p.flush(15_000) == 100, p.errors
    time.sleep(1.0)  # several cycles and a rescan: still the same flusher
    assert b.pids()["flusher"] == pids["flusher"]
    log = (b.data_dir / "logs" / "flusher.log").read_text()
    assert f"slot {slot}: an active row with batches to stage, and its ring region is gone" in log
    assert "Traceback" not in log
    assert [r.value for r in _read_all(b, "kept", 101)] == [b"before"] + [b"k-%d" % i for i in range(100)]
