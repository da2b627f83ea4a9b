"""A worker killed (as kill -9 would: ``os._exit``, no cleanup) at each point of giving a ring's
pages back (actors/keeper.py, shm/ring.py ``RingWriter.release``): after the batches are
forgotten and before the pages are punched, and after the punch. supervisord starts the worker
again, the router gives it its partitions back, and then nothing acknowledged is lost (every
record reads back, in order, once), appends go on, and no page is leaked: once idle, every ring
holds no more than an idle ring does (its header's page and its head's)."""

from __future__ import annotations

import time

import pytest

from tailrace import Admin, Consumer, Producer

PARTS, BATCHES, VALUE = 4, 6, b"r" * 3000  # each batch a page or more: there is something to give back
PAGE = 4096


def _read_all(b, want: int) -> list[list[bytes]]:
    out = [[] for _ in range(PARTS)]
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("rel", start="earliest")
        deadline = time.monotonic() + 60
        while sum(map(len, out)) < want and time.monotonic() < deadline:
            for r in c.poll(500):
                out[r.partition].append(r.value)
    return out


def _expected(batches: int) -> list[list[bytes]]:
    return [[b"%d.%d." % (p, i) + VALUE for i in range(batches)] for p in range(PARTS)]


@pytest.mark.parametrize("step", ["ring_release_forgotten", "ring_release_punched"])
def test_a_worker_killed_while_giving_pages_back_loses_nothing_and_leaks_no_page(make_broker, step):
    b = make_broker(workers=1, ring_idle_ms=300, debug_crash_at=step)
    with Admin(b.bootstrap) as a:
        a.create_topic("rel", PARTS)
        made = a.status()["shm_resident_bytes"]
    worker = b.pids()["worker-0"]
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:  # acknowledged once fsynced
        for i in range(BATCHES):
            for part in range(PARTS):
                p.send("rel", b"%d.%d." % (part, i) + VALUE, partition=part)
        assert p.flush(30_000) == PARTS * BATCHES
    deadline = time.monotonic() + 30  # idle 300 ms: the worker starts giving back, and dies there
    log = b.data_dir / "logs" / "worker-0.log"
    while time.monotonic() < deadline and f"debug_crash_at={step}: dying here" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    assert f"debug_crash_at={step}: dying here" in log.read_text()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and b.pids().get("worker-0") in (None, worker):
        time.sleep(0.1)
    assert b.pids().get("worker-0") not in (None, worker)  # a new worker process
    assert _read_all(b, PARTS * BATCHES) == _expected(BATCHES)
    with Producer(b.bootstrap, acks="durable", linger_ms=0) as p:  # appends go on where they were
        for part in range(PARTS):
            p.send("rel", b"%d.%d." % (part, BATCHES) + VALUE, partition=part)
        assert p.flush(30_000) == PARTS
    assert _read_all(b, PARTS * (BATCHES + 1)) == _expected(BATCHES + 1)
    bound = made + PARTS * 2 * PAGE  # idle: a header's page and a head's page a ring
    with Admin(b.bootstrap) as a:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and a.status()["shm_resident_bytes"] > bound:
            time.sleep(0.2)
        assert a.status()["shm_resident_bytes"] <= bound
