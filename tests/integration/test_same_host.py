"""The same-host path end to end, with real router, worker and flusher processes: producers send to
the workers' Unix sockets, consumers read the shared-memory rings read-only and fetch what is
below them over the same sockets (client/unixwire.py, actors/unix_server.py, client/ring_reader.py)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.aio import AsyncConsumer
from tailrace.client import protocol as P
from tailrace.client.connection import Connection
from tailrace.client.errors import InvalidRequestError
from tailrace.client.records import batches_to_columns, iter_batches
from tailrace.client.unixwire import SCHEME
from tests.helpers import MSG_BYTES, partition_payload
from tests.helpers import hard_kill_all, wait_restarted
from tailrace.bench.audit import Produced, check, records

RING = 512 << 10  # a small ring (>= 2 x max_batch_bytes, a multiple of 4096): wrapped many times
MAX_BATCH = 256 << 10


def _body(body) -> bytes | memoryview:
    return body.buffer if hasattr(body, "buffer") else body


class Reader:
    """Drives a Consumer's poll_raw and checks, per partition, that every reply starts where the
    last one ended and holds whole, contiguous batches; counts replies by source."""

    def __init__(self, cons: Consumer, start: dict[int, int]):
        self.cons = cons
        self.next = dict(start)  # partition -> next offset expected
        self.chunks: dict[int, list] = {p: [] for p in start}
        self.sources: Counter = Counter()
        self.max_seen: dict[int, int] = {}  # partition -> highest next_offset returned

    def poll(self, timeout_ms: int) -> list:
        got = []
        for a, start, info, body in self.cons.poll_raw(timeout_ms):
            p = a.partition
            assert start == self.next[p], f"partition {p}: a reply starts at {start}, expected {self.next[p]}"
            views = iter_batches(_body(body))
            assert views and views[0].base_offset <= start < views[0].base_offset + views[0].record_count, \
                (p, start, [(v.base_offset, v.record_count) for v in views[:3]])
            for v, w in zip(views, views[1:]):
                assert w.base_offset == v.base_offset + v.record_count, f"partition {p}: batches not contiguous"
            assert info.next_offset == views[-1].base_offset + views[-1].record_count
            cols = batches_to_columns(views, start)
            self.chunks[p].append(cols)
            self.next[p] = info.next_offset
            self.sources[info.source] += 1
            got.append((p, start, info, cols))
        return got

    def count(self, p: int) -> int:
        return self.next[p]

    def offsets(self, p: int) -> np.ndarray:
        return np.concatenate([c.offsets for c in self.chunks[p]]) if self.chunks[p] else np.zeros(0, np.int64)

    def values(self, p: int) -> np.ndarray:
        return np.concatenate([c.values for c in self.chunks[p]]) if self.chunks[p] else np.zeros(0, np.uint8)


def _forwarded(b) -> int:
    with Admin(b.bootstrap) as a:
        return a.status()["forwarded"]


def _owners(b, topic: str) -> dict[int, int]:
    with Admin(b.bootstrap) as a:
        return {pi.partition: pi.worker for pi in a.describe_topic(topic).partitions}


@pytest.mark.parametrize("acks", ["memory", "durable"])
def test_same_host_producer_and_consumer_through_many_ring_laps_read_back_everything(make_broker, acks, client):
    b = make_broker(workers=2, max_batch_bytes=MAX_BATCH)
    partitions, per_partition, batch = 2, 40_000, 1500  # 4 MB of 100-byte values per partition
    with Admin(b.bootstrap) as a:
        a.create_topic("laps", partitions, ring_bytes=RING)
    acked: Counter = Counter()
    forwarded_before = _forwarded(b)
    with Producer(b.bootstrap, acks=acks, same_host=True, linger_ms=0,
                  on_ack=lambda _t, p, _base, n: acked.__setitem__(p, acked[p] + n)) as prod:
        for first in range(0, per_partition, batch):
            n = min(batch, per_partition - first)
            for p in range(partitions):
                values, offsets = partition_payload(p, first, n)
                prod.send_buffers("laps", values, offsets, partition=p)
            while prod.in_flight >= partitions:
                prod.poll(20)
        prod.flush(120_000)
        prod_endpoints = set(prod.pool.direct)
    forwarded = _forwarded(b) - forwarded_before
    owners = _owners(b, "laps")
    unix = {b.settings.worker_unix_endpoint(w) for w in owners.values()}
    assert dict(acked) == dict.fromkeys(range(partitions), per_partition), acked
    assert prod_endpoints == unix, f"producer's direct connections {prod_endpoints}, want the owners' {unix}"
    # the first request of each partition may go through the router (it makes the owner adopt it)
    assert forwarded <= partitions, f"{forwarded} produce requests went through the router"
    laps = per_partition * MSG_BYTES / RING

    reader = None
    # replies of at most 128 KiB: most of the log is below the ring (fetched), its end is in it
    with client.Consumer(b.bootstrap, same_host=True, max_wait_ms=200, max_bytes=128 << 10) as cons:
        cons.assign("laps", start="earliest")
        assert cons._rings is not None, "the same-host consumer did not map the rings"
        reader = Reader(cons, dict.fromkeys(range(partitions), 0))
        deadline = time.monotonic() + 60
        while any(reader.count(p) < per_partition for p in range(partitions)) and time.monotonic() < deadline:
            reader.poll(500)
        cons_endpoints = set(cons.pool.direct)
    for p in range(partitions):
        offsets, values = reader.offsets(p), reader.values(p)
        assert np.array_equal(offsets, np.arange(per_partition)), f"partition {p}: offsets not dense and in order"
        expected, _ = partition_payload(p, 0, per_partition)
        assert np.array_equal(values, expected), f"partition {p}: bytes differ"
    print(f"\nsame-host acks={acks}, {client.name} consumer: {partitions} x {per_partition} records ({laps:.1f} laps of a {RING >> 10} KiB ring "
          f"per partition) acked {sum(acked.values())}, {forwarded} via the router; read back "
          f"{sum(reader.count(p) for p in range(partitions))} in order, byte-identical; replies by source "
          f"{dict(reader.sources)}; producer endpoints {sorted(prod_endpoints)}, consumer fetch endpoints "
          f"{sorted(cons_endpoints)}")
    assert reader.sources["shm"] > 0, reader.sources
    assert reader.sources["disk"] + reader.sources["ring"] > 0, f"no fetch below the ring: {reader.sources}"
    assert cons_endpoints and all(e.startswith(SCHEME) for e in cons_endpoints), cons_endpoints
    assert cons_endpoints <= unix


def test_a_tailing_same_host_consumer_sees_every_message_once_in_order(module_broker, client):
    b = module_broker  # the module's broker (tests/conftest.py), 2 workers; a topic per client
    topic = f"tail-{client.name}"
    partitions, before, per_partition = 2, 1000, 20_000
    with Admin(b.bootstrap) as a:
        a.create_topic(topic, partitions)
    with Producer(b.bootstrap, acks="memory") as prod:  # history the consumer must not see
        for p in range(partitions):
            values, offsets = partition_payload(p, 0, before)
            prod.send_buffers(topic, values, offsets, partition=p)
    errors: list = []
    sent = Counter()

    def produce():
        rng = np.random.default_rng(7)
        try:
            with Producer(b.bootstrap, acks="memory", same_host=True, linger_ms=0) as prod:
                while min(sent[p] for p in range(partitions)) < per_partition:
                    for p in range(partitions):
                        n = min(int(rng.integers(1, 600)), per_partition - sent[p])
                        if n <= 0:
                            continue
                        values, offsets = partition_payload(p, before + sent[p], n)
                        prod.send_buffers(topic, values, offsets, partition=p)
                        sent[p] += n
                    prod.poll(int(rng.integers(0, 4)))  # gaps: the consumer goes idle and waits on the futex
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with client.Consumer(b.bootstrap, same_host=True, max_wait_ms=200) as cons:
        cons.assign(topic, start="latest")
        starts = {p: cons.position(topic, p) for p in range(partitions)}
        assert starts == dict.fromkeys(range(partitions), before), starts
        reader = Reader(cons, starts)
        th = threading.Thread(target=produce)
        th.start()
        try:
            deadline = time.monotonic() + 60
            while any(reader.count(p) < before + per_partition for p in range(partitions)) and time.monotonic() < deadline:
                reader.poll(300)
                if errors:
                    break
            extra = reader.poll(300)  # nothing more comes
        finally:
            th.join(60)
        rings = cons._bell.rings if client.name == "async" else None  # the doorbell it slept on (WATCH)
    assert not errors, errors
    assert not extra, f"records past the end: {[(p, s) for p, s, _i, _c in extra]}"
    for p in range(partitions):
        offsets = reader.offsets(p)
        assert np.array_equal(offsets, np.arange(before, before + per_partition)), \
            f"partition {p}: {len(offsets)} offsets, first {offsets[:3]}, dense/in order: no"
        expected, _ = partition_payload(p, before, per_partition)
        assert np.array_equal(reader.values(p), expected), f"partition {p}: bytes differ"
    print(f"\ntailing same-host {client.name} consumer from 'latest' ({before} per partition before): read "
          f"{sum(reader.count(p) - before for p in range(partitions))} of {partitions * per_partition} produced while "
          f"tailing, each once, in order; replies by source {dict(reader.sources)}; doorbell rings {rings}")
    assert reader.sources["shm"] > 0, reader.sources
    if client.name == "async":  # woken by the workers' rings, not only by its timer
        assert rings > 0, "the asyncio consumer's doorbell never rang"


def test_a_durable_isolation_same_host_consumer_never_reads_past_the_durable_watermark(make_broker, client):
    b = make_broker(workers=1)
    with Admin(b.bootstrap) as a:
        a.create_topic("dur", 1)
    first, more = 5000, 3000
    with Producer(b.bootstrap, acks="durable", same_host=True) as prod:
        values, offsets = partition_payload(0, 0, first)
        prod.send_buffers("dur", values, offsets, partition=0)
    durable_cons = client.Consumer(b.bootstrap, same_host=True, isolation="durable", max_wait_ms=100)
    memory_cons = client.Consumer(b.bootstrap, same_host=True, isolation="memory", max_wait_ms=100)
    admin = Admin(b.bootstrap)
    flusher = b.pids()["flusher"]
    violations = []

    def poll_durable(reader: Reader, timeout_ms: int) -> None:
        for p, start, info, cols in reader.poll(timeout_ms):
            dw_after = admin.list_offsets("dur")[p].durable_watermark  # monotonic: an upper bound afterwards too
            last = int(cols.offsets[-1])
            if last >= info.durable_watermark or last >= dw_after:
                violations.append((start, last, info, dw_after))

    try:
        durable_cons.assign("dur", start="earliest")
        memory_cons.assign("dur", start="earliest")
        dreader = Reader(durable_cons, {0: 0})
        mreader = Reader(memory_cons, {0: 0})
        deadline = time.monotonic() + 20
        while (dreader.count(0) < first or mreader.count(0) < first) and time.monotonic() < deadline:
            poll_durable(dreader, 200)
            mreader.poll(0)
        assert dreader.count(0) == first and mreader.count(0) == first
        os.kill(flusher, signal.SIGSTOP)  # nothing becomes durable while it is stopped
        try:
            with Producer(b.bootstrap, acks="memory", same_host=True) as prod:
                values, offsets = partition_payload(0, first, more)
                prod.send_buffers("dur", values, offsets, partition=0)
            po = admin.list_offsets("dur")[0]
            assert po.high_watermark == first + more and po.durable_watermark == first, po
            t_end = time.monotonic() + 1.5
            while time.monotonic() < t_end:
                poll_durable(dreader, 100)
                mreader.poll(50)
            stalled_durable, stalled_memory = dreader.count(0), mreader.count(0)
        finally:
            os.kill(flusher, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while dreader.count(0) < first + more and time.monotonic() < deadline:
            poll_durable(dreader, 200)
        final = admin.list_offsets("dur")[0]
    finally:
        os.kill(flusher, signal.SIGCONT)
        durable_cons.close()
        memory_cons.close()
        admin.close()
    print(f"\nisolation=durable same-host {client.name} consumer: read {first} durable records ({dict(dreader.sources)} replies by "
          f"source); flusher stopped with high watermark {first + more}, durable {first}: durable reader at "
          f"{stalled_durable}, memory reader at {stalled_memory}; after it resumed the durable reader reached "
          f"{dreader.count(0)} (durable watermark {final.durable_watermark}); {len(violations)} reads past the watermark")
    assert not violations, violations[:3]
    assert stalled_memory == first + more, "the memory reader did not see the records (the test proves nothing)"
    assert stalled_durable == first
    assert dreader.count(0) == first + more
    expected, _ = partition_payload(0, 0, first + more)
    assert np.array_equal(dreader.offsets(0), np.arange(first + more))
    assert np.array_equal(dreader.values(0), expected)
    assert dreader.sources["shm"] > 0, dreader.sources


@pytest.mark.parametrize("victim", ["owner", "all", "host"])
def test_kill9_under_a_same_host_producer_and_consumer_loses_no_acked_record(make_broker, victim):
    """kill -9 of the worker owning partition 0, or of every program at once (supervisord restarts
    them, the shared memory survives), or a host crash (supervisord and every program killed, the
    shared memory gone, the broker started again on fresh memory): the same-host producer carries
    on (over the router while a worker is away), the tailing same-host consumer re-maps or fetches
    (with durable isolation in the host case), and every acknowledged record is read."""
    b = make_broker(workers=2, max_batch_bytes=MAX_BATCH)
    partitions = 2
    with Admin(b.bootstrap) as a:
        a.create_topic("k9", partitions, ring_bytes=RING)
    stop = threading.Event()
    produced = Produced(sent=dict.fromkeys(range(partitions), 0), acked=dict.fromkeys(range(partitions), 0))
    prod_errors: list = []
    cons_errors: list = []
    tailed: dict[int, list] = {}
    tail_next = dict.fromkeys(range(partitions), 0)
    cons_sources: Counter = Counter()

    def produce():
        def on_ack(_t, p, _base, n):
            produced.acked[p] += n

        rng = np.random.default_rng(1)
        prod = Producer(b.bootstrap, acks="durable", same_host=True, on_ack=on_ack, request_timeout_ms=1500,
                        delivery_timeout_ms=60_000, retry_backoff_ms=20)
        try:
            while not stop.is_set():
                p = int(rng.integers(partitions))
                n = int(rng.integers(1, 400))
                values, offsets = records(p, produced.sent[p], n)
                prod.send_buffers("k9", values, offsets, partition=p)
                produced.sent[p] += n
                while prod.in_flight >= partitions:
                    prod.poll(20)
            prod.flush(60_000)
        except Exception as exc:  # noqa: BLE001 - ConnectionError etc.: reported by the test
            prod_errors.append(exc)
        finally:
            prod.pool.close()

    def consume():
        try:
            # A host crash takes what was in the rings and not yet written with it: a memory
            # reader may already have read records the restarted broker never had (its position
            # then lies past the log end: OFFSET_OUT_OF_RANGE). GUARANTEES promises nothing
            # there; what survives a host crash is read with durable isolation.
            isolation = "durable" if victim == "host" else "memory"
            with Consumer(b.bootstrap, same_host=True, max_wait_ms=100, request_timeout_ms=1000, isolation=isolation) as cons:
                cons.assign("k9", start="earliest")
                # until the producer has finished and everything it had acked is read (or give up)
                while not (produced_done.is_set() and all(tail_next[p] >= produced.acked[p] for p in tail_next)):
                    if time.monotonic() > give_up[0]:
                        return
                    for a, start, info, body in cons.poll_raw(200):
                        if cons._rings is not None:
                            ring_maps.add(id(cons._rings))
                        if info.source == "shm" and restarted.is_set():
                            cons_sources["shm after the restart"] += 1
                        if start != tail_next[a.partition]:
                            cons_errors.append(("gap", a.partition, tail_next[a.partition], start))
                        cols = batches_to_columns(iter_batches(_body(body)), start)
                        tailed.setdefault(a.partition, []).append(cols)
                        tail_next[a.partition] = info.next_offset
                        cons_sources[info.source] += 1
        except Exception as exc:  # noqa: BLE001 - reported by the test
            cons_errors.append(exc)

    give_up = [float("inf")]
    produced_done = threading.Event()
    restarted = threading.Event()
    ring_maps: set = set()  # the consumer's ring mappings (a new one after fresh shared memory)
    producer = threading.Thread(target=produce)
    consumer = threading.Thread(target=consume)
    producer.start()
    consumer.start()
    killed = []
    try:
        time.sleep(1.5)
        old = b.pids()
        if victim == "host":
            killed.extend(sorted(old.items()))
            hard_kill_all(b)
            b.cleanup_shm()
            b.start()
        else:
            names = [f"worker-{_owners(b, 'k9')[0]}"] if victim == "owner" else list(old)
            for name in names:
                killed.append((name, old[name]))
                os.kill(old[name], signal.SIGKILL)
            wait_restarted(b, old, names)
        restarted.set()
        time.sleep(2.0)
    finally:
        stop.set()
        producer.join(90)
        produced_done.set()
        give_up[0] = time.monotonic() + 20
        consumer.join(40)
    tail_result = check(tailed, range(partitions), produced)
    # and a fresh same-host consumer afterwards
    fresh: dict[int, list] = {}
    with Consumer(b.bootstrap, same_host=True, max_wait_ms=100) as cons:
        ends = {po.partition: po.high_watermark for po in cons.list_offsets("k9")}
        cons.assign("k9", start="earliest")
        counts = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + 30
        while any(counts[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for _t, p, cols in cons.poll_columns(300):
                fresh.setdefault(p, []).append(cols)
                counts[p] += len(cols)
    fresh_result = check(fresh, range(partitions), produced)
    sent, acked = sum(produced.sent.values()), sum(produced.acked.values())
    print(f"\nkill -9 of {victim} ({killed}) under a same-host durable producer and a same-host tailing consumer: "
          f"sent {sent}, acked {acked}; producer errors {[repr(e) for e in prod_errors]}; tailing consumer found "
          f"{sum(tail_result.found.values())}, lost {sum(tail_result.lost.values())}, errors "
          f"{[repr(e) if isinstance(e, BaseException) else e for e in cons_errors][:3]}, replies by source "
          f"{dict(cons_sources)}, {len(ring_maps)} ring mappings; fresh consumer found {sum(fresh_result.found.values())}, lost "
          f"{sum(fresh_result.lost.values())}, duplicated {sum(fresh_result.duplicated.values())}")
    assert killed and acked > 0
    assert fresh_result.ok, fresh_result
    assert not prod_errors, f"the same-host producer did not survive the worker's restart: {prod_errors!r}"
    assert not cons_errors, f"the same-host consumer did not survive the worker's restart: {cons_errors[:3]!r}"
    assert tail_result.ok, tail_result
    assert cons_sources["shm after the restart"] > 0, f"the consumer stopped reading the rings: {cons_sources}"
    if victim == "host":
        assert len(ring_maps) >= 2, "the consumer did not map the fresh shared memory"


def _send_values(b, topic: str, partition: int, values: list[bytes]) -> None:
    with Producer(b.bootstrap, acks="memory", same_host=True) as prod:
        for v in values:
            prod.send(topic, v, partition=partition)
        prod.flush()


def test_a_partition_whose_ring_is_gone_mid_poll_does_not_break_the_others(module_broker):
    """Two partitions with data in one poll, the first answering GONE (its slot now holds
    another partition, as after a topic's slot is reused): the second is still read, nothing
    raises, and the first is mapped again and read within the next recheck."""
    b = module_broker  # the module's broker (tests/conftest.py): a topic of its own
    Admin(b.bootstrap).create_topic("gone", 2)
    for p in (0, 1):  # the rings exist once each owner has taken its partition on
        _send_values(b, "gone", p, [b"warm"])
    with Consumer(b.bootstrap, same_host=True, max_wait_ms=200) as cons:
        cons.assign("gone", [0, 1], start=1)
        first = cons.assigned[("gone", 0)]
        real = first.tail
        first.tail = cons._rings.partition(real.slot, real.topic_id, real.partition + 100)  # a real tail: the row disagrees
        cons._index_tails()
        for p in (0, 1):
            _send_values(b, "gone", p, [b"p%d-%d" % (p, i) for i in range(50)])
        got = {0: [], 1: []}
        deadline = time.monotonic() + 10
        while (len(got[0]) < 50 or len(got[1]) < 50) and time.monotonic() < deadline:
            for r in cons.poll(300):
                got[r.partition].append(r.value)
    assert got[1] == [b"p1-%d" % i for i in range(50)]
    assert got[0] == [b"p0-%d" % i for i in range(50)], len(got[0])
    print(f"\nGONE mid-poll: partition 1 read {len(got[1])} records, partition 0 re-mapped and read {len(got[0])}")


def test_an_error_after_ring_records_in_one_poll_is_raised_next_time_and_no_record_is_skipped(module_broker):
    """Partition 0 read from its ring, partition 1 asked at an offset past its end (the broker
    answers OFFSET_OUT_OF_RANGE): the records of partition 0 handed out in the same poll are
    never skipped; the error comes from the next poll."""
    b = module_broker  # the module's broker (tests/conftest.py): a topic of its own
    Admin(b.bootstrap).create_topic("err", 2)
    _send_values(b, "err", 1, [b"x"])
    _send_values(b, "err", 0, [b"warm"])
    with Consumer(b.bootstrap, same_host=True, max_wait_ms=200) as cons:
        cons.assign("err", [0], start=1)
        cons.assign("err", [1], start=1000)  # far past partition 1's end: the fetch gets an error
        _send_values(b, "err", 0, [b"a-%d" % i for i in range(20)])
        seen, raised, sent_more = [], 0, False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(seen) < 40 or not raised):
            if len(seen) == 20 and not sent_more:
                _send_values(b, "err", 0, [b"a-%d" % i for i in range(20, 40)])
                sent_more = True
                time.sleep(0.3)  # the error reply for partition 1 waits in the socket meanwhile
            try:
                seen += [(r.offset, r.value) for r in cons.poll(300) if r.partition == 0]
            except Exception as exc:  # noqa: BLE001 - the broker's named error, exactly once per ask
                assert type(exc).__name__ == "OffsetOutOfRangeError", exc
                raised += 1
                cons.seek("err", 1, cons.list_offsets("err")[1].high_watermark)
    assert seen == [(1 + i, b"a-%d" % i) for i in range(40)], seen
    assert raised >= 1
    print(f"\nerror after ring records: {len(seen)} records of partition 0 in order, none skipped; "
          f"OffsetOutOfRangeError raised {raised}x")


def test_watch_rings_a_readers_bell_after_appends_to_its_slots_only_and_ends_with_its_connection(make_broker):
    """WATCH (docs/PROTOCOL.md 8d), the wake-up an event-loop reader of the rings sleeps on:
    refused off the Unix socket and for bad fields, then one ring per loop turn that appended
    to a watched slot, none for other slots, none once the watching connection is closed."""
    b = make_broker(workers=1)
    with Admin(b.bootstrap) as a:
        a.create_topic("bells", 2)
    with Producer(b.bootstrap, acks="memory") as prod:  # adopted before anyone watches
        for p in range(2):
            prod.send("bells", b"adopt", partition=p)
        prod.flush()
    with Admin(b.bootstrap) as a:
        d = a.describe_topic("bells")
    slot = {pi.partition: pi.slot for pi in d.partitions}
    name = f"{P.WATCH_BELL_PREFIX}test-{os.getpid()}-{os.urandom(4).hex()}"
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    bell.bind(b"\x00" + name.encode())
    bell.setblocking(False)

    def rings(timeout_s: float) -> int:
        if not select.select([bell], [], [], timeout_s)[0]:
            return 0
        n = 0
        try:
            while True:
                bell.recv(64)
                n += 1
        except BlockingIOError:
            return n

    def watch(conn: Connection, **fields):
        return conn.request(P.Op.WATCH, "bells", header=P.encode(P.WatchRequest(**fields)))

    unix = Connection(d.partitions[0].local_endpoint)
    refused = {}
    for what, fields in {"a name without the prefix": dict(bell="someone-else", slots=[slot[0]]),
                         "a slot past the table": dict(bell=name, slots=[1 << 20]),
                         "an unknown isolation": dict(bell=name, slots=[slot[0]], isolation="eventual")}.items():
        with pytest.raises(InvalidRequestError) as e:
            watch(unix, **fields)
        refused[what] = str(e.value)
    for endpoint in (b.bootstrap, d.partitions[0].endpoint):  # the router, the worker's ZeroMQ socket
        conn = Connection(endpoint)
        try:
            with pytest.raises(InvalidRequestError, match="Unix socket only"):
                watch(conn, bell=name, slots=[slot[0]])
        finally:
            conn.close()
    watch(unix, bell=name, slots=[slot[0]])
    pid = b.pids()["worker-0"]
    with Producer(b.bootstrap, acks="memory", same_host=True) as prod:
        prod.send("bells", b"unwatched", partition=1)
        prod.flush()
        unwatched = rings(0.3)
        prod.send("bells", b"watched", partition=0)
        prod.flush()
        watched = rings(5.0)
        unix.close()  # the watch ends with its connection
        time.sleep(0.2)
        prod.send("bells", b"after", partition=0)
        acked_after = prod.flush()
        after = rings(0.3)
    bell.close()
    print(f"\nWATCH: refused {refused}; rings after a produce to an unwatched slot {unwatched}, to the watched "
          f"slot {watched}, after the watcher's connection closed {after}")
    assert watched >= 1, "the worker did not ring the watched bell"
    assert unwatched == 0 and after == 0
    assert acked_after == 3 and b.pids()["worker-0"] == pid  # every send acked: the worker went on serving


def test_an_asyncio_ring_reader_watches_again_after_its_worker_is_killed(make_broker):
    """A WATCH lives on a Unix connection, and kill -9 of the worker ends it: the asyncio
    consumer describes and watches again (once a second), so the restarted worker rings its bell
    too, and every record produced before and after is read once, in order."""
    b = make_broker(workers=1)
    with Admin(b.bootstrap) as a:
        a.create_topic("rewatch", 1)
    prod = Producer(b.bootstrap, acks="memory", same_host=True, request_timeout_ms=1500, retry_backoff_ms=20)
    prod.send("rewatch", b"adopt", partition=0)
    prod.flush()

    def send(value: bytes) -> None:  # blocks the loop while the broker answers: the bell keeps its rings
        prod.send("rewatch", value, partition=0)
        prod.flush(30_000)

    async def run() -> tuple[list[bytes], list[int]]:
        got: list[bytes] = []
        rings: list[int] = []
        async with AsyncConsumer(b.bootstrap, same_host=True, max_wait_ms=100) as c:
            await c.assign("rewatch", start="latest")

            async def read(n: int) -> None:
                deadline = time.monotonic() + 30
                while len(got) < n and time.monotonic() < deadline:
                    got.extend(r.value for r in await c.poll(200))
                got.extend(r.value for r in await c.poll(300))  # the loop runs: rings waiting are taken

            send(b"before")
            await read(1)
            rings.append(c._bell.rings)
            old = b.pids()
            os.kill(old["worker-0"], signal.SIGKILL)
            wait_restarted(b, old, ["worker-0"])
            send(b"after")
            await read(2)
            deadline = time.monotonic() + 3  # polls meanwhile: the recheck describes and watches again
            while time.monotonic() < deadline:
                got.extend(r.value for r in await c.poll(100))
            rings.append(c._bell.rings)
            send(b"watched again")
            await read(3)
            rings.append(c._bell.rings)
        return got, rings

    try:
        got, rings = asyncio.run(run())
    finally:
        prod.close()
    print(f"\nasyncio ring reader across a worker's kill -9: read {got}; bell rings taken {rings}")
    assert got == [b"before", b"after", b"watched again"]
    assert rings[0] >= 1, "the first worker never rang"
    assert rings[2] > rings[1], "the restarted worker did not ring: the consumer did not watch again"
