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

In a cluster each partition's leader hands out its records (Kafka's share-partition leader): the
consumer learns the leaders of its topics (DESCRIBE_TOPIC, again every ``METADATA_MAX_AGE_S``
and when a broker stops answering), keeps a fetch at each, and sends each acknowledgement to the
broker that delivered the record. A poll returns what the first broker to answer gave; the
fetches still out at the others are kept and give the next polls their records (a small
prefetch even with ``prefetch=False``). On a single broker there is one leader: nothing changes.
"""

from __future__ import annotations

import time
import uuid
from typing import Iterable, NamedTuple

import numpy as np
import zmq

from . import protocol as P
from . import share_protocol as S
from .columns import CREATE_TIME
from .connection import CONNECT_TIMEOUT_MS, Connection
from .errors import ConnectionLostError, TailraceError, TimeoutError_
from .security import curve_keys
from .share_records import share_records

_reply = P.decoder(S.ShareFetchReply)
PREFETCH_WAIT_MS = 500  # a fetch ahead waits at most this long at the broker for records
METADATA_MAX_AGE_S = 5.0  # a cluster: the partitions' leaders are asked again this often
LEADERLESS_AGE_S = 0.5  # ...and this often while one of them has none
GRACE_S = 0.2  # a poll over several brokers returns empty this long after its timeout
CLOSE_WAIT_MS = 5000  # a cluster: ``close`` waits this long at most for each broker's answer to the leave
_describe = P.decoder(P.DescribeReply)


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


class Leg:
    """One broker the member fetches from (``endpoint`` None: the bootstrap connection): the
    fetch out there (its request id, when it is overdue, the acknowledgements it carries) and
    the SHARE_ACKNOWLEDGE requests not yet answered (request id -> their acknowledgements)."""

    __slots__ = ("endpoint", "conn", "ahead", "due", "carried", "acking")

    def __init__(self, endpoint: str | None, conn):
        self.endpoint, self.conn = endpoint, conn
        self.ahead, self.due, self.carried = 0, 0.0, []
        self.acking: dict = {}


class Fanout:
    """What both share consumers (blocking and asyncio) keep about the leaders, with no I/O:
    which brokers lead the subscription's partitions, and where each acknowledgement goes."""

    def _fanout_init(self) -> None:
        self._leader: dict[tuple[str, int], str | None] = {}  # (topic, partition) -> its leader's endpoint (None: bootstrap)
        self._from: dict[tuple[str, int], str | None] = {}  # (topic, partition) -> the broker that last delivered its records
        self._meta_at = -1.0  # when the leaders were last learnt (-1: never); a single broker: never again
        self._leaderless = False  # a partition had no leader then
        self.cluster = False

    def _meta_due(self) -> bool:
        if self._meta_at < 0:
            return True
        age = time.monotonic() - self._meta_at
        return self.cluster and (age > METADATA_MAX_AGE_S or (self._leaderless and age > LEADERLESS_AGE_S))

    def _take_meta(self, replies: list[P.DescribeReply], bootstrap: str) -> None:
        leader, self._leaderless = {}, False
        for d in replies:
            self.cluster |= d.broker_id >= 0
            for p in d.partitions:
                if p.leader >= 0 or d.broker_id < 0:
                    ep = p.leader_endpoint or None
                    leader[(d.topic.name, p.partition)] = None if ep == bootstrap else ep
                else:
                    self._leaderless = True  # failing over, or not yet known here: asked again soon
        self._leader, self._meta_at = leader, time.monotonic()

    def _endpoints(self) -> list[str | None]:
        """The brokers to fetch from: every leader of the subscription's partitions (at least the
        bootstrap one)."""
        eps = {ep for (t, _p), ep in self._leader.items() if t in self.topics}
        return sorted(eps, key=lambda e: (e is not None, e or "")) or [None]

    def _split(self, acks: list[S.ShareAck]) -> dict[str | None, list[S.ShareAck]]:
        """Acknowledgements by the broker to send them to: the one that delivered the record."""
        out: dict[str | None, list[S.ShareAck]] = {}
        for a in acks:
            key = (a.topic, a.partition)
            out.setdefault(self._from.get(key, self._leader.get(key)), []).append(a)
        return out

    def _requeue(self, acks: list[S.ShareAck]) -> None:
        """Acknowledgements a broker refused whole for now (NOT_READY while it starts): sent
        again with the next request."""
        self._special.extend(acks)
        self._meta_at = -1.0

    def _unknown(self, endpoint: str | None, acks: list[S.ShareAck]) -> list[S.AckOutcome]:
        """Acknowledgements sent to a broker that went silent or closed the connection (a
        cluster): whether it applied them is unknown, so they are reported (``TIMEOUT``, in
        ``failed``) and not sent again; a record they did not settle comes again from its next
        leader. Its partitions' acknowledgements go to the leaders learnt next."""
        out = [S.AckOutcome(a.topic, a.partition, a.first, a.last, P.ErrorCode.TIMEOUT,
                            f"the broker at {endpoint or 'bootstrap'} did not answer: applied or not is unknown")
               for a in acks]
        self.failed.extend(out)
        self._from = {k: v for k, v in self._from.items() if v != endpoint}
        self._meta_at = -1.0
        return out

    def _delivered_by(self, reply: S.ShareFetchReply, endpoint: str | None) -> None:
        for part in reply.partitions:
            self._from[(part.topic, part.partition)] = endpoint


class ShareConsumer(Fanout):
    def __init__(self, bootstrap: str | None = None, *, group: str, topics: Iterable[str] | str = (),
                 max_records: int = 500, max_bytes: int = 8 << 20, implicit: bool = False, timeout_ms: int = 30_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, key_file=None, server_key=None, prefetch: bool = True):
        self.prefetch = prefetch  # ask for the next records as soon as a poll returned some (``poll``)
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.member_id = uuid.uuid4().hex
        self.max_records, self.max_bytes, self.implicit, self.timeout_ms = max_records, max_bytes, implicit, timeout_ms
        self._keys = curve_keys(key_file, server_key)
        self.conn = Connection(bootstrap, connect_timeout_ms, self._keys)
        self._legs: dict[str | None, Leg] = {None: Leg(None, self.conn)}
        self._fanout_init()
        self._acks: dict[tuple[str, int], list] = {}  # (topic, partition) -> [offsets, types] of plain acknowledgements
        self._special: list[S.ShareAck] = []  # ones with a delay or an error text: one range each
        self._delivered: dict[tuple[str, int], np.ndarray] = {}  # implicit mode: offsets of the last poll not acknowledged
        self.lock_duration_ms = 0
        self.failed: list[S.AckOutcome] = []  # acknowledgements the broker refused (INVALID_RECORD_STATE...), newest last
        self.closed = False

    def subscribe(self, topics: Iterable[str] | str) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self._meta_at = -1.0

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

    # --- the brokers -----------------------------------------------------------------------------
    def _leg(self, endpoint: str | None) -> Leg:
        leg = self._legs.get(endpoint)
        if leg is None:  # a leader the bootstrap broker named: its own router
            leg = self._legs[endpoint] = Leg(endpoint, Connection(endpoint, 0, self._keys))
        return leg

    def _refresh(self) -> None:
        """Learn the subscription's leaders (from the bootstrap broker, else any other known)."""
        if not self.topics:
            self._meta_at = time.monotonic()
            return
        legs = [self._legs[None]] + [g for e, g in self._legs.items() if e is not None]
        for i, leg in enumerate(legs):
            try:
                replies = [_describe.decode(leg.conn.request(P.Op.DESCRIBE_TOPIC, t, -1, timeout_ms=self.timeout_ms).header)
                           for t in self.topics]
            except (TimeoutError_, ConnectionLostError):
                if i + 1 < len(legs):
                    continue
                raise
            self._take_meta(replies, self.conn.endpoint if leg.endpoint is None else "")
            if leg.endpoint is not None:  # answered by another broker: "" there is that broker
                self._leader = {k: (leg.endpoint if v is None else (None if v == self.conn.endpoint else v))
                                for k, v in self._leader.items()}
            return

    def _send(self, leg: Leg, op: int, body: S.ShareFetchRequest) -> int:
        return leg.conn.send(op, self.group, -1, P.encode(body))

    def _fetch(self, leg: Leg, acks: list, wait_ms: int) -> None:
        leg.conn.connected()
        leg.ahead = self._send(leg, P.Op.SHARE_FETCH, S.ShareFetchRequest(
            self.member_id, self.topics, acks, self.max_records, self.max_bytes, wait_ms))
        leg.due, leg.carried = time.monotonic() + (wait_ms + self.timeout_ms) / 1000, acks

    def _acknowledge(self, leg: Leg, acks: list, leave: bool = False) -> None:
        leg.conn.connected()
        rid = self._send(leg, P.Op.SHARE_ACKNOWLEDGE, S.ShareFetchRequest(self.member_id, acks=acks, leave=leave))
        leg.acking[rid] = acks

    def _answer(self, leg: Leg, r, acks: list):
        """A share reply's (ShareFetchReply, body, refused acknowledgements). In a cluster, a
        refusal of the whole request that may pass (NOT_READY while a broker starts) puts its
        acknowledgements back and counts as an empty answer."""
        try:
            r.raise_for_code()
        except TailraceError:
            if not (self.cluster and r.code in P.RETRIABLE):
                raise
            self._requeue(acks)
            return S.ShareFetchReply([]), b"", []
        reply = _reply.decode(r.header)
        self.lock_duration_ms = reply.lock_duration_ms or self.lock_duration_ms
        bad = [o for o in reply.acks if o.code != P.ErrorCode.OK]
        self.failed.extend(bad)
        if any(o.code == P.ErrorCode.NOT_LEADER_OR_FOLLOWER for o in bad):
            self._meta_at = -1.0  # a leader moved: learnt again at the next poll
        self._delivered_by(reply, leg.endpoint)
        return reply, r.body, bad

    def _settle_acks(self, timeout_ms: int | None) -> list[S.AckOutcome]:
        """Wait for every acknowledgement in flight (None: take only the answers already here)."""
        bad = []
        for leg in list(self._legs.values()):
            for rid in list(leg.acking):
                if timeout_ms is None and not leg.conn.answered(rid):
                    continue
                acks = leg.acking.pop(rid)
                try:
                    r = leg.conn.wait_for(rid, timeout_ms or self.timeout_ms)
                except (TimeoutError_, ConnectionLostError):
                    if not self.cluster:
                        raise
                    bad.extend(self._unknown(leg.endpoint, acks))
                    continue
                bad.extend(self._answer(leg, r, acks)[2])
        return bad

    def commit_sync(self, timeout_ms: int | None = None) -> list[S.AckOutcome]:
        """Send the acknowledgements made so far now and wait for them (and for any sent with
        earlier polls); returns those the broker refused. Each answered one is durable."""
        for ep, acks in self._split(self._take_acks()).items():
            self._acknowledge(self._leg(ep), acks)
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
        if self._meta_due():
            self._refresh()
        by_ep = self._split(self._take_acks())
        eps = self._endpoints()
        for ep in eps:
            leg, acks = self._leg(ep), by_ep.pop(ep, [])
            if leg.ahead:
                if acks:
                    self._acknowledge(leg, acks)
            else:
                self._fetch(leg, acks, max(int(timeout_ms), 0))
        for ep, acks in by_ep.items():  # records of a partition whose leader has changed since: to the one that gave them
            self._acknowledge(self._leg(ep), acks)
        records = self._gather(max(int(timeout_ms), 0))
        self._settle_acks(None)
        if records and self.prefetch:
            for ep in eps:
                if not self._legs[ep].ahead:
                    self._fetch(self._legs[ep], [], PREFETCH_WAIT_MS)
        return records

    def _gather(self, timeout_ms: int) -> list[ShareRecord]:
        """The records of the first fetch answered with some, of those out at any broker. A
        single broker: its one fetch, waited for as ``Connection.wait_for`` does (its timeout or
        a lost connection raises). Several: none once ``timeout_ms`` has passed (the fetches
        still out stay for the next poll); a broker silent past its fetch's time is given up (its
        fetch's acknowledgements reported, ``_unknown``) and the leaders are learnt again."""
        single = len(self._legs) == 1
        end = time.monotonic() + timeout_ms / 1000 + GRACE_S
        while True:
            out = [leg for leg in self._legs.values() if leg.ahead]
            if not out:
                return []
            ready = [leg for leg in out if leg.conn.answered(leg.ahead)]
            now = time.monotonic()
            if not ready and single:
                ready = out
            elif not ready:
                late = [leg for leg in out if leg.due <= now]
                for leg in late:
                    self._unknown(leg.endpoint, leg.carried)
                    leg.ahead = 0
                if not late and now >= end:
                    return []
                if not late:
                    self._wait_any(out, min(min(leg.due for leg in out), end) - now)
                continue
            records = []
            for leg in ready:
                rid, leg.ahead = leg.ahead, 0
                try:
                    r = leg.conn.wait_for(rid, max(int((leg.due - now) * 1000), 1))
                except (TimeoutError_, ConnectionLostError):
                    if not self.cluster:
                        raise
                    self._unknown(leg.endpoint, leg.carried)
                    continue
                reply, data, _bad = self._answer(leg, r, leg.carried)
                records += self._records(reply, data)
            if records:
                return records

    @staticmethod
    def _wait_any(legs: list[Leg], timeout_s: float) -> None:
        poller = zmq.Poller()
        for leg in legs:
            poller.register(leg.conn.sock, zmq.POLLIN)
        poller.poll(max(int(timeout_s * 1000), 1))

    def _records(self, reply: S.ShareFetchReply, data) -> list[ShareRecord]:
        records, delivered = share_records(reply, data, ShareRecord)
        if self.implicit:
            self._delivered.update(delivered)
        return records

    def close(self) -> None:
        """Send what was acknowledged and leave: what this member still holds (what a prefetch
        acquired too) goes back at once, at every broker it fetched from."""
        if self.closed:
            return
        self.closed = True
        try:
            by_ep = self._split(self._take_acks())
            for leg in list(self._legs.values()):
                if leg.ahead:
                    rid, leg.ahead = leg.ahead, 0
                    try:  # not returned: the leave gives them back
                        self._answer(leg, leg.conn.wait_for(rid, PREFETCH_WAIT_MS + self.timeout_ms), leg.carried)
                    except (TimeoutError_, ConnectionLostError):
                        if not self.cluster:
                            raise
            for ep, leg in list(self._legs.items()):
                self._acknowledge(leg, by_ep.pop(ep, []), leave=True)
            for ep, acks in by_ep.items():
                self._acknowledge(self._leg(ep), acks, leave=True)
            self._settle_acks(min(self.timeout_ms, CLOSE_WAIT_MS) if self.cluster else self.timeout_ms)
        finally:
            for leg in self._legs.values():
                leg.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
