"""A producer's batches in flight: what a reply means for each (ack, retry, sequence reorder,
failure), the request timeouts and lost connections, and the records' futures.

``Replies`` is ``ProducerCore``'s half that answers (client/producer.py); its state (``_inflight``,
``_inflight_per``, ``_retry``, the counters) is set up there. An in-flight request is one
``_InFlight`` batch, or a PRODUCE_MULTI's list of them (docs/PROTOCOL.md 4.1a), each of whose
outcomes is handled as a single reply is.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from . import protocol as P
from .errors import ConnectionLostError, TailraceError, TimeoutError_, error_for
from .records import IDEMPOTENCE, IDEMPOTENCE_AT

TIMEOUT_SCAN_S = 0.05  # how often in-flight batches are checked for request timeouts


class Ack(NamedTuple):
    """Where a record was stored: what an asyncio ``send`` resolves with (aio.py)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # the broker's append time, ms since the epoch


@dataclass
class _InFlight:
    topic: str
    partition: int
    frame: bytes
    count: int
    sent: float
    first_sent: float = 0.0
    attempts: int = 1
    via: str | None = None  # endpoint it was sent to (None: the router)
    waiters: list | None = None  # the records' futures (asyncio producer)
    not_before: float = 0.0  # a retry waits for its backoff
    header: bytes | None = None  # its own produce header (None: the producer's)
    barrier: bool = False  # acks="none"'s closing round trip: a copy of a batch already counted
    alone: bool = False  # answered NOT_OWNER: resent on its own (its group's owner is stale)
    gaps: int = 0  # its partition's answers so far (stored or put back for a retry) when it was sent (``_gaps``)


_produce_reply = P.decoder(P.ProduceReply)
_multi_reply = P.decoder(P.ProduceMultiReply)


def _batches(entry) -> list | tuple:
    """The batches of an in-flight request: one, or a PRODUCE_MULTI's list."""
    return entry if type(entry) is list else (entry,)


def _code_name(code: int) -> str:
    try:
        return P.ErrorCode(code).name
    except ValueError:
        return f"code {code}"


class Replies:
    """Mixin of ``ProducerCore``: replies, timeouts and lost connections."""

    def _on_reply(self, r) -> None:
        b = self._inflight.pop(r.request_id, None)
        if b is None:
            return
        if type(b) is list:  # a PRODUCE_MULTI: each partition's outcome on its own terms
            if r.code == P.ErrorCode.OK:
                rep = _multi_reply.decode(r.header)
                self.throttle_ms += rep.throttle_ms
                for one, outcome in zip(b, rep.results):
                    self._answered(one, r.via, outcome.code, outcome, outcome.message)
            else:  # the request as a whole was refused
                for one in b:
                    self._answered(one, r.via, r.code, None, r)
            return
        rep = None
        if r.code == P.ErrorCode.OK and not b.barrier:
            rep = _produce_reply.decode(r.header)
            self.throttle_ms += rep.throttle_ms
        self._answered(b, r.via, r.code, rep, r)

    def _answered(self, b: _InFlight, via: str, code: int, rep, why) -> None:
        """One batch's answer: ``rep`` (a ProduceReply, or a PRODUCE_MULTI outcome, with the same
        fields) when stored; else ``why``, the reply to raise from or the outcome's message."""
        tp = (b.topic, b.partition)
        self._inflight_per[tp] -= 1
        self.routes.answered(b.topic, b.partition, via, code)
        if code == P.ErrorCode.OK:
            self._gaps[tp] = self._gaps.get(tp, 0) + 1
            self.acked_records += b.count
            if b.barrier:
                return  # its records were counted when they went one-way
            self._buffered_bytes -= len(b.frame)
            if self.on_ack is not None or b.waiters:
                if self.on_ack is not None:
                    self.on_ack(b.topic, b.partition, rep.base_offset, rep.record_count)
                if b.waiters:
                    self._resolve(b, rep)
        elif code in P.RETRIABLE and time.monotonic() - b.first_sent < self.delivery_timeout_s:
            self._gaps[tp] = self._gaps.get(tp, 0) + 1
            b.alone = b.alone or code == P.ErrorCode.NOT_OWNER
            b.not_before = time.monotonic() + self.retry_backoff_s
            self._retry.setdefault(tp, deque()).appendleft(b)
        elif code == P.ErrorCode.OUT_OF_ORDER_SEQUENCE and b.barrier:
            # acks="none"'s closing round trip, refused because one-way batches before it were
            # lost (a process killed with them in flight: acks="none" promises nothing for them).
            # The answer still says the broker has handled everything sent before it on this
            # path, which is all the round trip is for: the flush is closed, with no error.
            return
        elif (code == P.ErrorCode.OUT_OF_ORDER_SEQUENCE
              and (self._inflight_per[tp] or self._retry.get(tp) or b.gaps != self._gaps.get(tp, 0))
              and time.monotonic() - b.first_sent < self.delivery_timeout_s):
            # a batch before it is still in flight or waiting to be resent, or was stored or put
            # back for a retry after this one went out (more than one in flight per partition:
            # the broker saw this one first, e.g. the one before it went through the router while
            # the partition was being adopted, or was refused and resent): it goes again, in
            # sequence order, as Kafka's does. Nothing answered since it went out: a real gap.
            b.not_before = time.monotonic() + self.retry_backoff_s
            q = self._retry.setdefault(tp, deque())
            seq = IDEMPOTENCE.unpack_from(b.frame, IDEMPOTENCE_AT)[1]
            k = sum(1 for o in q if IDEMPOTENCE.unpack_from(o.frame, IDEMPOTENCE_AT)[1] < seq)
            q.insert(k, b)
        elif isinstance(why, str):
            self._fail(b, error_for(code, f"{_code_name(code)}: {why}"))
        else:
            try:
                why.raise_for_code()
            except TailraceError as exc:
                self._fail(b, exc)

    def _resolve(self, b: _InFlight, rep: P.ProduceReply | None) -> None:
        """Hand each record's future its ``Ack`` (offsets -1 for acks="none": nothing is told)."""
        base = -1 if rep is None else rep.base_offset
        ts = -1 if rep is None else rep.append_time_us // 1000
        single = len(b.waiters) == 1 and b.count > 1  # a send_batch: its one future gets the first offset
        for i, w in enumerate(b.waiters):
            if w is not None and not w.done():
                w.set_result(Ack(b.topic, b.partition, base if (single or base < 0) else base + i, ts))

    def _fail(self, b: _InFlight, exc: TailraceError) -> None:
        """A batch failed for good: its futures raise ``exc``; without futures, ``flush`` does."""
        if not b.barrier:
            self._buffered_bytes -= len(b.frame)
            if self.producer_id >= 0 and b.count:
                self._restart_sequence((b.topic, b.partition))
        told = False
        for w in b.waiters or ():
            if w is not None and not w.done():
                w.set_exception(exc)
                told = True
        if not told:
            self.errors.append(exc)

    def _scan_timeouts(self) -> None:
        """Resend (idempotent) or fail the batches whose reply is overdue; at most every
        TIMEOUT_SCAN_S."""
        now = time.monotonic()
        if now < self._timeouts_at:
            return
        self._timeouts_at = now + TIMEOUT_SCAN_S
        for rid, entry in list(self._inflight.items()):
            for b in _batches(entry):
                if now - b.sent > self.request_timeout_s:
                    self._unknown_fate(rid, b, now, TimeoutError_(
                        f"no ack for {b.count} records to {b.topic}/{b.partition} in {self.delivery_timeout_s}s"))

    def _connection_lost(self, via: str | None) -> None:
        """The connection to ``via`` (None: the router) closed: its batches in flight will never
        be answered; resend (idempotent) or fail them now (``Pool.on_lost``)."""
        now = time.monotonic()
        for rid, entry in list(self._inflight.items()):
            for b in _batches(entry):
                if b.via != via:
                    break
                self._unknown_fate(rid, b, now, ConnectionLostError(
                    f"the connection to {via or 'the router'} closed before {b.count} records to "
                    f"{b.topic}/{b.partition} were acknowledged: they may or may not be stored"))

    def _unknown_fate(self, rid: int, b: _InFlight, now: float, exc: TailraceError) -> None:
        """Batch ``rid`` will get no reply (overdue, or its connection closed): resend it with the
        same bytes if this producer is idempotent and within ``delivery_timeout_ms``, else fail it."""
        self._inflight.pop(rid, None)  # (a PRODUCE_MULTI's batches come here one by one)
        tp = (b.topic, b.partition)
        self._inflight_per[tp] -= 1
        if b.via is not None:
            self.routes.demote(b.topic, b.partition)  # the worker may be gone: via the router
        if self.producer_id >= 0 and now - b.first_sent < self.delivery_timeout_s:
            # only an idempotent producer may resend a batch whose fate is unknown
            self.retries += 1
            b.not_before = now  # (no backoff: a reconnect queues it until the connection is up)
            self._retry.setdefault(tp, deque()).appendleft(b)  # same bytes: the broker dedups
        else:
            self._fail(b, exc)

    def _take_errors(self) -> None:
        """Raise the first error no future was told of (``flush``)."""
        if self.errors:
            first = self.errors[0]
            self.errors = []
            raise first
