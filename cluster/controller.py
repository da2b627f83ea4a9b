"""The controller: one broker of the cluster, elected in etcd, writes topics and assignments.

Election. A broker becomes controller by a create-if-absent transaction on
``/tailrace/<c>/controller`` under its own registration lease (never etcd's lock recipe, which
Jepsen found unsafe under pauses). The key's create revision is the *controller epoch*: a later
controller's key is created at a later revision, so epochs only grow. When the controller's lease
ends (it died, paused past its TTL, or was revoked) the key is deleted and the others race again.

Fencing. Every controller write is one transaction whose first compare is "the controller key's
create revision is my epoch", with a read of that key as the failure branch: a deposed
controller's late write changes nothing, and it learns it was deposed (``NotController``) from the
same round trip. A controller that only *thinks* it still leads (paused, partitioned) can
therefore never overwrite its successor's decisions, whatever the clocks say.

What it decides (``Controller``, one thread): a new topic's partitions, ``replication_factor``
replicas each, placed on live brokers by partition count and the load they publish (cluster/assign.py), leader
epoch 0; and, when a broker's registration disappears, what becomes of the partitions it led, by
``lost_policy``:

- ``"offline"`` (the default): Kafka's election. The first replica (in the preferred order) that
  is in the ISR and lives leads (leader epoch + 1), and the ISR loses the brokers that are gone.
  With none (one replica, or an ISR down to the lost broker) the partition loses its leader
  (``NO_LEADER``, leader epoch + 1) and keeps its ISR: unavailable, as Kafka is, until an ISR
  member registers again and leads; or, with the topic's ``unclean.leader.election.enable``, a
  live replica outside the ISR leads at once and what only the ISR held is lost (logged loudly).
  A follower whose broker is gone leaves the ISR at once while its leader lives. With
  ``rebalance_leaders`` (the broker's ``auto_leader_rebalance``, on by default) a partition whose
  preferred replica (``replicas[0]``) is in sync but does not lead is given back to it (leader
  epoch + 1), Kafka's auto.leader.rebalance.enable.
- ``"reassign"``: the partition moves to the least loaded live broker (leader epoch + 1). With one
  replica the new leader starts from an empty log: only right for partitions whose data does not
  matter, or once replicas exist (the replication issue picks from the ISR).

Reassignment (Kafka's KIP-455, ``reassign``: the operator's ``tailrace partitions reassign`` and
``cluster decommission``). One fenced write adds the new replicas: ``replicas`` = the target, then
the old ones not in it; ISR unchanged; ``target`` set (cluster/metadata.py). Each listed broker's
router follows the leader (router/replicas.py), the new ones from an empty log, and the leader
writes them into the ISR once caught up. Then ``reconcile`` finishes it in one more fenced write:
``replicas`` = the target, the ISR cut to it, and leadership, if the leader is not in the target,
to the first target replica (in sync, so it holds every acknowledged record; leader epoch + 1).
It composes with the rules above: a lost leader is elected first (from the union, target first)
and the reassignment finishes on a later pass; the preferred-leader move waits while one is
pending (Kafka's rebalancer skips reassigning partitions too), so leadership moves once, not twice.

``reconcile()`` is idempotent, computed from what etcd holds now (live brokers, assignments), so
a new controller finishes whatever its predecessor left half done. ``ControllerLoop`` runs
campaign and reconcile on a thread, woken by a watch of the brokers, the topics and the controller
key, and by changes (an ISR grown) of partitions with a reassignment pending.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

import msgspec

from .assign import partition_counts, place, place_replicas
from .errors import ClusterError, InvalidReassignment, MetadataConflict, NoLiveBrokers, NotController, NotEnoughBrokers
from .etcd import Etcd, TxnResult, absent, create_revision_is, delete_op, get_op, mod_revision_is, put_op
from .membership import Membership
from .metadata import (NO_LEADER, ControllerInfo, PartitionAssignment, TopicMeta, decode, encode, read_assignments,
                       read_brokers, read_controller, read_loads, read_topics, reassigning)

log = logging.getLogger("tailrace.cluster.controller")
LOST_POLICIES = ("offline", "reassign")
STOP_POLL_S = 0.25  # ControllerLoop waits for changes in slices this long, so stop() returns at once
MAX_KEYS_PER_TXN = 100  # etcd refuses a transaction of more than --max-txn-ops (128 by default) ops
REASSIGN_TRIES = 5  # a reassignment read and written again when a partition changed under it (an ISR write)


class Controller:
    def __init__(self, etcd: Etcd, membership: Membership, lost_policy: str = "offline", rebalance_leaders: bool = False):
        if lost_policy not in LOST_POLICIES:
            raise ValueError(f"lost_policy={lost_policy!r} is not one of {LOST_POLICIES}")
        self.etcd = etcd
        self.membership = membership
        self.keys = membership.keys
        self.broker_id = membership.info.id
        self.lost_policy = lost_policy
        self.rebalance_leaders = rebalance_leaders  # give leadership back to the preferred replica once it is in sync
        self.epoch = 0  # our controller epoch while we believe we are controller, else 0
        self.elections: list[tuple[str, int, int, int]] = []  # (topic, partition, leader, leader epoch) written, newest last
        self.unclean: list[dict] = []  # the unclean elections this controller made, newest last (STATUS shows them)

    @property
    def is_controller(self) -> bool:
        return self.epoch > 0

    def campaign(self) -> bool:
        """Try to become controller (create-if-absent under our lease); True if we are."""
        if self.membership.fenced:
            self.epoch = 0
            return False
        me = encode(ControllerInfo(broker=self.broker_id))
        r = self.etcd.txn([absent(self.keys.controller)], [put_op(self.keys.controller, me, self.membership.lease)],
                          [get_op(self.keys.controller)])
        if r.succeeded:
            self.epoch = r.revision  # the transaction's revision is the key's create revision
            return True
        held = r.kvs(0)
        # our own key from an earlier campaign (a controller that lost track of its epoch)
        if held and held[0].lease == self.membership.lease and held[0].value == me:
            self.epoch = held[0].create_revision
            return True
        self.epoch = 0
        return False

    def resign(self) -> None:
        """Give the role up (the key deleted only if it is still ours)."""
        if self.epoch:
            self.etcd.txn([create_revision_is(self.keys.controller, self.epoch)], [delete_op(self.keys.controller)])
        self.epoch = 0

    def write(self, compares: list[dict], ops: list[dict]) -> TxnResult:
        """One fenced controller write: ``ops`` if our epoch holds and every one of ``compares``
        does. Raises NotController (deposed, and now knows it) or MetadataConflict."""
        if not self.epoch:
            raise NotController(f"broker={self.broker_id} is not the controller")
        r = self.etcd.txn([create_revision_is(self.keys.controller, self.epoch), *compares], ops,
                          [get_op(self.keys.controller)])
        if r.succeeded:
            return r
        held = r.kvs(0)
        if not held or held[0].create_revision != self.epoch:
            now = held[0].create_revision if held else 0
            refused, self.epoch = self.epoch, 0
            raise NotController(f"broker={self.broker_id}'s controller epoch={refused} is over (controller key "
                                f"create_revision={now}): its write was refused")
        raise MetadataConflict("a compare of the controller write failed (the metadata changed since it was read)")

    def create_topic(self, name: str, partitions: int, config: dict | None = None,
                     replication_factor: int = 1) -> list[PartitionAssignment]:
        """Place a new topic's partitions, ``replication_factor`` distinct live brokers each (the
        first the leader), by replica count, leader count and load, and write the topic and its
        assignments (ISR: every replica, as all start empty). Raises MetadataConflict if the topic
        exists, NotEnoughBrokers if fewer brokers live than the factor asks."""
        if partitions < 1:
            raise ValueError(f"partitions={partitions} must be >= 1")
        topic_key = self.keys.topic(name)  # checks the name
        replica_sets = self._place(name, partitions, replication_factor)
        assignments = [PartitionAssignment(topic=name, partition=p, replicas=r, leader=r[0], leader_epoch=0, isr=list(r),
                                           controller_epoch=self.epoch) for p, r in enumerate(replica_sets)]
        meta = TopicMeta(name=name, partitions=partitions, replication_factor=replication_factor,
                         config=dict(config or {}), controller_epoch=self.epoch)
        ops = [put_op(self.keys.partition(name, a.partition), encode(a)) for a in assignments]
        ops.append(put_op(topic_key, encode(meta)))  # last: a topic key means all its partitions are written
        for i in range(0, len(ops), MAX_KEYS_PER_TXN):
            try:
                self.write([absent(topic_key)], ops[i:i + MAX_KEYS_PER_TXN])
            except MetadataConflict:
                raise MetadataConflict(f"topic={name!r} exists already") from None
        return assignments

    def _place(self, name: str, n: int, rf: int) -> list[list[int]]:
        """Replica sets for ``n`` new partitions of ``name`` over the live brokers."""
        if rf < 1:
            raise ValueError(f"replication_factor={rf} must be >= 1")
        live = read_brokers(self.etcd, self.keys)
        if not live:
            raise NoLiveBrokers(f"no broker is registered: topic={name!r} cannot be placed")
        if rf > len(live):
            raise NotEnoughBrokers(f"replication_factor={rf} for topic={name!r} needs {rf} live brokers; "
                                   f"{len(live)} are registered ({sorted(live)})")
        current, _ = read_assignments(self.etcd, self.keys)
        counts = partition_counts(live, (a.replicas for a, _ in current.values()))
        leaders = partition_counts(live, ([a.leader] for a, _ in current.values()))
        return place_replicas(counts, n, rf, read_loads(self.etcd, self.keys), leaders)

    def _topic(self, name: str) -> tuple[TopicMeta, int]:
        """The topic's metadata and its key's mod revision; MetadataConflict if it does not exist."""
        kv = self.etcd.get(self.keys.topic(name))
        if kv is None:
            raise MetadataConflict(f"topic={name!r} does not exist")
        return decode(kv, TopicMeta), kv.mod_revision

    def delete_topic(self, name: str) -> TopicMeta:
        """Delete a topic's metadata: its key and every partition's assignment, in one fenced
        transaction (its partitions' leaders see the DELETEs and drop the topic's data)."""
        meta, rev = self._topic(name)
        self.write([mod_revision_is(self.keys.topic(name), rev)],
                   [delete_op(self.keys.topic(name)), delete_op(self.keys.partitions_of(name), prefix=True)])
        return meta

    def create_partitions(self, name: str, total: int) -> list[PartitionAssignment]:
        """Grow a topic to ``total`` partitions, the new ones placed on live brokers by count
        (Kafka's CreatePartitions); the topic's new count is written with them."""
        meta, rev = self._topic(name)
        if total <= meta.partitions:
            raise ValueError(f"partitions={total}: a topic only grows; topic {name!r} has {meta.partitions}")
        replica_sets = self._place(name, total - meta.partitions, meta.replication_factor)
        added = [PartitionAssignment(topic=name, partition=meta.partitions + i, replicas=r, leader=r[0], leader_epoch=0,
                                     isr=list(r), controller_epoch=self.epoch) for i, r in enumerate(replica_sets)]
        grown = TopicMeta(name=name, partitions=total, replication_factor=meta.replication_factor, config=meta.config,
                          controller_epoch=meta.controller_epoch)
        ops = [put_op(self.keys.partition(name, a.partition), encode(a)) for a in added]
        for i in range(0, len(ops), MAX_KEYS_PER_TXN):
            self.write([mod_revision_is(self.keys.topic(name), rev)], ops[i:i + MAX_KEYS_PER_TXN])
        self.write([mod_revision_is(self.keys.topic(name), rev)], [put_op(self.keys.topic(name), encode(grown))])
        return added

    def alter_config(self, name: str, changes: dict) -> TopicMeta:
        """Set (None: remove) settings of a topic's config, compared against the version read."""
        meta, rev = self._topic(name)
        config = {**meta.config, **{k: v for k, v in changes.items() if v is not None}}
        for k, v in changes.items():
            if v is None:
                config.pop(k, None)
        new = TopicMeta(name=name, partitions=meta.partitions, replication_factor=meta.replication_factor,
                        config=config, controller_epoch=meta.controller_epoch)
        self.write([mod_revision_is(self.keys.topic(name), rev)], [put_op(self.keys.topic(name), encode(new))])
        return new

    def reassign(self, name: str, partition: int, replicas: list[int]) -> PartitionAssignment:
        """Move one partition's replicas to ``replicas`` (``reassign_partitions`` of one)."""
        return self.reassign_partitions(name, {partition: replicas})[0]

    def reassign_partitions(self, name: str, targets: dict[int, list[int]]) -> list[PartitionAssignment]:
        """Start moving partitions of ``name`` to new replicas, ``{partition: [broker ids]}`` (the
        first the preferred leader): Kafka's AlterPartitionReassignments. Every target is checked
        before anything is written (InvalidReassignment: none, a broker twice, one not live, a
        partition the topic lacks; MetadataConflict: no such topic). Each partition's write is
        ``replicas`` = target + the old ones not in it, ISR unchanged, ``target`` set, compared on
        its mod revision; ``reconcile`` finishes it once the target is in sync. A target equal to
        the replicas (none pending) or to the pending target changes nothing; another replaces
        the pending one (what the earlier target added stays listed until this one finishes).
        Returns each partition's assignment as written (or as it is, when nothing changed)."""
        if not targets:
            raise InvalidReassignment(f"topic={name!r}: no partition to reassign")
        live = read_brokers(self.etcd, self.keys)
        for p, replicas in sorted(targets.items()):
            where = f"topic={name!r} partition={p}"
            if not replicas:
                raise InvalidReassignment(f"{where}: a reassignment names at least 1 broker")
            if len(set(replicas)) != len(replicas):
                raise InvalidReassignment(f"{where}: replicas={list(replicas)} names a broker twice")
            gone = [b for b in replicas if b not in live]
            if gone:
                raise InvalidReassignment(f"{where}: broker(s) {gone} are not registered (live brokers: {sorted(live)})")
        meta, _ = self._topic(name)
        missing = sorted(p for p in targets if not 0 <= p < meta.partitions)
        if missing:
            raise InvalidReassignment(f"topic={name!r} has {meta.partitions} partitions: no partition {missing}")
        for attempt in range(REASSIGN_TRIES):
            current, _ = read_assignments(self.etcd, self.keys, name)
            out, writes = [], []
            for p, replicas in sorted(targets.items()):
                if (name, p) not in current:
                    raise InvalidReassignment(f"topic={name!r} partition={p} has no assignment in the cluster")
                a, rev = current[(name, p)]
                target = [int(b) for b in replicas]
                if (target == a.replicas and not a.target) or target == a.target:
                    out.append(a)  # there already, or on its way there
                    continue
                new = msgspec.structs.replace(a, replicas=[*target, *(b for b in a.replicas if b not in target)],
                                              target=target, controller_epoch=self.epoch)
                out.append(new)
                writes.append((new, rev))
            try:
                for i in range(0, len(writes), MAX_KEYS_PER_TXN):
                    chunk = writes[i:i + MAX_KEYS_PER_TXN]
                    self.write([mod_revision_is(self.keys.partition(name, a.partition), rev) for a, rev in chunk],
                               [put_op(self.keys.partition(name, a.partition), encode(a)) for a, _ in chunk])
            except MetadataConflict:
                if attempt == REASSIGN_TRIES - 1:
                    raise
                continue  # an ISR write (or reconcile) got there first: read again (a chunk written stays)
            for a, _ in writes:
                log.info("partition %s/%d: reassignment to %s started (replicas now %s, ISR %s)", a.topic, a.partition,
                         a.target, a.replicas, a.isr)
            return out
        raise AssertionError("unreachable")

    def reconcile(self) -> list[PartitionAssignment]:
        """Bring every assignment in line with the live brokers (see the module docstring); the
        assignments written. Raises NotController if deposed meanwhile."""
        live = read_brokers(self.etcd, self.keys)
        current, _ = read_assignments(self.etcd, self.keys)
        unclean = {name for name, (meta, _) in read_topics(self.etcd, self.keys).items()
                   if int(meta.config.get("unclean.leader.election.enable", 0) or 0)}
        counts = partition_counts(live, (a.replicas for a, _ in current.values()))
        changed: list[tuple[PartitionAssignment, int]] = []
        for (_topic, _p), (a, mod_revision) in sorted(current.items()):
            new = self._decide(a, live, counts, a.topic in unclean)
            if new is not None:
                changed.append((new, mod_revision))
        for i in range(0, len(changed), MAX_KEYS_PER_TXN):
            chunk = changed[i:i + MAX_KEYS_PER_TXN]
            self.write([mod_revision_is(self.keys.partition(a.topic, a.partition), rev) for a, rev in chunk],
                       [put_op(self.keys.partition(a.topic, a.partition), encode(a)) for a, _ in chunk])
        for a, _ in changed:
            self.elections.append((a.topic, a.partition, a.leader, a.leader_epoch))
        del self.elections[:-100]
        return [a for a, _ in changed]

    def _decide(self, a: PartitionAssignment, live: dict, counts: dict[int, int],
                unclean: bool = False) -> PartitionAssignment | None:
        """The partition's next assignment, or None if it stays as it is."""
        def moved(**changes) -> PartitionAssignment:
            return msgspec.structs.replace(a, controller_epoch=self.epoch, **changes)

        if a.leader in live:
            # A replica whose broker is gone leaves the ISR at once (KRaft's fencing), so acks=all
            # and the high watermark stop waiting for it; it comes back by catching up.
            isr = [b for b in a.isr if b in live]
            if a.target and all(b in isr for b in a.target):
                return self._finish(a, isr, moved)
            preferred = a.replicas[0]
            if (self.rebalance_leaders and not a.target and preferred != a.leader and preferred in isr
                    and len(a.replicas) > 1 and a.leader in isr):
                # Kafka's preferred-leader election: leadership back where placement put it, so
                # leaders stay spread after failovers; the preferred replica is in sync, so it
                # holds everything acknowledged with acks=all
                return moved(leader=preferred, isr=isr, leader_epoch=a.leader_epoch + 1)
            if len(a.replicas) > 1 and len(isr) < len(a.isr) and a.leader in isr:
                return moved(isr=isr)
            return None
        epoch = a.leader_epoch + 1
        if self.lost_policy == "reassign":
            if not counts:
                return None  # no live broker: nothing to move to
            (b,) = place(counts, 1)
            counts[b] += 1
            return moved(replicas=[b], leader=b, isr=[b], leader_epoch=epoch, target=[])
        # Kafka's election: the first replica (preferred order) in the ISR whose broker lives; the
        # ISR loses the brokers that are gone. Every ISR member holds every acknowledged record
        # (the high watermark waits for all of them), so none is lost; what the new leader holds
        # past it stays and becomes committed as followers copy it; a follower holding more than
        # the new leader cuts its copy back by leader epoch (actors/epochs.py, router/replicas.py).
        in_sync = [b for b in a.replicas if b in (a.isr or a.replicas) and b in live]
        if in_sync:
            return moved(leader=in_sync[0], isr=in_sync, leader_epoch=epoch)
        alive = [b for b in a.replicas if b in live]
        if unclean and alive:  # Kafka's unclean.leader.election.enable: availability over what was acknowledged
            log.warning("partition %s/%d: UNCLEAN leader election: broker %d, not in the ISR %s, leads at epoch %d; "
                        "records acknowledged by the lost ISR and not copied to it are LOST", a.topic, a.partition,
                        alive[0], a.isr, epoch)
            self.unclean.append({"topic": a.topic, "partition": a.partition, "leader": alive[0], "leader_epoch": epoch,
                                 "lost_isr": list(a.isr), "at": time.time()})
            del self.unclean[:-100]
            return moved(leader=alive[0], isr=[alive[0]], leader_epoch=epoch)
        if a.leader == NO_LEADER:
            return None  # offline already: the ISR is kept, so the first of it to come back leads
        return moved(leader=NO_LEADER, leader_epoch=epoch)

    @staticmethod
    def _finish(a: PartitionAssignment, isr: list[int], moved) -> PartitionAssignment:
        """A reassignment whose target is all in sync: replicas = the target, the ISR cut to it,
        and a leader outside it replaced by the first target replica (in the ISR, so it holds
        every acknowledged record; leader epoch + 1). The removed replicas' routers stop
        following it, and a removed leader's router has its worker stand down (router/replicas.py)."""
        target = list(a.target)
        leader, epoch = a.leader, a.leader_epoch
        if leader not in target:
            leader, epoch = next(b for b in target if b in isr), epoch + 1
        log.info("partition %s/%d: reassignment finished: replicas %s -> %s, leader %d (epoch %d)", a.topic, a.partition,
                 a.replicas, target, leader, epoch)
        return moved(replicas=target, isr=[b for b in target if b in isr], leader=leader, leader_epoch=epoch, target=[])


class ControllerLoop:
    """A broker's controller duties on a thread: campaign while there is no controller, reconcile
    while we are it, woken by changes to the brokers, topics or the controller key, and to
    partitions being reassigned (and every ``resync_s`` regardless). ``epochs`` lists each epoch
    this loop won, in order (for tests and status)."""

    def __init__(self, controller: Controller, resync_s: float = 1.0, retry_s: float = 0.2):
        self.controller = controller
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.epochs: list[int] = []
        self.errors: list[str] = []  # the last few unexpected errors, newest last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"controller {controller.broker_id}", daemon=True)

    def start(self) -> "ControllerLoop":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        c = self.controller
        watch = None
        try:
            while not self._stop.is_set():
                try:
                    if watch is None:
                        _, revision = c.etcd.get_prefix(c.keys.controller)
                        watch = c.etcd.watch_prefix(c.keys.root, revision + 1, retry_s=self.retry_s)
                    self._step(c)
                except ClusterError as e:
                    self._note(e)
                    self._stop.wait(self.retry_s)
                    continue
                if self._woken(watch):
                    watch.stop()
                    watch = None
        finally:
            if watch is not None:
                watch.stop()

    def _step(self, c: Controller) -> None:
        if c.membership.fenced:
            c.epoch = 0
            return
        if not c.is_controller and read_controller(c.etcd, c.keys) is None and c.campaign():
            self.epochs.append(c.epoch)
        if c.is_controller:
            try:
                c.reconcile()
            except NotController:
                pass  # deposed: campaign again when the key is free
            except MetadataConflict:
                pass  # something changed under us: the next round reads again

    def _woken(self, watch) -> bool:
        """Wait for a change that matters (or ``resync_s``); True if the watch was compacted and
        must be made again."""
        keys = self.controller.keys
        deadline = time.monotonic() + self.resync_s
        while not self._stop.is_set():  # in short waits: a stop is seen within STOP_POLL_S
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            batch = watch.get(min(left, STOP_POLL_S))
            if batch is None:
                continue
            if batch.compacted:
                return True
            if any(self._matters(e.kv, keys) for e in batch.events):
                return False
        return False

    @staticmethod
    def _matters(kv, keys) -> bool:
        """A change reconcile may act on: a broker, a topic, the controller key, or a partition
        with a reassignment pending (its ISR grew: it may be finished now). Other partition
        changes (ISR writes, our own writes) wait for the next resync: waking on each would be a
        full read of every assignment per ISR change."""
        if kv.key == keys.controller or kv.key.startswith((keys.brokers, keys.topics)):
            return True
        return kv.key.startswith(keys.partitions) and reassigning(kv.value)

    def _note(self, e: Exception) -> None:
        self.errors = [*self.errors[-9:], f"{type(e).__name__}: {e}"]


def leaders_by_broker(assignments: Iterable[PartitionAssignment]) -> dict[int, list[tuple[str, int]]]:
    """broker id -> the (topic, partition)s it leads (NO_LEADER for the unavailable ones)."""
    out: dict[int, list[tuple[str, int]]] = {}
    for a in assignments:
        out.setdefault(a.leader, []).append((a.topic, a.partition))
    return out
