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
decoded by share_records.py, and which broker to fetch from and to acknowledge at (a cluster:
every leader of the subscription, share.py ``Fanout``) is worked out there too; only the round
trips are here, awaited on an ``AsyncPool`` (aio_connection.py): no thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Iterable

from . import protocol as P
from . import share_protocol as S
from .aio_connection import AsyncPool
from .connection import CONNECT_TIMEOUT_MS
from .errors import ConnectionLostError, TailraceError, TimeoutError_
from .security import curve_keys
from .share import CLOSE_WAIT_MS, GRACE_S, PREFETCH_WAIT_MS, Fanout, ShareConsumer, ShareRecord
from .share_records import share_records

__all__ = ["AsyncShareConsumer"]

_reply = P.decoder(S.ShareFetchReply)
_describe = P.decoder(P.DescribeReply)


class AsyncShareConsumer(Fanout):
    """A member of a share group, for asyncio (``ShareConsumer``'s options). Create it inside the
    event loop that uses it."""

    # the acknowledgement bookkeeping, no I/O: ShareConsumer's methods on the same attributes
    subscribe = ShareConsumer.subscribe
    acknowledge = ShareConsumer.acknowledge
    acknowledge_offsets = ShareConsumer.acknowledge_offsets
    _take_acks = ShareConsumer._take_acks
    _records = ShareConsumer._records

    def __init__(self, bootstrap: str | None = None, *, group: str, topics: Iterable[str] | str = (),
                 max_records: int = 500, max_bytes: int = 8 << 20, implicit: bool = False, timeout_ms: int = 30_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None, prefetch: bool = True):
        self.prefetch = prefetch
        self._ahead: dict[str | None, tuple[asyncio.Future, list]] = {}  # broker -> (its fetch out, the acks it carries)
        self._acking: list[tuple] = []  # SHARE_ACKNOWLEDGE requests in flight: (future, broker, acks)
        self._used: set[str | None] = {None}  # the brokers this member fetched from (``close`` leaves at each)
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.member_id = uuid.uuid4().hex
        self.max_records, self.max_bytes, self.implicit, self.timeout_ms = max_records, max_bytes, implicit, timeout_ms
        self.pool = AsyncPool(bootstrap, connect_timeout_ms, keys=curve_keys(key_file, server_key))
        self._fanout_init()
        self._acks: dict[tuple[str, int], list] = {}  # as ShareConsumer's
        self._special: list[S.ShareAck] = []
        self._delivered: dict = {}
        self.lock_duration_ms = 0
        self.failed: list[S.AckOutcome] = []  # acknowledgements the broker refused, newest last
        self.closed = False

    async def _request(self, ep: str | None, op: int, body: S.ShareFetchRequest, timeout_ms: int):
        r = await self.pool.request(op, self.group, -1, P.encode(body), timeout_ms=timeout_ms, endpoint=ep)
        reply = _reply.decode(r.header)
        self.lock_duration_ms = reply.lock_duration_ms or self.lock_duration_ms
        bad = [o for o in reply.acks if o.code != P.ErrorCode.OK]
        self.failed.extend(bad)
        if any(o.code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER for o in bad):
            self._meta_at = -1.0
        self._delivered_by(reply, ep)
        return reply, r.body, bad

    def _passes(self, exc: BaseException, ep: str | None, acks: list) -> list | None:
        """A request's failure in a cluster: a broker gone silent (its acknowledgements reported,
        share.py ``_unknown``) or refusing for now (sent again); None: raised."""
        if not self.cluster:
            return None
        if isinstance(exc, (TimeoutError_, ConnectionLostError)):
            return self._unknown(ep, acks)
        if isinstance(exc, TailraceError) and getattr(exc, "code", None) in P.RETRIABLE:
            self._requeue(acks)
            return []
        return None

    async def _refresh(self) -> None:
        if not self.topics:
            self._meta_at = time.monotonic()
            return
        eps = [None] + sorted(e for e in self._used if e is not None)
        for i, ep in enumerate(eps):
            try:
                replies = [_describe.decode((await self.pool.request(P.Op.DESCRIBE_TOPIC, t, -1, timeout_ms=self.timeout_ms,
                                                                     endpoint=ep)).header) for t in self.topics]
            except (TimeoutError_, ConnectionLostError):
                if i + 1 < len(eps):
                    continue
                raise
            self._take_meta(replies, self.pool.router_endpoint if ep is None else "")
            if ep is not None:
                self._leader = {k: (ep if v is None else (None if v == self.pool.router_endpoint else v))
                                for k, v in self._leader.items()}
            return

    def _fetch(self, ep: str | None, acks: list, wait_ms: int) -> None:
        body = S.ShareFetchRequest(self.member_id, self.topics, acks, self.max_records, self.max_bytes, wait_ms)
        self._ahead[ep] = (asyncio.ensure_future(self._request(ep, P.Op.SHARE_FETCH, body, wait_ms + self.timeout_ms)), acks)
        self._used.add(ep)

    def _acknowledge(self, ep: str | None, acks: list, leave: bool = False, timeout_ms: int | None = None) -> None:
        body = S.ShareFetchRequest(self.member_id, acks=acks, leave=leave)
        self._acking.append((asyncio.ensure_future(self._request(ep, P.Op.SHARE_ACKNOWLEDGE, body, timeout_ms or self.timeout_ms)),
                             ep, acks))

    async def _settle_acks(self) -> list[S.AckOutcome]:
        bad = []
        acking, self._acking = self._acking, []
        for task, ep, acks in acking:
            try:
                bad.extend((await task)[2])
            except Exception as exc:  # noqa: BLE001 - raised unless it passes
                passed = self._passes(exc, ep, acks)
                if passed is None:
                    raise
                bad.extend(passed)
        return bad

    async def commit_sync(self, timeout_ms: int | None = None) -> list[S.AckOutcome]:
        """Send the acknowledgements made so far now and wait for them (and those sent with
        earlier polls); returns those the broker refused."""
        await self.pool.connected()
        for ep, acks in self._split(self._take_acks()).items():
            self._acknowledge(ep, acks, timeout_ms=timeout_ms)
        return await self._settle_acks()

    async def poll(self, timeout_ms: int = 1000) -> list[ShareRecord]:
        """Acknowledge what was acknowledged since the last poll and acquire records: at most
        ``max_records``, waiting up to ``timeout_ms`` for some. With ``prefetch`` (the default)
        as ``ShareConsumer.poll``: the next records are asked for as soon as a poll returned some,
        and a poll's acknowledgements go on their own, not waited for (``commit_sync`` waits)."""
        if self.closed:
            raise RuntimeError("the share consumer is closed")
        await self.pool.connected()
        if self._meta_due():
            await self._refresh()
        wait = max(int(timeout_ms), 0)
        by_ep = self._split(self._take_acks())
        eps = self._endpoints()
        for ep in eps:
            acks = by_ep.pop(ep, [])
            if ep in self._ahead:
                if acks:
                    self._acknowledge(ep, acks)
            else:
                self._fetch(ep, acks, wait)
        for ep, acks in by_ep.items():  # a partition whose leader changed since: to the broker that gave them
            self._acknowledge(ep, acks)
        records = await self._gather(wait)
        kept = []
        for entry in self._acking:  # refusals are in self.failed; a cluster's broker gone: there too
            task = entry[0]
            if not task.done() or (task.exception() is not None and self._passes(task.exception(), entry[1], entry[2]) is None):
                kept.append(entry)  # still out, or raised by commit_sync or close
        self._acking = kept
        if records and self.prefetch:
            for ep in eps:
                if ep not in self._ahead:
                    self._fetch(ep, [], PREFETCH_WAIT_MS)
        return records

    async def _gather(self, timeout_ms: int) -> list[ShareRecord]:
        """As ``ShareConsumer._gather``: the records of the first fetch answered with some."""
        single = len(self._ahead) == 1 and not self.cluster
        end = time.monotonic() + timeout_ms / 1000 + GRACE_S
        while self._ahead:
            futures = {f: ep for ep, (f, _acks) in self._ahead.items()}
            done, _ = await asyncio.wait(futures, timeout=None if single else max(end - time.monotonic(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                return []
            records = []
            for f in done:
                _f, acks = self._ahead.pop(futures[f])
                try:
                    reply, data, _bad = f.result()
                except Exception as exc:  # noqa: BLE001 - raised unless it passes
                    if self._passes(exc, futures[f], acks) is None:
                        raise
                    continue
                records += self._records(reply, data)
            if records:
                return records
        return []

    async def close(self) -> None:
        """Send what was acknowledged and leave: what this member still holds (a prefetch's too)
        goes back at once, at every broker it fetched from."""
        if self.closed:
            return
        self.closed = True
        try:
            for ep, (f, acks) in list(self._ahead.items()):
                try:
                    await f  # not returned: the leave gives them back
                except Exception as exc:  # noqa: BLE001 - raised unless it passes
                    if self._passes(exc, ep, acks) is None:
                        raise
            self._ahead.clear()
            by_ep = self._split(self._take_acks())
            wait = min(self.timeout_ms, CLOSE_WAIT_MS) if self.cluster else self.timeout_ms
            for ep in self._used | set(by_ep):
                self._acknowledge(ep, by_ep.get(ep, []), leave=True, timeout_ms=wait)
            await self._settle_acks()
        finally:
            self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
