"""Placement over time with real processes: dead workers, the grace delay, fenced handoff."""

from __future__ import annotations

import os
import signal
import threading
import time

from client import Admin
from tests.reliability.workload import Produced, audit, produce_until


def _status(b):
    with Admin(b.bootstrap) as a:
        return a.status()


def test_a_restarted_worker_keeps_its_partitions_within_the_grace_delay(make_broker):
    b = make_broker(workers=2, reassign_grace_ms=5000)
    Admin(b.bootstrap).create_topic("stay", 4)
    before = Admin(b.bootstrap).describe_topic("stay").partitions
    b.kill9("worker-0")  # supervisord restarts it in about a second: well inside the grace
    time.sleep(2.5)
    b.wait_ready()
    after = Admin(b.bootstrap).describe_topic("stay").partitions
    assert [p.worker for p in after] == [p.worker for p in before]
    assert _status(b)["moves"] == []


def test_a_hung_worker_loses_its_partitions_after_the_grace_and_nothing_acked_is_lost(make_broker):
    b = make_broker(workers=2, worker_timeout_ms=1000, reassign_grace_ms=1000)
    Admin(b.bootstrap).create_topic("hang", 4)
    stop = threading.Event()
    produced = Produced()
    th = threading.Thread(target=produce_until, args=(b.bootstrap, "hang", 4, "memory", stop), kwargs={"out": produced})
    th.start()
    time.sleep(0.5)
    victim = b.pids()["worker-0"]
    os.kill(victim, signal.SIGSTOP)  # alive but silent: still holds its partitions' leases
    t0 = time.monotonic()
    try:
        deadline = t0 + 15
        while time.monotonic() < deadline and not _status(b)["moves"]:
            time.sleep(0.2)
        moved_after = time.monotonic() - t0
        moves = _status(b)["moves"]
        assert moves and all(src == 0 and dst == 1 for _slot, src, dst in moves)
    finally:
        os.kill(victim, signal.SIGCONT)  # it wakes, sees the fence and lets go of the leases
    resumed = time.monotonic()
    moved_slots = {slot for slot, _s, _d in moves}
    base = dict(produced.acked)
    while time.monotonic() - resumed < 30 and not all(produced.acked[p] > base[p] for p in range(4)):
        time.sleep(0.05)  # every partition, moved ones included, takes acknowledged writes again
    served = time.monotonic() - resumed
    assert all(produced.acked[p] > base[p] for p in range(4)), "a moved partition was not served again"
    time.sleep(0.5)
    stop.set()
    th.join(120)
    result = audit(b.bootstrap, "hang", produced)
    print(f"\nworker declared dead and its {len(moves)} partitions moved {moved_after:.1f} s after it hung "
          f"(timeout 1.0 s + grace 1.0 s; slots {sorted(moved_slots)}); served again {served:.2f} s after it resumed; "
          f"acked {sum(produced.acked.values())}, lost {sum(result.lost.values())}, duplicated {sum(result.duplicated.values())}")
    assert not produced.errors
    assert result.ok
    alive = {w["worker"] for w in _status(b)["workers"] if w["alive"]}
    assert alive == {0, 1} and {p.worker for p in Admin(b.bootstrap).describe_topic("hang").partitions} <= alive
