"""The asyncio client behind the blocking client's API, so behaviour tests run against both
through the same assertions (the ``client`` fixture in conftest.py).

Each object owns a private event loop and runs it only inside its own calls, the way a blocking
call runs the blocking client's I/O: ``send`` queues a record on the AsyncProducer (whose
future is kept) and gives the loop one turn; ``poll(t)`` gives it ``t``; ``flush`` awaits
``AsyncProducer.flush`` and then raises the first error any kept future ended with (the
blocking ``flush`` raises the first permanent error). Nothing here decides anything: the async
client does all of it.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tailrace import Admin, Consumer, Producer
from tailrace.client.aio import AsyncAdmin, AsyncConsumer, AsyncProducer


class _OnLoop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def _close_loop(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


async def _call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


class SyncProducer(_OnLoop):
    def __init__(self, bootstrap, **options):
        super().__init__()
        self.inner = AsyncProducer(bootstrap, **options)
        self._futures: list[asyncio.Future] = []

    def __getattr__(self, name):  # pool, routes, in_flight, acked_records, producer_id...
        return getattr(self.inner, name)

    def _queue(self, fn, *args, **kwargs) -> None:
        fut = self.run(_call(fn, *args, **kwargs))
        fut.add_done_callback(self._done)
        self._futures.append(fut)
        self.run(asyncio.sleep(0))

    def _done(self, fut) -> None:
        if fut.cancelled() or fut.exception() is None:
            try:
                self._futures.remove(fut)
            except ValueError:
                pass

    def send(self, topic, value, key=None, headers=None, timestamp_ms=None, partition=None) -> None:
        self._queue(self.inner.send, topic, value, key, headers=headers, timestamp_ms=timestamp_ms, partition=partition)

    def send_batch(self, topic, values, keys=None, partition=None, headers=None, timestamps_ms=None) -> None:
        self._queue(self.inner.send_batch, topic, values, keys, partition, headers=headers, timestamps_ms=timestamps_ms)

    def send_buffers(self, topic, values, value_offsets, partition=None, keys=None, key_offsets=None) -> None:
        if partition is None and topic not in self.inner.routes.partitions_of:
            self.run(self.inner.partitions_for(topic))
        self._queue(self.inner.send_buffers, topic, values, value_offsets, partition, keys, key_offsets)

    def partitions_for(self, topic) -> int:
        return self.run(self.inner.partitions_for(topic))

    def poll(self, timeout_ms: int = 0) -> None:
        self.run(asyncio.sleep(timeout_ms / 1000))

    def flush(self, timeout_ms: int = 60_000) -> int:
        acked = self.run(self.inner.flush(timeout_ms))
        failed = [f for f in self._futures if f.done() and not f.cancelled() and f.exception() is not None]
        self._futures = [f for f in self._futures if not f.done()]
        if failed:
            raise failed[0].exception()
        return acked

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.run(self.inner.close())
            self._close_loop()


class SyncConsumer(_OnLoop):
    def __init__(self, bootstrap, **options):
        super().__init__()
        self.inner = AsyncConsumer(bootstrap, **options)

    def __getattr__(self, name):  # assigned, last_reply, routes, pool...
        return getattr(self.inner, name)

    def assign(self, topic, partitions=None, start="earliest") -> None:
        self.run(self.inner.assign(topic, partitions, start))

    def list_offsets(self, topic):
        return self.run(self.inner.list_offsets(topic))

    def seek(self, topic, partition, offset) -> None:
        self.inner.seek(topic, partition, offset)

    def position(self, topic, partition) -> int:
        return self.inner.position(topic, partition)

    def poll_raw(self, timeout_ms: int = 1000):
        return self.run(self.inner.poll_raw(timeout_ms))

    def poll_columns(self, timeout_ms: int = 1000):
        return self.run(self.inner.poll_columns(timeout_ms))

    def poll(self, timeout_ms: int = 1000):
        return self.run(self.inner.poll(timeout_ms))

    def commit(self, offsets=None):
        return self.run(self.inner.commit(offsets))

    def committed(self, partitions=None):
        return self.run(self.inner.committed(partitions))

    def close(self) -> None:
        self.run(self.inner.close())
        self._close_loop()


class SyncAdmin(_OnLoop):
    def __init__(self, bootstrap, **options):
        super().__init__()
        self.inner = AsyncAdmin(bootstrap, **options)

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr
        return lambda *a, **k: self.run(attr(*a, **k))

    def close(self) -> None:
        self.run(self.inner.close())
        self._close_loop()


BLOCKING = SimpleNamespace(name="blocking", Producer=Producer, Consumer=Consumer, Admin=Admin)
ASYNC = SimpleNamespace(name="async", Producer=SyncProducer, Consumer=SyncConsumer, Admin=SyncAdmin)
CLIENTS = {"blocking": BLOCKING, "async": ASYNC}
