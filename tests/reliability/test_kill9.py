"""kill -9 of each broker process kind under load: nothing acknowledged is lost or duplicated."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from tailrace import Admin

from tailrace.bench.audit import Produced, audit, produce_until
from tests.clients import CLIENTS
from tests.helpers import bounded_producer, running_pids

VICTIMS = ["worker-0", "flusher", "router", "worker-1", "all", "flusher", "all"]


def _kill(pids: dict, victim: str) -> None:
    targets = list(pids.values()) if victim == "all" else [pids[victim]]
    for pid in targets:
        os.kill(pid, signal.SIGKILL)


def _wait_restarted(broker, old: dict, victim: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    names = list(old) if victim == "all" else [victim]
    while time.monotonic() < deadline:
        now = running_pids(broker)
        if all(n in now and now[n] != old[n] for n in names) and len(now) == len(old):
            broker.wait_ready(timeout_s)
            return
        time.sleep(0.05)
    raise AssertionError(f"{victim} not restarted by supervisord within {timeout_s}s")


@pytest.mark.parametrize("acks,client", [("none", "blocking"), ("memory", "blocking"), ("durable", "blocking"),
                                         ("durable", "async")])
def test_kill9_of_every_process_kind_under_load_loses_no_acknowledged_record(make_broker, acks, client):
    """``client``: the producer and the tailing consumer are the blocking client's, or the
    asyncio client's behind the same API (tests/clients.py): the same assertions for both."""
    clients = CLIENTS[client]
    b = make_broker(workers=2, ring_bytes=1 << 20, max_batch_bytes=256 * 1024)
    Admin(b.bootstrap).create_topic("crash", 4)
    stop = threading.Event()
    produced = Produced()
    producer = threading.Thread(target=produce_until, args=(b.bootstrap, "crash", 4, acks, stop), kwargs={"out": produced, "producer": bounded_producer(clients.Producer)})
    tail_seen = {}
    tail_errors = []  # collected here: an assert inside the thread would not fail the test

    def tail():
        with clients.Consumer(b.bootstrap, max_wait_ms=100, request_timeout_ms=1000) as c:
            c.assign("crash", start="earliest")
            while not stop.is_set():
                for _t, p, cols in c.poll_columns(200):
                    if cols.offsets[0] != tail_seen.get(p, 0):
                        tail_errors.append((p, tail_seen.get(p, 0), int(cols.offsets[0]), c.last_reply[("crash", p)]))
                    tail_seen[p] = int(cols.offsets[-1]) + 1

    tailer = threading.Thread(target=tail)
    producer.start()
    tailer.start()
    rng = random.Random(acks if client == "blocking" else acks + client)
    cycles = 0
    try:
        for victim in VICTIMS:
            time.sleep(rng.uniform(0.2, 0.8))
            old = running_pids(b)
            _kill(old, victim)
            cycles += 1
            _wait_restarted(b, old, victim)
        time.sleep(0.5)
    finally:
        stop.set()
        producer.join(180)
        tailer.join(30)
    result = audit(b.bootstrap, "crash", produced)
    acked, sent = sum(produced.acked.values()), sum(produced.sent.values())
    found = sum(result.found.values())
    print(f"\nacks={acks}: crash cycles {cycles}, sent {sent}, acknowledged {acked}, found {found}, "
          f"lost {sum(result.lost.values())}, duplicated {sum(result.duplicated.values())}, "
          f"tailing consumer read {sum(tail_seen.values())}")
    assert not produced.errors, produced.errors
    assert sum(result.duplicated.values()) == 0
    assert sum(result.lost.values()) == 0
    if acks != "none":  # acknowledged in order, one in flight per partition: no gaps either
        assert result.ok, result
        assert found >= acked > 0
    assert sum(tail_seen.values()) > 0
    assert not tail_errors, f"tailing consumer saw a gap or a repeat (partition, expected, got, reply): {tail_errors[:3]}"
