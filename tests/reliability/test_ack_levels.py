"""What each ack level and each consumer isolation level means when the flusher falls behind, and
what an acknowledgement in memory is worth when the host goes down.

The flusher is paused (SIGSTOP) to hold records between "in the ring" and "in the journal". A host
crash is simulated by killing every process (supervisord included) and unlinking the instance's
shared memory; the page cache survives it, so this shows what had reached the journal files, not
what had reached the platters.
"""

from __future__ import annotations

import os
import signal
import time

from tailrace import Admin, Consumer, Producer

from tests.helpers import hard_kill_all


def _read(bootstrap: str, isolation: str, topic: str = "acks") -> list[bytes]:
    with Consumer(bootstrap, max_wait_ms=50, isolation=isolation) as cons:
        end = cons.list_offsets(topic)[0]
        want = end.durable_watermark if isolation == "durable" else end.high_watermark
        cons.assign(topic, start="earliest")
        out: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out += [r.value for r in cons.poll(200)]
            if len(out) >= want:
                time.sleep(0.2)  # nothing more may come: give a violation the chance to show
                out += [r.value for r in cons.poll(200)]
                break
    return out


def test_durable_isolation_stops_at_the_durable_watermark_and_memory_acks_past_it_die_with_the_host(make_broker):
    b = make_broker(workers=2)
    Admin(b.bootstrap).create_topic("acks", 1)
    durable = [b"durable %d" % i for i in range(300)]
    memory = [b"memory %d" % i for i in range(200)]
    with Producer(b.bootstrap, acks="durable") as prod:
        prod.send_batch("acks", durable, partition=0)
        assert prod.flush() == len(durable)
    flusher = b.pids()["flusher"]
    os.kill(flusher, signal.SIGSTOP)
    try:
        with Producer(b.bootstrap, acks="memory") as prod:
            prod.send_batch("acks", memory, partition=0)
            assert prod.flush() == len(memory)  # acknowledged from the ring, the flusher asleep
        with Admin(b.bootstrap) as admin:
            marks = admin.list_offsets("acks")[0]
        read_memory = _read(b.bootstrap, "memory")
        read_durable = _read(b.bootstrap, "durable")
        assert (marks.high_watermark, marks.durable_watermark) == (500, 300), marks
        assert read_memory == durable + memory
        assert read_durable == durable, f"durable isolation read {len(read_durable)} records past 300"
        hard_kill_all(b)  # with the flusher still stopped: the memory acks never reached the journal
    finally:
        try:
            os.kill(flusher, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lost_shm = b.shm_regions()
    b.cleanup_shm()
    b.start()
    after = _read(b.bootstrap, "memory")
    print(f"\nack levels: with the flusher stopped, high watermark {marks.high_watermark}, durable watermark "
          f"{marks.durable_watermark}; memory isolation read {len(read_memory)}, durable isolation read "
          f"{len(read_durable)}; after a simulated host crash (all processes and {len(lost_shm)} shared-memory "
          f"regions gone) the log holds {len(after)}: every durable ack, none of the {len(memory)} memory acks "
          f"past the durable watermark")
    assert after == durable
    bases: list[int] = []
    with Producer(b.bootstrap, acks="durable", on_ack=lambda _t, _p, base, _n: bases.append(base)) as prod:
        prod.send("acks", b"after the crash", partition=0)
        prod.flush()
    assert bases == [300], "offsets go on from the durable end"
