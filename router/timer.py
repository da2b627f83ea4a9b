"""Delayed delivery: the router's timer (docs/DESIGN.md "Delayed delivery").

``PRODUCE_DELAYED`` names a topic, a partition and a delivery time, and carries one record
batch. The router checks the batch as a partition would, wraps it whole as the value of one
record of the internal topic ``__delayed_records`` (its key: the delivery time, the partition
and the topic, ``ENVELOPE``), produces that with ``acks=durable`` and answers once it is stored:
a delayed record is as safe as a durable one from then on. The batch itself is not opened.

**The index** is two sorted numpy arrays (delivery time, envelope offset), one entry per batch,
plus a short unsorted list of the newest, merged in every ``MERGE`` entries or when one of them
is due: millions of delayed records cost 16 bytes per batch and no Python object each (RocketMQ 5
keeps a timer log and a timing wheel in files; the log here is the topic, the wheel the arrays).
Every router loop (~0.1 s) takes what is due, reads those envelopes back (runs of nearby offsets
in one read), and appends each batch to its partition with ``acks=durable``; a delivered
envelope's offset goes into a *done* record (``DONE``, values: int64 offsets), written every
heartbeat. A restart reads the topic back (vectorised: keys and values as columns) and indexes
every envelope that has no done record. It reads from the *floor*, not the log start: the lowest
offset of an envelope not yet noted done durably (or the topic's end when none is), which the
timer writes to ``TIMER_FLOOR_FILE`` every heartbeat it moves (``_floor``): what was delivered
before it is not read again. A floor file older than the topic only makes the read longer. A
batch is appended at least once: a crash between its append and its done record appends it
again. Its records keep their create times; their offsets are the partition's at delivery.

The topic keeps records ``delay_max_ms`` plus a day: a delivery time further out is refused.

In a cluster the broker that took a batch keeps it, and appends it when due at the partition's
leader: its own worker, or another broker's router over the peer link (``_send``).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import DELAY_TOPIC, INTERNAL_TOPICS, Catalog
from tailrace.client import protocol as P
from tailrace.client import records as R
from tailrace.client.checks import check_batch
from tailrace.client.columns import batches_to_columns
from tailrace.client.delayed import DelayedProduceReply, DelayedProduceRequest
from tailrace.client.views import iter_batches

from .readback import ReadBack

log = logging.getLogger("tailrace.router")

ENVELOPE = struct.Struct("<qi")  # an envelope's key: delivery time (ms since the epoch), partition; the topic follows
DONE = ENVELOPE.pack(-1, -1)  # a done record's key; its value: the delivered envelopes' offsets, int64
WRAP_BYTES = 1024  # an envelope's own bytes over its batch, at most
MERGE = 4096  # new index entries merged into the sorted arrays this often
READ_RUN = 64  # due envelopes this close in offset are read in one request
MAX_DUE = 2000  # envelopes taken per loop, at most
RETRY_S = 2.0
READ_BYTES = 8 << 20
DAY_MS = 86_400_000

_request = P.decoder(DelayedProduceRequest)
_produce_reply = P.decoder(P.ProduceReply)
_error = P.decoder(P.ErrorReply)


@dataclass
class TimerContext:
    s: settings_mod.Settings
    catalog: Catalog
    make_internal_topic: Callable
    next_internal_id: Callable[[], int]
    send_internal: Callable


class Timer:
    def __init__(self, ctx: TimerContext):
        self.ctx = ctx
        self.due = np.zeros(0, np.int64)  # sorted delivery times (ms)
        self.offs = np.zeros(0, np.int64)  # the envelopes' offsets, in the same order
        self.new: list[tuple[int, int]] = []  # (due, offset) not merged yet
        self.new_min = 1 << 62
        self.pending: dict[int, list] = {}  # rid -> [kind, sent, tries, ...]
        self.done: list[int] = []  # delivered envelopes' offsets not yet in a done record
        self.delivering: set[int] = set()
        self.loaded = ctx.catalog.get(DELAY_TOPIC) is None
        self.back = ReadBack(DELAY_TOPIC, ctx.next_internal_id, ctx.send_internal)  # at start (router/readback.py)
        self.floor_path = os.path.join(ctx.s.data_dir, datadir.TIMER_FLOOR_FILE)
        self.back.offset = self.floor_at_start = 0 if self.loaded else _read_floor(self.floor_path)
        self.top = 0  # the topic's end as last seen (a reply's offset + 1): the floor when nothing waits
        self.floor_written = -1
        self.seen_done: list[np.ndarray] = []  # while loading
        self.seen_env: list[tuple[np.ndarray, np.ndarray]] = []
        self.delivered = 0
        self.cluster = None  # --cluster: the ClusterAgent; delivered to leaders elsewhere through ``peers``
        self.peers = None
        self.mirror = None  # --cluster: take a cluster topic into the catalog now (router/topics.py mirror_topic)

    def attach_cluster(self, agent, peers, mirror) -> None:
        self.cluster, self.peers, self.mirror = agent, peers, mirror

    def backlog(self) -> int:
        return len(self.due) + len(self.new) + len(self.delivering)

    # --- taking a delayed batch ------------------------------------------------------------
    def produce(self, req) -> None:
        """The PRODUCE_DELAYED handler (router/server.py's own table)."""
        head = _request.decode(req.frames[2])
        name, s = req.name, self.ctx.s
        t = self.ctx.catalog.get(name)
        if t is None and self.cluster is not None and name in self.cluster.topics:
            t = self.mirror(name)  # a cluster topic this broker's view has and its catalog not yet
        if t is None or name in INTERNAL_TOPICS:
            return req.reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"topic {name!r} does not exist"))
        if not 0 <= req.partition < t.partitions:
            return req.reply(P.ErrorCode.UNKNOWN_PARTITION, P.ErrorReply(f"topic {name!r} has {t.partitions} partitions"))
        now_ms = int(time.time() * 1000)
        if head.deliver_at_ms > now_ms + s.delay_max_ms:
            return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
                f"deliver_at_ms {head.deliver_at_ms} is {head.deliver_at_ms - now_ms} ms away: at most delay_max_ms={s.delay_max_ms}"))
        body = req.frames[3]
        limit = s.max_batch_bytes - WRAP_BYTES
        try:
            checked = check_batch(body, 0, len(body), limit)
        except R.BatchError as exc:
            code = {"too_large": P.ErrorCode.BATCH_TOO_LARGE, "crc": P.ErrorCode.CORRUPT_BATCH}.get(exc.reason, P.ErrorCode.MALFORMED)
            return req.reply(code, P.ErrorReply(f"delayed batch refused: {exc}"))
        if checked.size != len(body):
            return req.reply(P.ErrorCode.MALFORMED, P.ErrorReply("a delayed produce carries exactly one batch"))
        body = R.restamp(bytes(body), -1, -1)  # delivered later by the timer, not by its producer: no sequence to keep
        if not self.loaded:
            return req.reply(P.ErrorCode.NOT_READY, P.ErrorReply("the timer is reading its topic back"))
        if self.ctx.catalog.get(DELAY_TOPIC) is None and self.ctx.make_internal_topic(
                DELAY_TOPIC, 1, {"retention.ms": s.delay_max_ms + DAY_MS}) is None:
            return req.reply(P.ErrorCode.NOT_READY, P.ErrorReply("the timer topic cannot be made (shared-memory budget or slots)"))
        key = ENVELOPE.pack(head.deliver_at_ms, req.partition) + name.encode()
        batch = R.encode_batch([bytes(body)], [key])
        rid = self.ctx.next_internal_id()
        self.pending[rid] = ["wrap", time.monotonic(), 1, batch, req, head.deliver_at_ms, checked.count]
        self._send(DELAY_TOPIC.encode(), 0, rid, batch)

    def _send(self, topic: bytes, partition: int, rid: int, batch: bytes) -> None:
        """A durable produce of ``batch``: to this broker's owner of the partition, or in a cluster
        to the broker that leads it (no live leader: not sent; the tick sends it again)."""
        header = P.encode(P.ProduceRequest(acks=P.Acks.DURABLE))
        frames = [P.pack_routing(P.Op.PRODUCE, partition, rid, topic), header, batch]
        agent = self.cluster
        if agent is None or not agent.managed(topic) or agent.leads(topic, partition):
            self.ctx.send_internal(topic, partition, frames)
            return
        self.peers.to_leader(agent, topic, partition, frames, rid, lambda code, reply: self.on_reply(rid, P.Op.PRODUCE, code, reply))

    def _index(self, due: int, offset: int) -> None:
        self.new.append((due, offset))
        self.new_min = min(self.new_min, due)
        if len(self.new) >= MERGE:
            self._merge()

    def _merge(self) -> None:
        if not self.new:
            return
        d, o = np.array(self.new, np.int64).T
        self.new, self.new_min = [], 1 << 62
        due, offs = np.concatenate([self.due, d]), np.concatenate([self.offs, o])
        order = np.argsort(due, kind="stable")
        self.due, self.offs = due[order], offs[order]

    # --- delivering ----------------------------------------------------------------------
    def poll(self, now_ms: int) -> None:
        """Every router loop: read back what is due (cheap when nothing is)."""
        if not self.loaded or len(self.delivering) >= MAX_DUE:
            return
        if self.new_min <= now_ms:
            self._merge()
        if not len(self.due) or self.due[0] > now_ms:
            return
        k = min(int(np.searchsorted(self.due, now_ms, side="right")), MAX_DUE)
        offs = np.sort(self.offs[:k])
        self.due, self.offs = self.due[k:], self.offs[k:]
        self.delivering.update(offs.tolist())
        breaks = np.flatnonzero(np.diff(offs) > READ_RUN) + 1
        for run in np.split(offs, breaks):
            self._read(run)

    def _read(self, run: np.ndarray) -> None:
        first, last = int(run[0]), int(run[-1])
        rid = self.ctx.next_internal_id()
        self.pending[rid] = ["read", time.monotonic(), 1, run]
        topic = DELAY_TOPIC.encode()
        header = P.encode(P.FetchRequest(first, max_bytes=READ_BYTES, max_records=last - first + 1))
        self.ctx.send_internal(topic, 0, [P.pack_routing(P.Op.FETCH, 0, rid, topic), header])

    def _on_read(self, run: np.ndarray, code: int, frames: list) -> None:
        if code != P.ErrorCode.OK:
            if code == P.ErrorCode.OFFSET_OUT_OF_RANGE:  # retention took them (a broker down past delay_max_ms)
                log.error("timer: delayed batches at offsets %s..%s are gone from %s (retention): not delivered",
                          run[0], run[-1], DELAY_TOPIC)
                self._delivered(run.tolist())
            else:
                self._requeue(run)
            return
        want = set(run.tolist())
        for v in iter_batches(frames[2]):
            for i in range(v.record_count):  # one step per envelope (a batch each), not per record
                o = v.base_offset + i
                if o not in want:
                    continue
                want.discard(o)
                key = v.key(i)
                due, partition = ENVELOPE.unpack_from(key)
                topic = key[ENVELOPE.size:]
                rid = self.ctx.next_internal_id()
                batch = v.value(i)
                self.pending[rid] = ["deliver", time.monotonic(), 1, o, topic, partition, batch]
                self._send(topic, partition, rid, batch)
        if want:  # not in this read (past its byte limit): read again
            self._requeue(np.array(sorted(want), np.int64))

    def _requeue(self, offs: np.ndarray) -> None:
        for o in offs.tolist():
            self.delivering.discard(o)
            self._index(0, o)  # due at once

    def _delivered(self, offs: list[int]) -> None:
        self.done.extend(offs)
        self.delivering.difference_update(offs)
        self.delivered += len(offs)

    def on_reply(self, rid: int, op: int, code: int, frames: list) -> bool:
        item = self.pending.pop(rid, None)
        if item is None:
            if rid == self.back.rid and not self.loaded:
                self._on_load(code, frames)
                return True
            return False
        kind = item[0]
        if kind == "read":
            self._on_read(item[3], code, frames)
            return True
        if code in P.RETRIABLE and item[2] < 10:
            item[1], item[2] = time.monotonic(), item[2] + 1
            self.pending[rid] = item  # sent again at a tick
            return True
        why = _error.decode(frames[1]).message if code != P.ErrorCode.OK and len(frames) > 1 else ""
        if kind == "wrap":
            _k, _s, _t, _batch, req, due, count = item
            if code == P.ErrorCode.OK:
                base = _produce_reply.decode(frames[1]).base_offset
                self._index(due, base)
                self.top = max(self.top, base + 1)
                req.reply(P.ErrorCode.OK, DelayedProduceReply(count, due))
            else:
                req.reply(code, P.ErrorReply(f"delayed batch not stored: {why}"))
        elif kind == "deliver":
            if code != P.ErrorCode.OK:
                log.error("timer: delayed batch for %s/%d dropped: %s %s", item[4], item[5], P.ErrorCode(code).name, why)
            self._delivered([item[3]])
        elif kind == "done":
            if code == P.ErrorCode.OK:
                self.top = max(self.top, _produce_reply.decode(frames[1]).base_offset + 1)
            else:
                self.done.extend(item[3])  # noted again at the next heartbeat
        return True

    def tick(self, now: float) -> None:
        if not self.loaded:
            if self.back.due(now):
                self.back.step()
            return
        for rid, item in list(self.pending.items()):
            if now - item[1] <= RETRY_S:
                continue
            if item[0] == "read":
                del self.pending[rid]
                self._requeue(item[3])
            elif item[0] == "done":
                del self.pending[rid]
                self.done.extend(item[3])
            elif item[2] >= 10:
                del self.pending[rid]
                self.on_reply_timeout(item)
            else:
                item[1], item[2] = now, item[2] + 1
                if item[0] == "wrap":
                    self._send(DELAY_TOPIC.encode(), 0, rid, item[3])
                else:
                    self._send(item[4], item[5], rid, item[6])
        if self.done:
            offs, self.done = self.done, []
            rid = self.ctx.next_internal_id()
            self.pending[rid] = ["done", time.monotonic(), 1, offs]
            self._send(DELAY_TOPIC.encode(), 0, rid, R.encode_batch([np.asarray(offs, "<i8").tobytes()], [DONE]))
        floor = self._floor()
        if floor != self.floor_written:
            datadir.write_atomic(self.floor_path, b"%d" % floor, sync=False)  # old or new after a crash: both safe
            self.floor_written = floor

    def _floor(self) -> int:
        """The lowest offset of an envelope not yet noted done durably: indexed, being delivered,
        delivered but its done record not yet stored; the topic's end when there is none."""
        lows = [self.top]
        if len(self.offs):
            lows.append(int(self.offs.min()))
        lows.extend(o for _d, o in self.new)  # a few thousand at most (MERGE)
        if self.delivering:
            lows.append(min(self.delivering))
        if self.done:
            lows.append(min(self.done))
        lows.extend(min(item[3]) for item in self.pending.values() if item[0] == "done")
        return min(lows)

    def on_reply_timeout(self, item: list) -> None:
        if item[0] == "wrap":
            item[4].reply(P.ErrorCode.TIMEOUT, P.ErrorReply("delayed batch not stored: the timer topic's owner did not answer"))
        else:
            self._requeue(np.array([item[3]], np.int64))

    # --- reading the topic back at start ---------------------------------------------------
    def _on_load(self, code: int, frames: list) -> None:
        body = self.back.take(code, frames)
        if body is None:
            return
        if len(body):
            cols = batches_to_columns(iter_batches(body), self.back.offset)
            ko = cols.key_offsets.astype(np.int64)
            ours = np.flatnonzero(cols.key_valid & (np.diff(ko) >= ENVELOPE.size))  # (anything else is not the timer's)
            if len(ours):
                heads = cols.keys[ko[ours, None] + np.arange(ENVELOPE.size)]  # every key starts with ENVELOPE
                due = heads[:, :8].copy().view("<i8").ravel()
                done = due == -1
                self.seen_env.append((due[~done], cols.offsets[ours][~done]))
                vo = cols.value_offsets
                for i in ours[done].tolist():  # done records: a few per heartbeat
                    self.seen_done.append(cols.values[vo[i]:vo[i + 1]].copy().view("<i8"))
        if not self.back.advance():
            return
        due = np.concatenate([d for d, _ in self.seen_env] or [np.zeros(0, np.int64)])
        offs = np.concatenate([o for _, o in self.seen_env] or [np.zeros(0, np.int64)])
        done = np.concatenate(self.seen_done or [np.zeros(0, np.int64)])
        keep = ~np.isin(offs, done)
        order = np.argsort(due[keep], kind="stable")
        self.due, self.offs = due[keep][order], offs[keep][order]
        self.seen_env, self.seen_done = [], []
        self.top = max(self.top, self.back.offset)
        self.loaded = True
        log.info("timer ready: %d delayed batches waiting, read back from offset %d up to offset %d", len(self.due),
                 self.floor_at_start, self.back.offset)


def _read_floor(path: str) -> int:
    """Where a start reads the timer's topic from (0: from its log start)."""
    try:
        with open(path, "rb") as f:
            return max(int(f.read().strip() or 0), 0)
    except (OSError, ValueError):
        return 0
