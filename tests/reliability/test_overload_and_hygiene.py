"""Overload and hygiene: backpressure is retried and loses nothing; memory stays bounded; shared
memory is exactly what the live partitions need, owner-only, and gone after a clean stop.

Overload is made certain rather than hoped for: besides a producer simply running against small
rings, the flusher is paused (SIGSTOP, then SIGCONT) in short bursts, so every ring fills and the
workers answer BACKPRESSURE until it drains them again. RSS is VmRSS from /proc of every broker
process, before and after.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.broker.catalog import Catalog
from tailrace.shm import region

from tests.helpers import LOAD_BUFFER_BYTES, Raw, broker_rss_kib, hard_kill_all, running_pids, wait_restarted
from tailrace.bench.audit import Produced, audit, records

RSS_GROWTH_LIMIT_KIB = 200 * 1024
SMALL_RING = 128 * 1024


def _count_codes(prod: Producer) -> Counter:
    """Tally the code of every reply the producer receives (it retries BACKPRESSURE itself)."""
    codes: Counter = Counter()
    recv = prod.pool.recv

    def counting(timeout_ms):
        r = recv(timeout_ms)
        if r is not None:
            codes[P.ErrorCode(r.code).name] += 1
        return r

    prod.pool.recv = counting
    return codes


def _produce_audited(prod: Producer, topic: str, partitions: int, produced: Produced, until, rng) -> None:
    while not until():
        p = int(rng.integers(partitions))
        n = int(rng.integers(1, 800))  # up to 29 KB per batch
        values, offsets = records(p, produced.sent[p], n)
        prod.send_buffers(topic, values, offsets, partition=p)
        produced.sent[p] += n
        while prod.in_flight >= partitions:
            prod.poll(20)


def _growth(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if k in after}


def test_backpressure_from_full_rings_is_retried_by_the_producer_and_nothing_is_lost(make_broker):
    b = make_broker(workers=2, ring_bytes=SMALL_RING, max_batch_bytes=32 * 1024)
    Admin(b.bootstrap).create_topic("ovl", 2)
    produced = Produced(sent={0: 0, 1: 0}, acked={0: 0, 1: 0})

    def on_ack(_t, p, _base, n):
        produced.acked[p] += n

    rng = np.random.default_rng(3)
    # buffer_memory: 4 MiB queued or unacknowledged (tests/helpers.LOAD_BUFFER_BYTES) keeps both
    # partitions busy; the default 32 MiB was ~1M more records to flush and audit after the stalls
    prod = Producer(b.bootstrap, acks="memory", on_ack=on_ack, retry_backoff_ms=1, delivery_timeout_ms=60_000,
                    buffer_memory=LOAD_BUFFER_BYTES)
    codes = _count_codes(prod)
    # Warm up (every process has imported and mapped what it needs), then measure.
    t = time.monotonic()
    _produce_audited(prod, "ovl", 2, produced, lambda: time.monotonic() - t > 1.0, rng)
    rss_before = broker_rss_kib(b)
    natural = dict(codes)
    t = time.monotonic()
    _produce_audited(prod, "ovl", 2, produced, lambda: time.monotonic() - t > 1.5, rng)
    natural = {k: codes[k] - natural.get(k, 0) for k in codes}
    # Now pause the flusher in bursts: the rings fill, the workers answer BACKPRESSURE.
    flusher = running_pids(b)["flusher"]
    stalls = 0
    done = threading.Event()

    def stall():
        nonlocal stalls
        try:
            for _ in range(5):
                os.kill(flusher, signal.SIGSTOP)
                stalls += 1
                time.sleep(0.4)
                os.kill(flusher, signal.SIGCONT)
                time.sleep(0.15)
        finally:
            os.kill(flusher, signal.SIGCONT)
            done.set()

    staller = threading.Thread(target=stall)
    before_stall = codes["BACKPRESSURE"]
    staller.start()
    try:
        _produce_audited(prod, "ovl", 2, produced, done.is_set, rng)
    finally:
        staller.join(30)
    prod.flush(60_000)
    prod.pool.close()
    rss_after = broker_rss_kib(b)
    result = audit(b.bootstrap, "ovl", produced)
    growth = _growth(rss_before, rss_after)
    sent, acked = sum(produced.sent.values()), sum(produced.acked.values())
    print(f"\noverload: rings {SMALL_RING >> 10} KiB; without stalls {natural.get('BACKPRESSURE', 0)} BACKPRESSURE "
          f"of {sum(natural.values())} replies; {stalls} flusher stalls of 0.4 s: "
          f"{codes['BACKPRESSURE'] - before_stall} BACKPRESSURE replies, all retried by the producer; sent {sent}, "
          f"acked {acked}, found {sum(result.found.values())}, lost {sum(result.lost.values())}, duplicated "
          f"{sum(result.duplicated.values())}; RSS growth KiB {growth} (limit {RSS_GROWTH_LIMIT_KIB})")
    assert prod.errors == [], prod.errors
    assert codes["BACKPRESSURE"] - before_stall > 0, codes
    assert acked == sent and result.ok, result
    assert all(g < RSS_GROWTH_LIMIT_KIB for g in growth.values()), growth


def test_a_consumer_that_stops_polling_does_not_grow_broker_memory(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("slow", 2)
    value = bytes(range(256)) * 16  # 4 KiB
    per_batch, batches = 60, 1300  # 1300 x 240 KiB = 305 MiB
    with Producer(b.bootstrap, acks="memory") as prod:  # warm up
        prod.send_batch("slow", [value] * per_batch, partition=0)
        prod.send_batch("slow", [value] * per_batch, partition=1)
    cons = Consumer(b.bootstrap, max_wait_ms=500)
    cons.assign("slow", start="earliest")
    got = len(cons.poll(1000))
    got += len(cons.poll(0))  # fetches in flight again; from here on this consumer never reads
    rss_before = broker_rss_kib(b)
    t0 = time.monotonic()
    with Producer(b.bootstrap, acks="memory") as prod:
        for i in range(batches):
            prod.send_batch("slow", [value] * per_batch, partition=i % 2)
            while prod.in_flight >= 2:
                prod.poll(20)
        prod.flush(120_000)
    produce_s = time.monotonic() - t0
    time.sleep(0.5)
    rss_after = broker_rss_kib(b)
    growth = _growth(rss_before, rss_after)
    # The slow consumer catches up later, from disk, and misses nothing.
    want = (batches + 2) * per_batch
    deadline = time.monotonic() + 60
    while got < want and time.monotonic() < deadline:
        got += sum(len(cols) for _t, _p, cols in cons.poll_columns(500))
    cons.close()
    mib = batches * per_batch * len(value) / (1 << 20)
    print(f"\nslow consumer: {mib:.0f} MiB produced in {produce_s:.1f} s while a consumer held fetches and never "
          f"read; broker RSS growth KiB {growth} (limit {RSS_GROWTH_LIMIT_KIB}); the consumer then read "
          f"{got} of {want} records")
    assert all(g < RSS_GROWTH_LIMIT_KIB for g in growth.values()), growth
    assert got == want


def _regions(b) -> dict[str, int]:
    """Region name -> permission bits, for this broker instance."""
    return {name: stat.S_IMODE(os.stat(region.SHM_DIR / name.lstrip("/")).st_mode) for name in b.shm_regions()}


def _expected(b, used_slots) -> set[str]:
    inst = b.settings.instance
    return {region.control_name(inst), *(region.ring_name(inst, s) for s in used_slots)}


def test_shared_memory_is_one_table_plus_one_ring_per_used_partition_owner_only_and_gone_after_stop(make_broker):
    b = make_broker(workers=2)
    with Admin(b.bootstrap) as admin:
        admin.create_topic("hyg", 3)
        admin.create_topic("idle", 2)
    slots = Catalog(b.data_dir).get("hyg").slots
    with Producer(b.bootstrap, acks="durable") as prod:
        prod.send_batch("hyg", [b"x"] * 10, partition=0)
        prod.send_batch("hyg", [b"y"] * 10, partition=1)
    with Consumer(b.bootstrap) as cons:  # metadata reads of an idle topic take no ring
        cons.list_offsets("idle")
    seen = {"running": _regions(b)}
    assert set(seen["running"]) == _expected(b, slots[:2]), seen
    run_dir = Path(b.run_dir)  # ipc sockets and the owner lock files live here
    locks = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.glob("slot-*.lock")}
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700 and locks and set(locks.values()) == {0o600}, locks

    old = b.pids()  # kill -9 of every program; supervisord restarts them
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)
    wait_restarted(b, old, list(old))
    seen["after kill -9 of all programs"] = _regions(b)
    assert set(seen["after kill -9 of all programs"]) == _expected(b, slots[:2]), seen

    hard_kill_all(b)  # supervisord too: nothing left to restart anything
    seen["after kill -9 of supervisord and all"] = _regions(b)
    b.start()
    with Producer(b.bootstrap, acks="durable") as prod:
        prod.send_batch("hyg", [b"z"] * 10, partition=2)
    seen["restarted, third partition used"] = _regions(b)
    assert set(seen["restarted, third partition used"]) == _expected(b, slots), seen
    with Consumer(b.bootstrap, max_wait_ms=100) as cons:
        cons.assign("hyg", start="earliest")
        values = []
        for _ in range(20):
            values += [r.value for r in cons.poll(200)]
            if len(values) >= 30:
                break
    assert sorted(values) == [b"x"] * 10 + [b"y"] * 10 + [b"z"] * 10
    for phase, modes in seen.items():
        assert all(m == 0o600 for m in modes.values()), (phase, modes)
    assert b.stop() == 0
    seen["after a clean stop"] = _regions(b)
    assert seen["after a clean stop"] == {}, seen
    print(f"\nipc dir mode 0700, owner lock files {sorted(locks)} mode 0600; shared memory: " + "; ".join(f"{phase}: {len(modes)} regions ({', '.join(sorted(n.rsplit('-', 1)[1] for n in modes)) or 'none'})"
                                           f"{' all 0600' if modes else ''}" for phase, modes in seen.items()))


def test_a_wiped_data_dir_after_a_crash_does_not_inherit_stale_shared_memory(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("old", 1)
    with Producer(b.bootstrap, acks="durable") as prod:
        prod.send_batch("old", [b"old %d" % i for i in range(100)], partition=0)
    hard_kill_all(b)
    stale = _regions(b)
    shutil.rmtree(b.data_dir)  # the operator starts over with an empty data directory
    b.start()
    Admin(b.bootstrap).create_topic("new", 1)
    with Producer(b.bootstrap, acks="durable") as prod:
        prod.send_batch("new", [b"new %d" % i for i in range(5)], partition=0)
    with Consumer(b.bootstrap, max_wait_ms=100) as cons:
        offsets = cons.list_offsets("new")[0]
        cons.assign("new", start="earliest")
        values = []
        for _ in range(10):
            values += [r.value for r in cons.poll(200)]
    print(f"\nwiped data dir: stale regions before the restart {sorted(stale)}; new topic high watermark "
          f"{offsets.high_watermark}, reads {len(values)} records, first {values[:2]}")
    assert offsets.high_watermark == 5 and values == [b"new %d" % i for i in range(5)]


@pytest.mark.parametrize("via", ["router", "worker"])
def test_a_client_that_pipelines_fetches_and_never_reads_cannot_grow_broker_memory_without_bound(make_broker, via):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("big", 1)
    with Producer(b.bootstrap, acks="memory") as prod:
        for _ in range(20):
            prod.send_batch("big", [bytes(4096)] * 60, partition=0)  # 4.7 MiB
    owner = Admin(b.bootstrap).describe_topic("big").partitions[0]
    endpoint = b.bootstrap if via == "router" else owner.endpoint
    rss_before = broker_rss_kib(b)
    raw = Raw(endpoint, rcvhwm=1)
    try:
        for rid in range(400):
            raw.send([P.pack_routing(P.Op.FETCH, 0, rid, b"big"), P.encode(P.FetchRequest(0, max_bytes=1 << 20))])
        peak, last, deadline = {}, None, time.monotonic() + 10
        while time.monotonic() < deadline:
            peak = _growth(rss_before, broker_rss_kib(b))
            if peak == last:
                break
            last = peak
            time.sleep(0.5)
    finally:
        raw.close()
    logs = (b.data_dir / "logs").glob("*.log")
    dropped = [line for f in logs for line in f.read_text(errors="replace").splitlines() if "replies to peers that are gone or not reading" in line]
    with Consumer(b.bootstrap) as cons:  # and the broker still serves
        cons.assign("big", start="earliest")
        got = len(cons.poll(2000))
    print(f"\n400 unread 1 MiB fetches via the {via}: broker RSS growth KiB {peak}; drop log lines: {dropped[:1]}; "
          f"a fresh consumer then polls {got} records")
    assert all(g < RSS_GROWTH_LIMIT_KIB for g in peak.values()), peak
    assert dropped, "replies the client never read were dropped without a log line"
    assert got > 0
