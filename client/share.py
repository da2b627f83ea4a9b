"""ShareConsumer: a member of a share group (queue semantics: per-record acknowledgements).

    from tailrace.client import ShareConsumer
    with ShareConsumer(group="workers", topics=["jobs"]) as c:
        while True:
            for r in c.poll(timeout_ms=1000):
                try:
                    handle(r.value)
                    c.acknowledge(r)                          # ACCEPT: done
                except Exception as exc:
                    c.acknowledge(r, "release", error=str(exc))  # again later (the group's backoff), or
                    # c.acknowledge(r, "reject", error=...)    # never again: to the dead-letter topic

Records come acquired: no other member gets them until this one acknowledges them or its lock
ends (``lock_duration_ms``, the group's ``share.record.lock.duration.ms``). Acknowledgements
are sent in ranges with the next ``poll`` (Kafka's piggybacking), or at once by ``commit_sync``
and ``close``; each answered one is durable at the broker. ``implicit=True`` accepts what a poll
returned when the next poll comes, unless it was acknowledged otherwise (Kafka's implicit mode).
``delivery_count`` on each record says how many times it was delivered (1 the first time).
"""

from __future__ import annotations

import uuid
from typing import Iterable, NamedTuple

import numpy as np

from . import protocol as P
from . import share_protocol as S
from .columns import CREATE_TIME
from .connection import CONNECT_TIMEOUT_MS, Connection
from .security import curve_keys
from .share_records import share_records

_reply = P.decoder(S.ShareFetchReply)
PREFETCH_WAIT_MS = 500  # a fetch ahead waits at most this long at the broker for records


class ShareRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: tuple = ()
    timestamp_type: int = CREATE_TIME
    delivery_count: int = 1


def ack_ranges(topic: str, partition: int, offsets: np.ndarray, kinds: np.ndarray) -> list[S.ShareAck]:
    """Offsets (any order, no repeats) and their acknowledgement types as ranges of consecutive
    offsets of one type (numpy: no step per record)."""
    order = np.argsort(offsets, kind="stable")
    o, k = offsets[order], kinds[order]
    breaks = np.flatnonzero((np.diff(o) != 1) | (np.diff(k) != 0)) + 1
    firsts = np.concatenate([[0], breaks]).astype(np.int64)
    lasts = np.concatenate([breaks - 1, [len(o) - 1]]).astype(np.int64)
    return [S.ShareAck(topic, partition, f, l, t) for f, l, t in zip(o[firsts].tolist(), o[lasts].tolist(), k[firsts].tolist())]


class ShareConsumer:
    def __init__(self, bootstrap: str | None = None, *, group: str, topics: Iterable[str] | str = (),
                 max_records: int = 500, max_bytes: int = 8 << 20, implicit: bool = False, timeout_ms: int = 30_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None, prefetch: bool = True):
        self.prefetch = prefetch  # ask for the next records as soon as a poll returned some (``poll``)
        self._ahead = 0  # the request id of that fetch, 0: none
        self._acking: list[int] = []  # SHARE_ACKNOWLEDGE requests not yet answered
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.member_id = uuid.uuid4().hex
        self.max_records, self.max_bytes, self.implicit, self.timeout_ms = max_records, max_bytes, implicit, timeout_ms
        self.conn = Connection(bootstrap, connect_timeout_ms, curve_keys(key_file, server_key))
        self._acks: dict[tuple[str, int], list] = {}  # (topic, partition) -> [offsets, types] of plain acknowledgements
        self._special: list[S.ShareAck] = []  # ones with a delay or an error text: one range each
        self._delivered: dict[tuple[str, int], np.ndarray] = {}  # implicit mode: offsets of the last poll not acknowledged
        self.lock_duration_ms = 0
        self.failed: list[S.AckOutcome] = []  # acknowledgements the broker refused (INVALID_RECORD_STATE...), newest last
        self.closed = False

    def subscribe(self, topics: Iterable[str] | str) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)

    # --- acknowledging ---------------------------------------------------------------------------
    def acknowledge(self, record, type: str | int = "accept", *, delay_ms: int | None = None, error: str = "") -> None:
        """Acknowledge one record (or a list of records of any partitions): ``accept``, ``release``
        (``delay_ms``: when it may come again; default the group's backoff) or ``reject``."""
        kind = S.ACK_TYPES.get(type, 0) if isinstance(type, str) else int(type)
        if kind not in (S.ACCEPT, S.RELEASE, S.REJECT):
            raise ValueError(f"acknowledgement type {type!r}: accept, release or reject")
        plain = delay_ms is None and not error
        if plain and hasattr(record, "offset"):  # one record: the common call, kept short
            entry = self._acks.get((record.topic, record.partition))
            if entry is None:
                entry = self._acks[(record.topic, record.partition)] = [[], []]
            entry[0].append(record.offset)
            entry[1].append(kind)
            return
        for r in [record] if hasattr(record, "offset") else record:
            if not plain:
                self._special.append(S.ShareAck(r.topic, r.partition, r.offset, r.offset, kind,
                                                -1 if delay_ms is None else int(delay_ms), error))
            else:
                entry = self._acks.setdefault((r.topic, r.partition), [[], []])
                entry[0].append(r.offset)
                entry[1].append(kind)

    def acknowledge_offsets(self, topic: str, partition: int, offsets, type: str | int = "accept") -> None:
        """Acknowledge many offsets of one partition at once (an array: no step per record)."""
        kind = S.ACK_TYPES[type] if isinstance(type, str) else int(type)
        entry = self._acks.setdefault((topic, partition), [[], []])
        o = np.asarray(offsets, np.int64)
        entry[0].extend(o.tolist())
        entry[1].extend([kind] * len(o))

    def _take_acks(self) -> list[S.ShareAck]:
        acks = []
        if self.implicit:  # what the last poll gave and was not acknowledged otherwise: accepted
            for key, offs in self._delivered.items():
                named = self._acks.get(key, [[], []])[0]
                special = [a.first for a in self._special if (a.topic, a.partition) == key]
                left = np.setdiff1d(offs, np.asarray(named + special, np.int64), assume_unique=False)
                if len(left):
                    self.acknowledge_offsets(key[0], key[1], left)
            self._delivered = {}
        for (topic, p), (offs, kinds) in self._acks.items():
            if offs:
                acks.extend(ack_ranges(topic, p, np.asarray(offs, np.int64), np.asarray(kinds, np.int64)))
        acks.extend(self._special)
        self._acks, self._special = {}, []
        return acks

    def _send(self, op: int, body: S.ShareFetchRequest) -> int:
        return self.conn.send(op, self.group, -1, P.encode(body))

    def _wait(self, rid: int, timeout_ms: int):
        """The reply to request ``rid``: (ShareFetchReply, body, refused acknowledgements)."""
        r = self.conn.wait_for(rid, timeout_ms)
        r.raise_for_code()
        reply = _reply.decode(r.header)
        self.lock_duration_ms = reply.lock_duration_ms or self.lock_duration_ms
        bad = [o for o in reply.acks if o.code != P.ErrorCode.OK]
        self.failed.extend(bad)
        return reply, r.body, bad

    def _request(self, op: int, body: S.ShareFetchRequest, timeout_ms: int):
        self.conn.connected()
        return self._wait(self._send(op, body), timeout_ms)

    def _settle_acks(self, timeout_ms: int | None) -> list[S.AckOutcome]:
        """Wait for every acknowledgement in flight (None: take only the answers already here)."""
        bad = []
        for rid in list(self._acking):
            if timeout_ms is None and not self.conn.answered(rid):
                continue
            self._acking.remove(rid)
            bad.extend(self._wait(rid, timeout_ms or self.timeout_ms)[2])
        return bad

    def commit_sync(self, timeout_ms: int | None = None) -> list[S.AckOutcome]:
        """Send the acknowledgements made so far now and wait for them (and for any sent with
        earlier polls); returns those the broker refused. Each answered one is durable."""
        acks = self._take_acks()
        if acks:
            self.conn.connected()
            self._acking.append(self._send(P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=acks)))
        return self._settle_acks(timeout_ms or self.timeout_ms)

    # --- polling --------------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 1000) -> list[ShareRecord]:
        """Acknowledge what was acknowledged since the last poll and acquire records: at most
        ``max_records``, waiting up to ``timeout_ms`` for some. With ``prefetch`` (the default),
        a poll that returned records asks for the next ones at once, and the next poll sends its
        acknowledgements on their own (``SHARE_ACKNOWLEDGE``, not waited for: ``commit_sync`` and
        ``close`` wait) and returns what was fetched meanwhile: the broker's fsync of one batch's
        acknowledgements overlaps the work on the next."""
        self.conn.connected()
        acks = self._take_acks()
        if self._ahead:
            rid, self._ahead = self._ahead, 0
            if acks:
                self._acking.append(self._send(P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=acks)))
        else:
            rid = self._send(P.Op.SHARE_FETCH, S.ShareFetchRequest(self.member_id, self.topics, acks, self.max_records,
                                                                   self.max_bytes, max(int(timeout_ms), 0)))
        reply, data, _bad = self._wait(rid, int(timeout_ms) + self.timeout_ms)
        records = self._records(reply, data)
        self._settle_acks(None)
        if records and self.prefetch:
            self._ahead = self._send(P.Op.SHARE_FETCH, S.ShareFetchRequest(
                self.member_id, self.topics, [], self.max_records, self.max_bytes, PREFETCH_WAIT_MS))
        return records

    def _records(self, reply: S.ShareFetchReply, data) -> list[ShareRecord]:
        records, delivered = share_records(reply, data, ShareRecord)
        if self.implicit:
            self._delivered.update(delivered)
        return records

    def close(self) -> None:
        """Send what was acknowledged and leave: what this member still holds (what a prefetch
        acquired too) goes back at once."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._ahead:
                rid, self._ahead = self._ahead, 0
                self._wait(rid, PREFETCH_WAIT_MS + self.timeout_ms)  # not returned: the leave gives them back
            self._request(P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=self._take_acks(), leave=True),
                          self.timeout_ms)
            self._settle_acks(self.timeout_ms)
        finally:
            self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
