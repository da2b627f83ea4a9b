"""``AsyncShareConsumer``: ``ShareConsumer`` (share.py) for asyncio.

    from tailrace.aio import AsyncShareConsumer
    async with AsyncShareConsumer(group="workers", topics=["jobs"]) as c:
        while True:
            for r in await c.poll(timeout_ms=1000):
                try:
                    await handle(r.value)
                    c.acknowledge(r)                              # ACCEPT
                except Exception as exc:
                    c.acknowledge(r, "release", error=str(exc))   # or "reject": to the dead-letter topic

The same options, methods and meaning as ``ShareConsumer``: ``poll`` acquires records (and
carries the acknowledgements made since the last one), ``acknowledge`` and
``acknowledge_offsets`` only note them (no I/O: they are plain methods), ``commit_sync`` sends
them now, ``close`` sends them and leaves the group (what the member still holds goes back at
once), ``implicit=True`` accepts what a poll returned at the next poll. The acknowledgement
bookkeeping is ``ShareConsumer``'s own code (its methods, borrowed), the reply's records are
decoded by share_records.py; only the round trips are here, awaited on an ``AsyncPool``
(aio_connection.py): no thread.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterable

from . import protocol as P
from . import share_protocol as S
from .aio_connection import AsyncPool
from .connection import CONNECT_TIMEOUT_MS
from .security import curve_keys
from .share import PREFETCH_WAIT_MS, ShareConsumer, ShareRecord
from .share_records import share_records

__all__ = ["AsyncShareConsumer"]

_reply = P.decoder(S.ShareFetchReply)


class AsyncShareConsumer:
    """A member of a share group, for asyncio (``ShareConsumer``'s options). Create it inside the
    event loop that uses it."""

    # the acknowledgement bookkeeping, no I/O: ShareConsumer's methods on the same attributes
    subscribe = ShareConsumer.subscribe
    acknowledge = ShareConsumer.acknowledge
    acknowledge_offsets = ShareConsumer.acknowledge_offsets
    _take_acks = ShareConsumer._take_acks

    def __init__(self, bootstrap: str | None = None, *, group: str, topics: Iterable[str] | str = (),
                 max_records: int = 500, max_bytes: int = 8 << 20, implicit: bool = False, timeout_ms: int = 30_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None, prefetch: bool = True):
        self.prefetch = prefetch
        self._ahead: asyncio.Future | None = None  # the fetch asked for ahead (``poll``)
        self._acking: list[asyncio.Future] = []  # SHARE_ACKNOWLEDGE requests in flight
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.member_id = uuid.uuid4().hex
        self.max_records, self.max_bytes, self.implicit, self.timeout_ms = max_records, max_bytes, implicit, timeout_ms
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, keys=curve_keys(key_file, server_key))
        self._acks: dict[tuple[str, int], list] = {}  # as ShareConsumer's
        self._special: list[S.ShareAck] = []
        self._delivered: dict = {}
        self.lock_duration_ms = 0
        self.failed: list[S.AckOutcome] = []  # acknowledgements the broker refused, newest last
        self.closed = False

    async def _request(self, op: int, body: S.ShareFetchRequest, timeout_ms: int):
        r = await self.pool.request(op, self.group, -1, P.encode(body), timeout_ms=timeout_ms)
        reply = _reply.decode(r.header)
        self.lock_duration_ms = reply.lock_duration_ms or self.lock_duration_ms
        bad = [o for o in reply.acks if o.code != P.ErrorCode.OK]
        self.failed.extend(bad)
        return reply, r.body, bad

    async def _settle_acks(self) -> list[S.AckOutcome]:
        bad = []
        acking, self._acking = self._acking, []
        for task in acking:
            bad.extend((await task)[2])
        return bad

    async def commit_sync(self, timeout_ms: int | None = None) -> list[S.AckOutcome]:
        """Send the acknowledgements made so far now and wait for them (and those sent with
        earlier polls); returns those the broker refused."""
        acks = self._take_acks()
        if acks:
            self._acking.append(asyncio.ensure_future(self._request(
                P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=acks), timeout_ms or self.timeout_ms)))
        return await self._settle_acks()

    async def poll(self, timeout_ms: int = 1000) -> list[ShareRecord]:
        """Acknowledge what was acknowledged since the last poll and acquire records: at most
        ``max_records``, waiting up to ``timeout_ms`` for some. With ``prefetch`` (the default)
        as ``ShareConsumer.poll``: the next records are asked for as soon as a poll returned some,
        and a poll's acknowledgements go on their own, not waited for (``commit_sync`` waits)."""
        if self.closed:
            raise RuntimeError("the share consumer is closed")
        acks = self._take_acks()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            if acks:
                self._acking.append(asyncio.ensure_future(self._request(
                    P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=acks), self.timeout_ms)))
            reply, data, _bad = await ahead
        else:
            body = S.ShareFetchRequest(self.member_id, self.topics, acks, self.max_records, self.max_bytes,
                                       max(int(timeout_ms), 0))
            reply, data, _bad = await self._request(P.Op.SHARE_FETCH, body, int(timeout_ms) + self.timeout_ms)
        records, delivered = share_records(reply, data, ShareRecord)
        if self.implicit:
            self._delivered.update(delivered)
        self._acking = [t for t in self._acking if not t.done() or t.exception() is not None]  # refusals: in self.failed
        if records and self.prefetch:
            self._ahead = asyncio.ensure_future(self._request(P.Op.SHARE_FETCH, S.ShareFetchRequest(
                self.member_id, self.topics, [], self.max_records, self.max_bytes, PREFETCH_WAIT_MS),
                PREFETCH_WAIT_MS + self.timeout_ms))
        return records

    async def close(self) -> None:
        """Send what was acknowledged and leave: what this member still holds (a prefetch's too)
        goes back at once."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._ahead is not None:
                ahead, self._ahead = self._ahead, None
                await ahead  # not returned: the leave gives them back
            await self._request(P.Op.SHARE_ACKNOWLEDGE,
                                S.ShareFetchRequest(self.member_id, acks=self._take_acks(), leave=True), self.timeout_ms)
            await self._settle_acks()
        finally:
            self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
