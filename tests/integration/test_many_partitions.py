"""Many partitions at the default settings (issues 18 and 36): ten thousand partitions in one
topic at the defaults, each written to and read back; and memory that follows what is active:
rings reserve nothing, hold what was written, give back what is flushed and idle, and a broker
whose rings' sizes are many times its budget holds all its records while its shared memory stays
within the budget. (Timings are bench/probes/many_partitions.py's.)"""

from __future__ import annotations

import time

from tailrace import Admin, Consumer, Producer
from tailrace.broker.settings import Settings, default_shm_budget
from tailrace.shm.layout import control_table_bytes, ring_region_bytes

N = 10_000
MiB = 1 << 20
PAGE = 4096


def test_ten_thousand_partitions_at_the_defaults_each_served_and_idle_ones_hold_little(make_broker):
    b = make_broker(shm_budget_bytes=0)  # the defaults, as `tailrace serve` without options
    s = b.settings
    assert s.shm_budget_bytes == default_shm_budget() and s.max_slots >= N and s.ring_idle_ms == Settings().ring_idle_ms
    assert N * ring_region_bytes(s.ring_bytes) > 5 * s.shm_budget_bytes  # the rings' sizes: far over the budget
    with Admin(b.bootstrap, timeout_ms=60_000) as a:
        assert a.create_topic("big", N).partitions == N
        made = a.status()["shm_resident_bytes"]
    assert made < control_table_bytes(s.max_slots) + 16 * MiB  # a ring made holds nothing yet
    value = b"v" * 4000
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        for part in range(N):
            p.send_batch("big", [b"%d:" % part + value] * 3, partition=part)  # 3 pages of records
        assert p.flush(120_000) == 3 * N
    with Admin(b.bootstrap) as a:
        written = a.status()["shm_resident_bytes"]
    assert written > made + 3 * N * PAGE  # each ring holds its records' pages (ring_idle_ms has not passed)
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("big", start="earliest")
        got, deadline = {}, time.monotonic() + 120
        while len(got) < N and time.monotonic() < deadline:
            for r in c.poll(500):
                got[r.partition] = r.value
    assert got == {part: b"%d:" % part + value for part in range(N)}
    bound = made + N * 2 * PAGE  # idle and flushed, a ring keeps its header's page and its head's page
    with Admin(b.bootstrap) as a:
        deadline = time.monotonic() + s.ring_idle_ms / 1000 + 60
        while time.monotonic() < deadline and a.status()["shm_resident_bytes"] > bound:
            time.sleep(0.5)
        idle = a.status()["shm_resident_bytes"]
    assert idle <= bound and idle < written - N * PAGE, (made, written, idle)
    print(f"10,000 partitions: made {made:,} B, written {written:,} B, idle {idle:,} B of shared memory")


def test_rings_many_times_the_budget_hold_every_record_within_the_budget(make_broker):
    budget = 64 * MiB
    b = make_broker(shm_budget_bytes=budget, ring_idle_ms=300)
    parts, per, value = 24, 4 * MiB, b"x" * 1000
    assert parts * ring_region_bytes(Settings().ring_bytes) > 3 * budget
    with Admin(b.bootstrap, timeout_ms=30_000) as a:
        a.create_topic("wide", parts)
        table = a.status()["shm_resident_bytes"]
    seen = []
    with Producer(b.bootstrap, acks="memory", linger_ms=5) as p, Admin(b.bootstrap) as a:
        for i in range(per // len(value)):
            for part in range(parts):
                p.send("wide", b"%d." % i + value, partition=part)
            if i % 500 == 0:
                seen.append(a.status()["shm_resident_bytes"])
        assert p.flush(120_000) == parts * (per // len(value))
        seen.append(a.status()["shm_resident_bytes"])
    assert parts * per > budget and max(seen) <= table + budget, (seen, table)
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("wide", start="earliest")
        counts, deadline = [0] * parts, time.monotonic() + 120
        while sum(counts) < parts * (per // len(value)) and time.monotonic() < deadline:
            for r in c.poll(500):
                assert r.value == b"%d." % counts[r.partition] + value  # in order, each once
                counts[r.partition] += 1
    assert counts == [per // len(value)] * parts
