"""The asyncio client (tailrace.client.aio) against a real broker: many coroutines sharing one
producer, cancellation, uvloop, the same-host path, and the client errors of both clients
through the same assertions."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import uvloop

from tailrace import Admin
from tailrace.bench.launcher import free_port
from tailrace.client.aio import AsyncAdmin, AsyncConsumer, AsyncProducer
from tailrace.client.errors import (BrokerUnavailableError, InvalidRequestError, OffsetOutOfRangeError,
                                    UnknownTopicError)

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.fixture
def broker(module_broker):
    """One broker for the whole module (tests/conftest.py): each test's topics are named after
    its parameters, so no two tests share one."""
    return module_broker


async def _read_all(bootstrap: str, topic: str, expect: int, same_host: bool = False, timeout_s: float = 30) -> list:
    async with AsyncConsumer(bootstrap, max_wait_ms=100, same_host=same_host) as c:
        await c.assign(topic, start="earliest")
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            out += await c.poll(200)
        extra = await c.poll(300)  # nothing more than expected
        return out + extra


@pytest.mark.parametrize("loop,same_host", [("asyncio", False), ("uvloop", False), ("uvloop", True)])
def test_many_coroutines_share_one_producer_each_gets_its_own_offset_and_sends_are_batched(broker, loop, same_host):
    topic = f"many-{loop}-{same_host}"
    Admin(broker.bootstrap).create_topic(topic, 2)
    coroutines, each = 64, 40
    sent_requests = []

    async def main():
        async with AsyncProducer(broker.bootstrap, acks="durable", linger_ms=0, same_host=same_host) as p:
            send = p.pool.send

            def counting(*a, **k):
                sent_requests.append(a[1])
                return send(*a, **k)

            p.pool.send = counting

            async def one(j: int) -> list:
                acks = []
                for i in range(each):
                    acks.append(await p.send(topic, b"%d-%d" % (j, i), partition=j % 2))
                return acks

            results = await asyncio.gather(*(one(j) for j in range(coroutines)))
        records = await _read_all(broker.bootstrap, topic, coroutines * each, same_host)
        return results, records

    results, records = LOOPS[loop](main())
    stored = {(r.partition, r.offset): r.value for r in records}
    assert len(records) == coroutines * each == len(stored), "a record lost or stored twice"
    for j, acks in enumerate(results):
        for i, ack in enumerate(acks):
            assert ack.partition == j % 2 and stored[(ack.partition, ack.offset)] == b"%d-%d" % (j, i)
        assert [a.offset for a in acks] == sorted(a.offset for a in acks), "one coroutine's records out of order"
    produce_requests = sent_requests.count(1)  # Op.PRODUCE
    print(f"\n{coroutines} coroutines x {each} durable sends ({loop}, same_host={same_host}): "
          f"{produce_requests} produce requests for {coroutines * each} records")
    assert produce_requests <= coroutines * each / 4, "sends to one partition were not batched together"


def test_cancelling_pending_sends_at_random_leaves_each_message_acked_once_or_not_stored(broker):
    Admin(broker.bootstrap).create_topic("cancel", 2)
    rng = random.Random(7)
    total = 1000

    async def main():
        async with AsyncProducer(broker.bootstrap, acks="durable", linger_ms=5, batch_records=64) as p:
            await p.partitions_for("cancel")
            waits, cancelled = [], set()
            for wave in range(10):  # sends keep coming while earlier ones are lingering, sealed, in flight, acked
                waits += [p.send("cancel", b"m%04d" % i) for i in range(wave * 100, wave * 100 + 100)]
                await asyncio.sleep(rng.uniform(0, 0.006))
                for i in rng.sample(range(len(waits)), 60):
                    if waits[i].cancel():
                        cancelled.add(i)
            outcome = await asyncio.gather(*waits, return_exceptions=True)
            await p.flush()
            # the producer still works for everyone after all that
            after = await asyncio.gather(*(p.send("cancel", b"after-%d" % i) for i in range(50)))
        return outcome, cancelled, after

    outcome, cancelled, after = asyncio.run(main())
    records = asyncio.run(_read_all(broker.bootstrap, "cancel", total + 50 - len(cancelled), timeout_s=10))
    values = [r.value for r in records]
    at = {(r.partition, r.offset): r.value for r in records}
    assert len(values) == len(set(values)), "a message stored twice"
    acked = [i for i, o in enumerate(outcome) if not isinstance(o, BaseException)]
    assert set(acked) | cancelled == set(range(total)), "a send neither acked nor cancelled"
    for i in acked:
        assert at[(outcome[i].partition, outcome[i].offset)] == b"m%04d" % i, f"message {i} not where its ack says"
    stored_cancelled = sum(1 for i in cancelled if b"m%04d" % i in set(values))
    assert all(at[(a.partition, a.offset)] == b"after-%d" % i for i, a in enumerate(after))
    print(f"\n{total} sends, {len(cancelled)} cancelled at random: {len(acked)} acked (each stored once where its "
          f"ack says), {stored_cancelled} cancelled ones were already in a batch and stored once, "
          f"{len(cancelled) - stored_cancelled} never stored")
    assert len(cancelled) > 100 and len(cancelled) - stored_cancelled > 0


def test_client_errors_are_the_same_exceptions_from_both_clients(broker, client):
    topic = f"errs-{client.name}"
    Admin(broker.bootstrap).create_topic(topic, 1)
    with client.Producer(broker.bootstrap, acks="memory") as prod:
        with pytest.raises(UnknownTopicError):
            prod.send("no-such-topic", b"x")
            prod.flush()
        with pytest.raises(InvalidRequestError):
            prod.send("t" * 300, b"x", partition=0)
            prod.flush()
        prod.send(topic, b"fine", partition=0)  # and it still works
        assert prod.flush() >= 1
    with client.Consumer(broker.bootstrap, max_wait_ms=50) as cons:
        cons.assign(topic, start=10**6)
        with pytest.raises(OffsetOutOfRangeError) as err:
            cons.poll(2000)
        assert err.value.details["log_start_offset"] == 0 and err.value.details["high_watermark"] == 1
        cons.seek(topic, 0, 0)
        assert [r.value for r in cons.poll(2000)] == [b"fine"]
    with pytest.raises(UnknownTopicError):
        with client.Admin(broker.bootstrap) as a:
            a.describe_topic("no-such-topic")
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailableError):
        with client.Admin(f"127.0.0.1:{free_port()}", connect_timeout_ms=500) as a:
            a.list_topics()
    assert time.monotonic() - t0 < 5


def test_async_admin_and_consumer_columns(broker):
    async def main():
        async with AsyncAdmin(broker.bootstrap) as a:
            info = await a.create_topic("cols", 3)
            names = [t.name for t in await a.list_topics()]
            status = await a.status()
        async with AsyncProducer(broker.bootstrap, acks="memory", partitioner="key_hash") as p:
            acks = await p.send_batch("cols", [b"v%d" % i for i in range(300)], keys=[b"k%d" % (i % 7) for i in range(300)])
        async with AsyncConsumer(broker.bootstrap, max_wait_ms=100) as c:
            await c.assign("cols", start="earliest")
            got = 0
            while got < 300:
                for _t, _p, cols in await c.poll_columns(500):
                    got += len(cols)
            positions = sum(c.position("cols", p) for p in range(3))
        return info, names, status, acks, got, positions

    info, names, status, acks, got, positions = asyncio.run(main())
    assert info.partitions == 3 and "cols" in names and status["topics"] >= 1
    assert all(a.offset >= 0 for a in acks) and got == 300 == positions


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_clients_opened_and_closed_one_after_another_on_one_loop_each_answer_at_once(broker, loop):
    """File descriptor numbers come back: a socket the loop watches must be unwatched before it
    closes, or the next socket given that number is never polled and its replies wait for the
    request timeout. Thirty clients in turn, each a handshake, a describe and direct produces."""
    topic = f"turns-{loop}"
    Admin(broker.bootstrap).create_topic(topic, 2)

    async def main() -> list[float]:
        took = []
        for i in range(30):
            t0 = time.monotonic()
            async with AsyncAdmin(broker.bootstrap, timeout_ms=4000) as a:
                await a.list_topics()
            async with AsyncProducer(broker.bootstrap, acks="memory", linger_ms=0, request_timeout_ms=4000) as p:
                await asyncio.gather(*(p.send(topic, b"%d" % i, partition=q) for q in (0, 1)))
            took.append(time.monotonic() - t0)
        return took

    took = LOOPS[loop](main())
    print(f"\n30 clients in turn: median {sorted(took)[15] * 1000:.1f} ms, slowest {max(took) * 1000:.1f} ms")
    assert max(took) < 2.0, took
