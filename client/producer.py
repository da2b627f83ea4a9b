"""Producer: per-partition batching with a linger time, partitioners, acks none/memory/durable.

Ordering: by default one batch per partition is in flight (``max_in_flight_per_partition=1``),
so a batch retried after a retriable error (BACKPRESSURE, NOT_READY, NOT_OWNER, a lost reply)
can never be overtaken by a later one: records of a partition land in the order they were sent,
as with Kafka's ``max.in.flight.requests.per.connection=1``. Raising it trades that for
throughput.

Idempotence: every batch carries this producer's random 63-bit id and a per-partition sequence
(the count of records sent to that partition before it). A batch is retried with the same bytes
when its reply does not come within ``request_timeout_ms`` (a broker process may have died with
it), until ``delivery_timeout_ms``; the broker recognises a batch it already stored and answers
with the original offsets, so a retry never duplicates. A batch whose connection closed before
its reply (client/connection.py: the router or the worker stopped, or dropped the connection over
its frame limit) is resent the same way at once, not after ``request_timeout_ms``; without
idempotence it fails at once with ``ConnectionLostError`` (its fate is unknown).

Driving it: there is no background thread. ``send``/``send_batch`` queue records and send what
is ready; ``poll()`` processes replies and lingering batches; ``flush()`` sends everything and
waits for every acknowledgement, raising the first permanent error.

Memory: what is queued or unacknowledged is held here, at most ``buffer_memory`` bytes (Kafka's
``buffer.memory``, 32 MiB); a send that would go over it waits for acknowledgements to make room,
at most ``max_block_ms`` (Kafka's ``max.block.ms``, 60 s), then raises ``TimeoutError_``.

Size: a record that cannot fit in a batch the broker takes (its ``max_batch_bytes``, from
DESCRIBE_TOPIC; 1 MiB until heard) raises ``BatchTooLargeError`` at ``send``, and a batch over it
fails the same way before it is sent: the broker drops a connection whose message part is larger
than its frame limit without a word, so such a batch must never reach the wire.

Some facts about acks="none" and closing (docs/GUARANTEES.md section 1):

- ZeroMQ queues a one-way send in the socket and returns; closing the socket with linger 0
  discards what is still queued, and even with a linger, a PUSH or DEALER closed while its peer is
  backed up loses its last few hundred messages in about one run in three. Linger is no proof.
- The broker handles one connection's requests in order: one TCP (or Unix) stream into the
  router, one DEALER per worker from the router to the owner, and a worker loop that takes them
  as they come. A reply to a request therefore says that every request sent before it on the same
  path to the same partition's owner has been handled (appended, or refused).

What this means for us: ``flush()`` (and ``close()``) with acks="none" ends with one round trip
per partition and path that took one-way batches since the last flush: the last batch sent there,
sent again with acks="memory". It carries the same producer id and base sequence, so the broker
answers it with the original offsets without storing it twice (or stores it if it was lost);
its answer means the whole run before it was taken. A producer with acks="none" therefore always
stamps its batches with a producer id, even with ``idempotent=False``.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Callable, Sequence

import numpy as np

from . import codecs
from . import protocol as P
from .accumulator import DEFAULT_MAX_BATCH_BYTES, Accumulator, _Pending, batch_times, header_bytes, headers_sample_bytes
from .connection import CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, Pool
from .delayed import DelayBuffer, DelayedProduceReply, DelayedProduceRequest, delayed_request, due_ms, reply_decoder
from .security import curve_keys
from .routes import BlockingRoutes
from .errors import BatchTooLargeError, TailraceError, TimeoutError_, error_for
from .sections import HeaderArrays
# (every partitioner name is importable from here too, where it was defined before partitioners.py)
from .partitioners import (PARTITIONERS, STICKY_RECORDS, Partitioner, hash_partition, hash_partitions, key_hash,
                           round_robin, sticky)
from .inflight import TIMEOUT_SCAN_S, Ack, Replies, _InFlight  # (Ack and TIMEOUT_SCAN_S were defined here)

BUFFER_MEMORY = 32 << 20  # Kafka's buffer.memory default
MAX_BLOCK_MS = 60_000  # Kafka's max.block.ms default
DELAYED_GROUP_BYTES = 256 << 10  # delayed records of one partition and time sent once this many are queued


def _requests_of(batches: list, cap: int):
    """``batches`` (in send order) as the batch lists of successive requests: at most one batch
    of a partition in each (a PRODUCE_MULTI lists a partition once; with more than one in flight
    per partition, a partition's next batch goes in the next request, after it on the same
    connection) and at most ``cap`` batches."""
    rounds: list[list] = []
    nth: dict[int, int] = {}
    for b in batches:
        k = nth.get(b.partition, 0)
        nth[b.partition] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(b)
    for one in rounds:
        for i in range(0, len(one), cap):
            yield one[i:i + cap]


class ProducerCore(Accumulator, Replies):
    """Everything a producer decides, without I/O: batching, partitioning, sequence numbers,
    what to send next, what a reply means (ack, retry, error), request timeouts.

    Its subclasses give it the I/O: ``self.pool`` (``send(endpoint, op, topic, partition,
    header, body) -> request id``, never blocking), ``self.routes`` (routes.Routes) and
    ``_route(topic, partition)``; they hand every reply to ``_on_reply`` and call ``_advance``
    when time passes. ``Producer`` below does it with blocking polls, ``aio.AsyncProducer``
    from an asyncio event loop: the same batches, sequences and retries either way.

    The queueing half (partition choice, pending records, sealing, sequence numbers, the
    ``buffer_memory`` count) is ``Accumulator`` (accumulator.py); its state is declared here.
    """

    def __init__(
        self,
        *,
        acks: str = "memory",
        linger_ms: float = 5.0,
        batch_records: int = 4096,
        batch_bytes: int = 512 * 1024,
        partitioner: str | Partitioner = "key_hash",
        max_in_flight_per_partition: int = 1,
        request_timeout_ms: int = 5_000,
        delivery_timeout_ms: int = 120_000,
        idempotent: bool = True,
        retry_backoff_ms: float = 2.0,
        on_ack: Callable[[str, int, int, int], None] | None = None,
        buffer_memory: int = BUFFER_MEMORY,
        max_block_ms: float = MAX_BLOCK_MS,
        multi_partition: bool = True,
        compression: str | None = None,
        compression_level: int | None = None,
    ):
        self.acks = P.ACKS_BY_NAME[acks] if isinstance(acks, str) else P.Acks(acks)
        # each batch's record section compressed with this codec (client/codecs.py: Kafka's
        # gzip, snappy, lz4, zstd; None / "none": not), at this level (None: the codec's default)
        self.compression = codecs.codec_id(compression)  # ValueError names the choices
        self.compression_level = codecs.check_level(self.compression, compression_level)
        self.linger_s = linger_ms / 1000
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.partitioner = PARTITIONERS[partitioner] if isinstance(partitioner, str) else partitioner
        self.max_in_flight = max_in_flight_per_partition
        self.request_timeout_s = request_timeout_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        # acks="none" always has an id: its closing round trip resends a batch (see the docstring)
        self.producer_id = random.getrandbits(62) if idempotent or self.acks == P.Acks.NONE else -1
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_ms / 1000
        self._buffered_bytes = 0  # records queued + batches sealed, retried or unacknowledged
        # acks="none": (topic, p) -> (last frame sent one-way, endpoints it went through since the
        # last flush); flush sends that frame again with acks="memory" through each (the docstring)
        self._oneway: dict[tuple[str, int], tuple[bytes, set]] = {}
        self._barrier_header = P.encode(P.ProduceRequest(acks=int(P.Acks.MEMORY), timeout_ms=request_timeout_ms))
        self._seq: dict[tuple[str, int], int] = {}  # (topic, p) -> next base sequence
        self._pids: dict[tuple[str, int], int] = {}  # (topic, p) -> its producer id, where not producer_id (_restart_sequence)
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.on_ack = on_ack
        self._header = P.encode(P.ProduceRequest(acks=int(self.acks), timeout_ms=request_timeout_ms))
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._ready: dict[tuple[str, int], deque] = {}  # (topic, p) -> deque of (frame, count, waiters)
        self._inflight: dict[int, _InFlight | list[_InFlight]] = {}  # request id -> batch (a list: PRODUCE_MULTI's)
        # PRODUCE_MULTI (docs/PROTOCOL.md 4.1a): the batches one ``_advance`` sends, grouped by the
        # worker that owns their partitions: one request per worker and topic, not one per partition
        self.multi_partition = multi_partition and self.acks != P.Acks.NONE
        self._staging: dict | None = None
        self._multi_timeout_ms = request_timeout_ms
        self._inflight_per: dict[tuple[str, int], int] = {}
        self._retry: dict[tuple[str, int], deque] = {}  # (topic, p) -> batches to resend first
        self._gaps: dict[tuple[str, int], int] = {}  # (topic, p) -> its batches answered so far (stored or to retry)
        # Only partitions with something to do are visited per call (not every partition ever
        # used: with 1,000 partitions that was ~1 ms of Python per send): _ready and _retry keep
        # non-empty queues only, _lingering the partitions whose _pending holds records.
        self._lingering: set[tuple[str, int]] = set()
        self._timeouts_at = 0.0  # next scan of in-flight batches for request timeouts
        self._counter = 0
        self.errors: list[TailraceError] = []
        self.acked_records = 0
        self.retries = 0
        self.throttle_ms = 0  # total time the broker held acks back: over the principal's quota (Kafka's throttle time)

    # --- what the I/O side provides --------------------------------------------------------
    pool = None
    routes = None

    def _route(self, topic: str, partition: int) -> str | None:
        raise NotImplementedError

    # --- sending -------------------------------------------------------------------------
    def _idle(self, tp) -> bool:
        """Whether partition ``tp`` could send a batch now (so lingering records should be sealed
        into one). While it cannot, records keep joining the pending batch: many sends to a busy
        partition become one batch, not a queue of small ones."""
        if tp in self._ready or tp in self._retry:
            return False
        return self.acks == P.Acks.NONE or self._inflight_per.get(tp, 0) < self.max_in_flight

    def _advance(self) -> None:
        """Seal what has lingered long enough, send what may be sent."""
        now = time.monotonic()
        for tp in list(self._lingering):
            pend = self._pending[tp]
            if now - pend.since >= self.linger_s and self._idle(tp):
                self._seal(tp, pend)
        self._staging = {} if self.multi_partition else None
        for tp in list(self._retry) + list(self._ready):
            self._send_ready(tp, now)
        staged, self._staging = self._staging, None
        if staged:
            self._send_staged(staged)

    def _next_due(self) -> float | None:
        """When ``_advance`` has something to do next without a reply coming (a linger running
        out on an idle partition, a retry's backoff), as a ``time.monotonic()`` value."""
        due = [self._pending[tp].since + self.linger_s for tp in self._lingering if self._idle(tp)]
        due.extend(q[0].not_before for q in self._retry.values() if q)
        return min(due) if due else None

    def _send_ready(self, tp, now: float) -> None:
        retry = self._retry.get(tp)
        ready = self._ready.get(tp)
        while self.acks == P.Acks.NONE or self._inflight_per.get(tp, 0) < self.max_in_flight:
            if retry:
                if retry[0].not_before > now:
                    break  # its backoff first; nothing overtakes it
                b = retry.popleft()
                b.sent = now
                b.attempts += 1
                b.gaps = self._gaps.get(tp, 0)
            elif ready:
                frame, count, waiters = ready.popleft()
                b = _InFlight(tp[0], tp[1], frame, count, now, now, waiters=waiters, gaps=self._gaps.get(tp, 0))
            else:
                break
            if len(b.frame) > self.max_batch_bytes:  # the broker would drop the connection, unread
                self._fail(b, BatchTooLargeError(
                    f"BATCH_TOO_LARGE: a batch of {len(b.frame)} bytes ({b.count} records) to {b.topic}/{b.partition}; "
                    f"the broker takes at most max_batch_bytes={self.max_batch_bytes} (not sent)"))
                continue
            b.via = self._route(b.topic, b.partition)
            if not self._inflight and self.acks != P.Acks.NONE:
                self.pool.settle()  # a close seen while nothing was in flight loses nothing
            if self._staging is not None and b.header is None and not b.alone:
                key = self._owner_of(b)
                if key is not None:  # sent with the other batches for its worker (_send_staged)
                    self._staging.setdefault(key, []).append(b)
                    self._inflight_per[tp] = self._inflight_per.get(tp, 0) + 1
                    continue
            try:
                rid = self.pool.send(b.via, P.Op.PRODUCE, b.topic, b.partition, b.header or self._header, b.frame)
            except TailraceError as exc:  # refused before sending (a topic name over the limit)
                self._fail(b, exc)
                continue
            if b.header is None and self.acks == P.Acks.NONE:
                self.acked_records += b.count
                self._buffered_bytes -= len(b.frame)
                last = self._oneway.get(tp)
                self._oneway[tp] = (b.frame, ({b.via} if last is None else last[1] | {b.via}))
                if b.waiters:
                    self._resolve(b, None)
                continue
            self._inflight[rid] = b
            self._inflight_per[tp] = self._inflight_per.get(tp, 0) + 1
        if retry is not None and not retry:
            del self._retry[tp]
        if ready is not None and not ready:
            del self._ready[tp]

    def _owner_of(self, b: _InFlight):
        """What groups ``b`` with other partitions' batches in one PRODUCE_MULTI: the topic and
        the worker it goes to (straight, or through the router to the owner DESCRIBE named);
        None where no owner is known (sent on its own)."""
        if self.routes is None:
            return (b.topic, b.via) if b.via is not None else None
        owner = self.routes.group_of(b.topic, b.partition, b.via)
        return None if owner is None else (b.topic, b.via, owner)

    def _send_staged(self, staged: dict) -> None:
        """One request per group of ``_owner_of``: a lone batch as PRODUCE, several as PRODUCE_MULTI."""
        cap = P.MAX_REQUEST_PARTITIONS
        for key, batches in staged.items():
            topic, via = key[0], key[1]
            for chunk in _requests_of(batches, cap):
                if len(chunk) == 1:
                    b = chunk[0]
                    args = (P.Op.PRODUCE, topic, b.partition, self._header, b.frame)
                else:
                    head = P.encode(P.ProduceMultiRequest([b.partition for b in chunk], acks=int(self.acks),
                                                          timeout_ms=self._multi_timeout_ms))
                    args = (P.Op.PRODUCE_MULTI, topic, -1, head, [b.frame for b in chunk])
                try:
                    rid = self.pool.send(via, *args)
                except TailraceError as exc:  # refused before sending (a topic name over the limit)
                    for b in chunk:
                        self._inflight_per[(b.topic, b.partition)] -= 1
                        self._fail(b, exc)
                    continue
                self._inflight[rid] = chunk[0] if len(chunk) == 1 else chunk

    def _send_barriers(self) -> None:
        """acks="none": send each partition's last one-way batch again with acks="memory", through
        every path its batches took since the last flush; their answers close the flush (see the
        module docstring for why this, and not socket linger)."""
        now = time.monotonic()
        for tp, (frame, vias) in self._oneway.items():
            for via in vias:
                b = _InFlight(tp[0], tp[1], frame, 0, now, now, via=via, header=self._barrier_header, barrier=True)
                try:
                    rid = self.pool.send(via, P.Op.PRODUCE, b.topic, b.partition, b.header, frame)
                except TailraceError as exc:
                    self._fail(b, exc)
                    continue
                self._inflight[rid] = b
                self._inflight_per[tp] = self._inflight_per.get(tp, 0) + 1
        self._oneway.clear()

    # --- replies -------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def queued(self) -> bool:
        """Whether records wait to be sent (lingering, sealed, or to be retried)."""
        return bool(self._lingering or self._ready or self._retry)

    @property
    def busy(self) -> bool:
        """Whether anything is queued or unacknowledged (what ``flush`` waits out)."""
        return bool(self._inflight or self._ready or self._retry or self._lingering)


class Producer(ProducerCore):
    """The blocking producer: ``ProducerCore`` driven by the caller's own calls."""

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        direct: bool = True,
        same_host: bool = False,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
        key_file=None,
        server_key=None,
        **options,
    ):
        super().__init__(**options)
        self.pool = Pool(bootstrap, connect_timeout_ms, curve_keys(key_file, server_key))
        self.pool.on_lost = self._connection_lost
        self.conn = self.pool.router
        # same_host: send to the owning workers' Unix sockets instead of their ZeroMQ endpoints
        # (client/unixwire.py); the router and any fallback stay ZeroMQ.
        self.routes = BlockingRoutes(self.pool, direct, same_host)
        self._delayed = DelayBuffer(DELAYED_GROUP_BYTES)  # records with a delivery time (client/delayed.py)

    def _route(self, topic: str, partition: int) -> str | None:
        return self.routes.endpoint(topic, partition)

    # --- metadata ------------------------------------------------------------------------
    def partitions_for(self, topic: str) -> int:
        return self.routes.partitions(topic)

    # --- sending -------------------------------------------------------------------------
    def send(self, topic: str, value: bytes, key: bytes | None = None, headers=None, timestamp_ms: int | None = None,
             partition: int | None = None, *, deliver_at_ms: int | None = None, deliver_after_ms: int | None = None) -> None:
        """Queue one record, with its headers (a list of (str key, bytes-or-None value) pairs,
        repeats allowed, or a dict) and its create time (ms since the epoch; default: now).
        Raises ``BatchTooLargeError`` at once for a record over the broker's batch limit; blocks
        while ``buffer_memory`` is full, ``TimeoutError_`` after ``max_block_ms``.
        ``deliver_at_ms`` (ms since the epoch) or ``deliver_after_ms``: the record is appended to
        the partition at that time, not before (client/delayed.py); ``flush`` sends it to the
        broker's timer, and returns once the timer has it durably."""
        if isinstance(headers, int) and not isinstance(headers, bool):  # send(topic, value, key, partition): a
            partition, headers = headers, None  # call written before headers took the fourth place
        if partition is None:
            partition = self._choose(topic, key, None, self.partitions_for(topic))
        extra = header_bytes(headers) + (8 if timestamp_ms is not None else 0)
        exc = self._too_large(value, key, extra)
        if exc is not None:
            raise exc
        if deliver_at_ms is not None or deliver_after_ms is not None:
            stamp = int((time.time() * 1000 if timestamp_ms is None else timestamp_ms) * 1000)
            if self._delayed.add(topic, partition, due_ms(deliver_at_ms, deliver_after_ms), value, key, headers, stamp,
                                 len(value) + (0 if key is None else len(key)) + extra):
                self.flush_delayed()
            return
        rec = len(value) + (0 if key is None else len(key)) + extra
        if not self._room(rec):
            self._wait_for_room(rec)
        self._add((topic, partition), value, key, None, headers, None if timestamp_ms is None else int(timestamp_ms) * 1000, extra)
        self._pump()

    def _wait_for_room(self, nbytes: int) -> None:
        """Take in acknowledgements until ``nbytes`` fit in ``buffer_memory`` (Kafka's send
        blocking on a full buffer); ``TimeoutError_`` after ``max_block_ms``."""
        deadline = time.monotonic() + self.max_block_s
        while not self._room(nbytes):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError_(
                    f"buffer full: {self._buffered_bytes} bytes queued or unacknowledged, buffer_memory="
                    f"{self.buffer_memory}; no room for {nbytes} more within max_block_ms={self.max_block_s * 1000:g}")
            if self._inflight:
                self._pump(timeout_ms=max(1, min(50, int(left * 1000))))
            else:
                self._pump()
                time.sleep(min(0.001, left))  # lingering records: sealed and sent when their time comes

    def send_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes] | None = None,
                   partition: int | None = None, headers: Sequence | None = None,
                   timestamps_ms: Sequence[int] | np.ndarray | None = None) -> None:
        """Send many values in one call, with per-record keys, header lists (as ``send``'s, one
        per value, None for none) and create times (ms). With a key-hash partitioner and keys,
        values are grouped by partition; otherwise the whole call goes to one partition
        (explicit, or the next round-robin choice), split into batches of at most batch_records
        / batch_bytes."""
        if not values:
            return
        times = batch_times(timestamps_ms, len(values))
        nbytes = sum(map(len, values)) + (0 if keys is None else sum(map(len, keys)))
        if headers is not None:  # estimated from the first records' (buffer_memory is a bound, not a ledger)
            nbytes += headers_sample_bytes(headers, min(64, len(values))) * len(values) // min(64, len(values))
        if not self._room(nbytes):
            self._wait_for_room(nbytes)
        if partition is not None:
            self._queue_batch((topic, partition), values, keys, headers, times)
        else:
            for p, vs, ks, hs, ts in self._split_batch(topic, values, keys, self.partitions_for(topic), headers, times):
                self._queue_batch((topic, p), vs, ks, hs, ts)
        self._pump()

    def send_buffers(self, topic: str, values: bytes | np.ndarray, value_offsets: np.ndarray,
                     partition: int | None = None, keys: bytes | np.ndarray | None = None,
                     key_offsets: np.ndarray | None = None, headers: HeaderArrays | None = None,
                     timestamps_us: np.ndarray | None = None) -> None:
        """Send one pre-joined batch: ``values`` back to back, ``value_offsets`` int32[n + 1]
        (and optionally ``keys`` with ``key_offsets`` the same way, headers as columns, create
        times in us): no Python step per record."""
        if partition is None:
            partition = self._choose(topic, None, None, self.partitions_for(topic))
        nbytes = len(values) + (0 if keys is None else len(keys))
        if not self._room(nbytes):
            self._wait_for_room(nbytes)
        self._queue_buffers((topic, partition), values, value_offsets, keys, key_offsets, headers, timestamps_us)
        self._pump()

    def _pump(self, timeout_ms: int = 0) -> None:
        """Send what may be sent, then take in replies (waiting up to ``timeout_ms`` for one,
        less when a retry's backoff ends sooner)."""
        self._advance()
        if self._retry and timeout_ms:
            timeout_ms = min(timeout_ms, max(1, int(self.retry_backoff_s * 1000)))
        self._drain(timeout_ms)

    def _drain(self, timeout_ms: int) -> None:
        wait = timeout_ms
        while self._inflight:
            r = self.pool.recv(wait)
            if r is None:
                break
            wait = 0
            self._on_reply(r)
        self._scan_timeouts()

    def poll(self, timeout_ms: int = 0) -> None:
        self._pump(timeout_ms)

    def flush(self, timeout_ms: int = 60_000) -> int:
        """Send everything queued and wait for every ack; return records acked so far. With
        acks="none", wait until the broker has taken every batch sent (the module docstring)."""
        self.flush_delayed()
        self._seal_all()
        deadline = time.monotonic() + timeout_ms / 1000
        self._advance()
        while self._inflight or any(self._ready.values()) or self._retry or self._oneway:
            if time.monotonic() > deadline:
                raise TimeoutError_(f"flush timed out with {len(self._inflight)} batches in flight")
            if self._oneway and not (self._ready or self._retry):
                self._send_barriers()
            self._pump(timeout_ms=50)
        self._take_errors()
        return self.acked_records

    def send_delayed(self, topic: str, values: Sequence[bytes], *, partition: int, keys: Sequence[bytes] | None = None,
                     headers: Sequence | None = None, deliver_at_ms: int | None = None,
                     deliver_after_ms: int | None = None) -> DelayedProduceReply:
        """One batch appended to ``partition`` at one time, not before: sent now, answered once
        the broker's timer holds it durably (docs/PROTOCOL.md 4.1c)."""
        header, batch = delayed_request(values, keys, headers, deliver_at_ms, deliver_after_ms)
        r = self.conn.request(P.Op.PRODUCE_DELAYED, topic, partition, header, body=batch, timeout_ms=30_000)
        return reply_decoder.decode(r.header)

    def flush_delayed(self) -> None:
        """The delayed records queued, to the broker's timer now: one request per (partition,
        time); returns once the timer holds them durably (``flush`` does this first)."""
        for topic, partition, due, _n, batch in self._delayed.take():
            self.conn.request(P.Op.PRODUCE_DELAYED, topic, partition, P.encode(DelayedProduceRequest(due)), body=batch,
                              timeout_ms=30_000)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Ack", "Producer", "ProducerCore", "round_robin", "key_hash", "sticky", "hash_partition", "hash_partitions",
           "error_for"]
