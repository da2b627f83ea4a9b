"""A thousand partitions at the default settings (issue 18): the default shared-memory budget
(half the memory) takes a topic of 1,000 partitions of the default ring, and each fresh
partition is written to and read back. (Timings are bench/probes/fresh.py's.)"""

from __future__ import annotations

import time

from tailrace import Admin, Consumer, Producer
from tailrace.broker.settings import Settings, default_shm_budget
from tailrace.shm.layout import ring_region_bytes


def test_a_thousand_partitions_fit_the_default_budget_and_each_is_served(make_broker):
    assert default_shm_budget() >= 1000 * ring_region_bytes(Settings().ring_bytes)  # on this machine's memory
    b = make_broker(shm_budget_bytes=0)  # 0: the default, as `tailrace serve` without options
    assert b.settings.shm_budget_bytes == default_shm_budget()
    with Admin(b.bootstrap, timeout_ms=60_000) as a:
        assert a.create_topic("big", 1000).partitions == 1000
    with Producer(b.bootstrap, acks="memory", linger_ms=0) as p:
        for part in range(1000):
            p.send("big", b"%d" % part, partition=part)
        assert p.flush(60_000) == 1000
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign("big", start="earliest")
        got, deadline = {}, time.monotonic() + 60
        while len(got) < 1000 and time.monotonic() < deadline:
            for r in c.poll(500):
                got[r.partition] = r.value
    assert got == {part: b"%d" % part for part in range(1000)}
    with Admin(b.bootstrap) as a:
        st = a.status()
        assert st["shm_used_bytes"] == 1000 * ring_region_bytes(Settings().ring_bytes) <= st["shm_budget_bytes"]
