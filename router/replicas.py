"""A cluster follower's copies (issue 34): this broker's router pulls, for every partition it
holds a replica of and does not lead, the leader's batches and has its own worker append them as
the leader stored them.

Kafka's replica fetcher in the router's loop, driven by replies: per followed partition, one
question at a time. First a REPLICA_APPEND with no batches asks the local worker where the copy
ends (it adopts the partition on the router's word, as for any request); then a FETCH to the
leader's router (``PeerLinks``, the brokers' own link: ``broker/<id>`` under ``--auth curve``)
from that offset, long-polled (``FETCH_WAIT_MS``); its batches go to the local worker in one
REPLICA_APPEND (actors/partition.py ``append_replica``), whose reply gives the new end and what
of the copy is synced, and the next FETCH goes out at once, telling the leader both. Beside it,
while the copy is not all synced, one REPLICA_APPEND with ``wait_sync`` waits at the worker for
the flusher's sync, and its answer goes to the leader at once in a FETCH of its own (answered at
once and not read), so the leader's durable watermark follows the follower's flusher within a
hop. The copy goes through this broker's own ring, flusher and journal,
so it is as durable here as anything produced here.

Which partitions: those whose assignment lists this broker among its replicas with another, live,
broker as leader (``refresh``, from the cluster view on every tick and after every metadata
change). A leader or leader epoch that changed starts the partition over (the local end asked
again). A question unanswered for ``STALL_S`` (a lost reply, a dead peer) is asked again.

Each FETCH says who asks (``replica``) and what the copy has synced (``replica_durable``): the
leader's worker counts both toward its high watermarks and its ISR (actors/replication.py).

``LeaderDuties`` is the other side: for each replicated partition this broker leads, its worker
is told the leader epoch, replicas, ISR and min.insync.replicas (LEADER_AND_ISR) before any
request the router forwards to it, again whenever they change or the worker restarted, and on
every tick for what was not told yet; the ISR a worker asks for in its PING reply is written to
etcd by the leader (``ClusterAgent.propose_isr``), and comes back through the view as a new
LEADER_AND_ISR. A leader that a reassignment removed from the partition's replicas has its worker
stand down (``_stand_down``), as a leader turned follower does at its first REPLICA_APPEND.

A reassignment's new replica is followed like any other, from its own empty log. A copy starts at
offset 0: when the leader's log start has moved past 0 (retention) its FETCH is refused
OFFSET_OUT_OF_RANGE on every try and the replica never catches up (logged once, plainly).

Divergence (Kafka's KIP-101/279/320). Each FETCH also says the leader epoch of the copy's last
batch (``last_epoch``) and the leader epoch followed; a leader at another epoch refuses
(NOT_LEADER_OR_FOLLOWER: one of the two has not seen the change yet, and the next tick asks
again). A copy that is not a prefix of the leader's log (a leader that was replaced, back with
records its successor never had; a follower that held more than the one elected) is answered
with the largest epoch at or below ``last_epoch`` the leader holds and where it ends there
(actors/replication.py ``diverging``), and its position is not counted toward the watermarks. The
follower has its worker cut the copy to the lesser of that end and its own end of that epoch
(REPLICA_APPEND ``truncate_to``/``truncate_epoch``: actors/truncate.py), then fetches again from
the new end, so the check repeats until the copy agrees (each leader change starts it over).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from tailrace.client import protocol as P

log = logging.getLogger("tailrace.router.replicas")

FETCH_WAIT_MS = 500  # a follower's FETCH waits this long at the leader for data (long poll)
FETCH_MAX_BYTES = 1 << 20  # per FETCH: a batch larger than this still comes whole
STALL_S = 5.0  # a question unanswered this long is given up and asked again
_append_reply = P.decoder(P.ReplicaAppendReply)
_error_reply = P.decoder(P.ErrorReply)
_fetch_reply = P.decoder(P.FetchReply)


@dataclass(slots=True)
class Follow:
    """One followed partition."""
    topic: bytes
    partition: int
    leader: int
    leader_epoch: int
    end: int = -1  # where the local copy ends (-1: not asked yet)
    busy: str = ""  # "" (nothing out), "local" (a REPLICA_APPEND), "fetch" (a FETCH at the leader)
    rid: int = 0  # the request id of the question out
    since: float = 0.0  # monotonic time it went out
    durable: int = -1  # what the local copy has synced
    last_epoch: int = -1  # the leader epoch of the local copy's last batch (-1: empty)
    cut: tuple[int, int] | None = None  # the leader said the copy diverged: (epoch, its end there) to cut to
    leader_hw: int = -1  # the leader's high watermark as its last fetch reply said
    syncing: int = 0  # the request id of a REPLICA_APPEND waiting for the sync (0: none)
    sync_since: float = 0.0
    caught_at: float = 0.0  # monotonic time the copy last reached it
    fetched: int = 0  # records taken from the leader since this broker started following
    failures: int = 0  # answers that were not OK in a row
    said: str = ""  # the last refusal logged (each new one is logged once)


class ReplicaFetcher:
    def __init__(self, agent, peers, send_internal: Callable[[bytes, int, list], bool], next_id: Callable[[], int],
                 mirror: Callable[[str], object]):
        self.agent, self.peers = agent, peers
        self.send_internal, self.next_id, self.mirror = send_internal, next_id, mirror
        self.follows: dict[tuple[bytes, int], Follow] = {}
        self.local: dict[int, Follow] = {}  # request id -> the partition of a REPLICA_APPEND out
        self.syncs: dict[int, Follow] = {}  # request id -> the partition of a sync wait out
        self.leaders_seen: dict[tuple[bytes, int], int] = {}  # partitions with a replica here -> their leader
        self.leader_changes = 0
        self.truncations = 0  # copies cut back to their leader's log

    # --- which partitions ------------------------------------------------------------------
    def refresh(self) -> None:
        agent = self.agent
        me, live = agent.me, agent.brokers
        want, seen = {}, {}
        for key, a in agent.assignments.items():
            if me not in a.replicas:
                continue
            seen[key] = a.leader
            before = self.leaders_seen.get(key)
            if before is not None and before != a.leader:
                self.leader_changes += 1
            if a.leader != me and a.leader in live:
                want[key] = a
        self.leaders_seen = seen
        for key in [k for k in self.follows if k not in want]:
            f = self.follows.pop(key)
            log.info("partition %s/%d: no longer followed here (at %d)", f.topic.decode(), f.partition, f.end)
        for key, a in want.items():
            f = self.follows.get(key)
            if f is not None and (f.leader, f.leader_epoch) == (a.leader, a.leader_epoch):
                continue
            if f is None:
                log.info("partition %s/%d: following broker %d (leader epoch %d)", key[0].decode(), key[1], a.leader,
                         a.leader_epoch)
            self.follows[key] = Follow(key[0], key[1], a.leader, a.leader_epoch)

    def tick(self, now: float | None = None) -> None:
        """Take the view's changes, give up stalled questions, and start every idle partition."""
        now = time.monotonic() if now is None else now
        self.refresh()
        for f in self.follows.values():
            if f.busy and now - f.since > STALL_S:
                self.local.pop(f.rid, None)
                f.busy = ""
            if f.syncing and now - f.sync_since > STALL_S:
                self.syncs.pop(f.syncing, None)
                f.syncing = 0
            if not f.syncing and f.end >= 0 and f.durable < f.end:
                self._wait_sync(f, now)
            if not f.busy:
                self._step(f, now)

    def _step(self, f: Follow, now: float) -> None:
        if f.end < 0 or f.cut is not None:
            self._append(f, b"", now)
        else:
            self._fetch(f, now)

    # --- the local copy --------------------------------------------------------------------
    def _append(self, f: Follow, body, now: float) -> None:
        rid = self.next_id()
        req = P.ReplicaAppendRequest(f.leader, f.leader_epoch)
        if f.cut is not None and not len(body):  # cut the copy where it stops agreeing with the leader's log
            req.truncate_epoch, req.truncate_to = f.cut
        frames = [P.pack_routing(P.Op.REPLICA_APPEND, f.partition, rid, f.topic), P.encode(req), body]
        if not self.send_internal(f.topic, f.partition, frames):
            if self.mirror(f.topic.decode()) is None or not self.send_internal(f.topic, f.partition, frames):
                return  # not in this broker's catalog (yet): the next tick tries again
        f.busy, f.rid, f.since = "local", rid, now
        self.local[rid] = f

    def _wait_sync(self, f: Follow, now: float) -> None:
        """Ask the local worker to answer once the copy is synced to its end (beside the FETCH
        out: the sync's news goes to the leader in a FETCH of its own, ``_report``)."""
        rid = self.next_id()
        frames = [P.pack_routing(P.Op.REPLICA_APPEND, f.partition, rid, f.topic),
                  P.encode(P.ReplicaAppendRequest(f.leader, f.leader_epoch, wait_sync=True)), b""]
        if self.send_internal(f.topic, f.partition, frames):
            f.syncing, f.sync_since = rid, now
            self.syncs[rid] = f

    def _report(self, f: Follow) -> None:
        """Tell the leader what the copy has synced now: a FETCH of its own, answered at once and
        not read (the leader takes the position from any FETCH of a replica)."""
        endpoint = self.agent.endpoint_of(f.leader)
        if endpoint:
            rid = self.next_id()
            self.peers.send(endpoint, [P.pack_routing(P.Op.FETCH, f.partition, rid, f.topic),
                                       P.encode(P.FetchRequest(f.end, 1, max_records=1, replica=self.agent.me,
                                                               replica_durable=f.durable, last_epoch=f.last_epoch,
                                                               leader_epoch=f.leader_epoch))])

    def on_local_reply(self, rid: int, code: int, frames: list[bytes]) -> None:
        """The local worker's answer to a REPLICA_APPEND (router.on_internal_reply)."""
        f = self.syncs.pop(rid, None)
        if f is not None:
            if f.syncing == rid and self.follows.get((f.topic, f.partition)) is f:
                f.syncing = 0
                if code == P.ErrorCode.OK:  # (a refusal, e.g. a failed journal: the next tick asks again)
                    f.durable = max(f.durable, _append_reply.decode(frames[2]).durable_end)
                    self._report(f)
                    if f.durable < f.end:
                        self._wait_sync(f, time.monotonic())
            return
        f = self.local.pop(rid, None)
        if f is None or f.rid != rid or self.follows.get((f.topic, f.partition)) is not f:
            return
        f.busy = ""
        now = time.monotonic()
        if code == P.ErrorCode.OK:
            r = _append_reply.decode(frames[2])
            if f.cut is not None:
                log.warning("partition %s/%d: copy cut from %d to %d (leader %d's log ends epoch %d at %d)",
                             f.topic.decode(), f.partition, f.end, r.log_end, f.leader, *f.cut)
                f.cut, f.durable = None, min(f.durable, r.durable_end)
                self.truncations += 1
            f.end, f.durable = r.log_end, max(f.durable, r.durable_end) if f.end >= 0 else r.durable_end
            f.last_epoch = r.last_epoch
            f.failures = 0
            self._fetch(f, now)
            if f.durable < f.end and not f.syncing:
                self._wait_sync(f, now)
            return
        self._refused(f, "append here", code, frames[2] if len(frames) > 2 else b"")

    # --- the leader ------------------------------------------------------------------------
    def _fetch(self, f: Follow, now: float) -> None:
        endpoint = self.agent.endpoint_of(f.leader)
        if not endpoint:
            return
        rid = self.next_id()
        frames = [P.pack_routing(P.Op.FETCH, f.partition, rid, f.topic),
                  P.encode(P.FetchRequest(f.end, FETCH_MAX_BYTES, max_wait_ms=FETCH_WAIT_MS, replica=self.agent.me,
                                          replica_durable=f.durable, last_epoch=f.last_epoch,
                                          leader_epoch=f.leader_epoch))]
        if self.peers.send(endpoint, frames, rid, lambda _ep, reply, f=f, rid=rid: self.on_fetch_reply(f, rid, reply)):
            f.busy, f.rid, f.since = "fetch", rid, now

    def on_fetch_reply(self, f: Follow, rid: int, frames: list[bytes]) -> None:
        if f.rid != rid or f.busy != "fetch" or self.follows.get((f.topic, f.partition)) is not f:
            return
        f.busy = ""
        now = time.monotonic()
        code = P.unpack_routing(frames[0])[2]
        if code != P.ErrorCode.OK:
            self._refused(f, f"fetch from broker {f.leader}", code, frames[1] if len(frames) > 1 else b"")
            return
        f.failures = 0
        body = frames[2] if len(frames) > 2 else b""
        info = _fetch_reply.decode(frames[1])
        if info.diverging_end >= 0:  # the copy is not a prefix of the leader's log: cut it, then ask again
            f.cut = (info.diverging_epoch, info.diverging_end)
            self._append(f, b"", now)
            return
        f.leader_hw = info.high_watermark
        if f.end >= f.leader_hw:
            f.caught_at = now
        if len(body):
            f.fetched += max(0, info.next_offset - f.end)
            self._append(f, body, now)
        else:
            self._fetch(f, now)

    def _refused(self, f: Follow, what: str, code: int, body: bytes) -> None:
        """A refusal: logged once per new reason; the partition waits for the next tick."""
        f.failures += 1
        try:
            message = _error_reply.decode(body).message
        except Exception:  # noqa: BLE001 - an unreadable reason is still a refusal
            message = ""
        said = f"{P.ErrorCode(code).name if code in P.ErrorCode._value2member_map_ else code}: {message}"
        if code == P.ErrorCode.OFFSET_OUT_OF_RANGE and what.startswith("fetch"):
            said += self._below_log_start(f, body)
        if said != f.said:
            f.said = said
            level = logging.INFO if code in P.RETRIABLE else logging.WARNING
            log.log(level, "partition %s/%d at %d: %s refused: %s", f.topic.decode(), f.partition, f.end, what, said)
        if code == P.ErrorCode.OFFSET_OUT_OF_RANGE and what.startswith("append"):
            f.end = -1  # ask the local end again

    @staticmethod
    def _below_log_start(f: Follow, body: bytes) -> str:
        """A copy that ends below the leader's log start (a new replica's empty copy of a partition
        whose first records retention removed) cannot be caught up yet: a copy's log starts at 0
        and has no way to start at a later offset. Said plainly, once, with the refusal."""
        try:
            start = _error_reply.decode(body).log_start_offset
        except Exception:  # noqa: BLE001 - the refusal is logged either way
            return ""
        if start <= f.end:
            return ""
        return (f" (this copy ends at {f.end}, below the leader's log start {start}: a follower's copy cannot start "
                "past offset 0 yet, so this replica will not catch up, and a reassignment adding it does not finish)")

    def stats(self, catalog) -> tuple[dict, dict]:
        """Gauges and counters for the metrics exporter (ops/metrics.py), keyed by slot: the ISR
        of each replicated partition led here, and each followed partition's lag."""
        agent, now = self.agent, time.monotonic()
        isr, under, lag, lag_s = {}, {}, {}, {}

        def slot_of(topic: bytes, p: int) -> str | None:
            entry = catalog.get(topic.decode())
            return str(entry.slots[p]) if entry is not None and p < len(entry.slots) else None

        for (topic, p), a in agent.assignments.items():
            if a.leader == agent.me and len(a.replicas) > 1:
                slot = slot_of(topic, p)
                if slot is not None:
                    isr[slot], under[slot] = len(a.isr), int(len(a.isr) < len(a.replicas))
        for f in self.follows.values():
            slot = slot_of(f.topic, f.partition)
            if slot is not None and f.end >= 0 and f.leader_hw >= 0:
                lag[slot] = max(0, f.leader_hw - f.end)
                lag_s[slot] = 0.0 if f.end >= f.leader_hw else round(now - f.caught_at, 3) if f.caught_at else -1.0
        gauges = {"replica_isr_size": isr, "replica_under_replicated": under, "replica_follower_lag_records": lag,
                  "replica_follower_lag_seconds": lag_s}
        return gauges, {"replica_leader_changes": {"": self.leader_changes}}

    def status(self) -> dict:
        """What STATUS shows of the copies: partitions followed, and those not copying now."""
        stuck = [f"{f.topic.decode()}/{f.partition}" for f in self.follows.values() if f.failures]
        return {"following": len(self.follows), "records_copied": sum(f.fetched for f in self.follows.values()),
                "truncations": self.truncations,
                "not_copying": sorted(stuck)[:20]}


class LeaderDuties:
    """The leader's side: its workers told who follows each replicated partition it leads, and
    the ISR they want written to etcd."""

    def __init__(self, agent, placement, catalog, send_internal: Callable[[bytes, int, list], bool],
                 boot_of: Callable[[int], int], lag_ms: int):
        self.agent, self.placement, self.catalog = agent, placement, catalog
        self.send_internal, self.boot_of, self.lag_ms = send_internal, boot_of, lag_ms
        self.told: dict[tuple[bytes, int], tuple] = {}  # (topic, p) -> what its worker was told, and where

    def ensure(self, topic: bytes, partition: int) -> None:
        """Tell the partition's worker, if it leads a replicated partition here and was not told
        this yet (ahead of the request the router is about to forward: one link, in order)."""
        a = self.agent.assignments.get((topic, partition))
        if a is None or len(a.replicas) < 2 or a.leader != self.agent.me:
            return
        route = self.placement.route(topic, partition)
        if route is None:
            return
        worker, assign = route
        min_isr = self.agent.min_isr(topic)
        said = (worker, assign, self.boot_of(worker), a.leader_epoch, tuple(a.replicas), tuple(a.isr), min_isr)
        if self.told.get((topic, partition)) == said:
            return
        req = P.LeaderAndIsrRequest(a.leader, a.leader_epoch, list(a.replicas), list(a.isr), min_isr, self.lag_ms)
        frames = [P.pack_routing(P.Op.LEADER_AND_ISR, partition, 0, topic), P.encode(req)]
        if self.send_internal(topic, partition, frames):
            self.told[(topic, partition)] = said

    def tick(self) -> None:
        me = self.agent.me
        led = [k for k, a in self.agent.assignments.items() if a.leader == me and len(a.replicas) > 1]
        keep = set(led)
        for key in [k for k in self.told if k not in keep]:
            del self.told[key]
            a = self.agent.assignments.get(key)
            if a is not None and me not in a.replicas:
                self._stand_down(key, a)
        for topic, partition in led:
            self.ensure(topic, partition)

    def _stand_down(self, key: tuple[bytes, int], a) -> None:
        """This broker led the partition and holds no replica of it now (a reassignment moved it
        away): its worker is told to stop leading as a new follower's first question tells it (an
        empty REPLICA_APPEND: actors/produce.py ``replica_append``), so what waits there for
        followers that left is answered NOT_LEADER_OR_FOLLOWER and its producers resend to the new
        leader at once rather than at their request timeout. The reply (request id 0) is dropped."""
        topic, partition = key
        frames = [P.pack_routing(P.Op.REPLICA_APPEND, partition, 0, topic),
                  P.encode(P.ReplicaAppendRequest(a.leader, a.leader_epoch)), b""]
        if self.send_internal(topic, partition, frames):
            log.info("partition %s/%d: no replica here any more (broker %d leads at epoch %d): its worker stands down",
                     topic.decode(), partition, a.leader, a.leader_epoch)

    def on_ping(self, info: P.PingReply) -> None:
        """The ISR changes a worker asks for (its PING reply): each written to etcd by the leader."""
        for slot, isr in info.isr.items():
            found = self.catalog.topic_of_slot(int(slot))
            if found is None:
                continue
            entry, partition = found
            topic = entry.name.encode()
            a = self.agent.assignments.get((topic, partition))
            if a is None or a.leader != self.agent.me or sorted(a.isr) == sorted(isr):
                continue
            self.agent.propose_isr(topic, partition, isr)
