"""The router's part in a cluster (``--cluster``): registration, the controller role, and the view.

Made only when ``settings.cluster`` is set (router/server.py imports this module then and only
then, so a single host never imports etcd's client). One ``ClusterAgent`` per router process:

- **Registration**: ``/tailrace/<c>/brokers/<id>`` under a lease (cluster/membership.py), with the
  advertised client endpoint. A restarted router waits for its previous lease to run out.
- **Controller**: ``ControllerLoop`` (cluster/controller.py) on a thread campaigns and reconciles.
  The router calls ``create_topic`` itself when it is the controller (a CREATE_TOPIC request).
- **The view**: a watch of the cluster's keys keeps ``brokers``, ``topics``, ``assignments`` and
  ``controller`` current. The watch thread builds new dicts and swaps them in whole: the router's
  thread reads them without a lock (a reference read is atomic) and never sees a half-made one.
  While etcd is unreachable the view stays as last read: the data path keeps serving by it.
- **Load**: the router's traffic rates (bytes in and out per second), published under the lease
  every ``LOAD_PUBLISH_S`` for the controller's placement (cluster/assign.py).
- **The fence**: a partition the controller could give to another broker (``movable``) is served
  only while the registration's lease is known alive (cluster/membership.py's own-clock
  deadline): a broker cut off from etcd longer than its TTL stops taking requests for it until it
  has registered again and read its assignments afresh (REPLICATION.md 2.2.8). A one-replica
  partition under the ``offline`` policy has no other possible leader and keeps being served.

- **Access control** (with ``--auth curve`` above all): the cluster's allow-list, ACL rules and
  quotas in etcd (cluster/access.py) are part of the view, and the watch thread writes them into
  the data directory (``auth/cluster-clients/``, ``auth/acls.json``, ``auth/quotas.json``), where
  the router and the workers read them as on a single host. The registration carries the broker's
  server key and its router's client key: a broker whose server key differs from the live
  brokers' does not join (``ClusterKeyMismatch``), and ``broker_keys()`` gives the router the
  other brokers' keys to let in as ``broker/<id>``.

The router thread learns of topics to mirror into its catalog through ``take_changes()`` (the
names whose metadata changed since the last call).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import msgspec

from tailrace.broker import acl as acl_mod
from tailrace.broker import auth as auth_mod
from tailrace.broker import datadir
from tailrace.broker import quota as quota_mod
from tailrace.broker import settings as settings_mod
from tailrace.cluster.controller import Controller, ControllerLoop
from tailrace.cluster.errors import ClusterError, ClusterIdentityMismatch, ClusterKeyMismatch
from tailrace.cluster.etcd import Etcd, Event, mod_revision_is, put_op
from tailrace.cluster.membership import Membership
from tailrace.cluster.metadata import (NO_LEADER, BrokerInfo, BrokerLoad, ControllerInfo, PartitionAssignment, TopicMeta,
                                       decode, encode, read_brokers)

log = logging.getLogger("tailrace.router")

ETCD_TIMEOUT_S = 1.0  # an etcd call the router thread makes (topic creation) waits at most this long
LOAD_PUBLISH_S = 10.0  # how often the broker writes its measured traffic for the controller's placement
RESYNC_S = 15.0  # the controller reconciles at least this often (cluster/controller.py ControllerLoop)
DEFAULT_MIN_ISR = 2  # min.insync.replicas when a topic does not set it (at most its replication factor)


class ClusterAgent:
    def __init__(self, s: settings_mod.Settings):
        self.s = s
        self.me = s.broker_id
        self.endpoint = s.advertised
        self.etcd = Etcd(s.cluster, timeout_s=ETCD_TIMEOUT_S)
        info = BrokerInfo(id=s.broker_id, endpoints=[self.endpoint], rack=s.rack or None)
        if s.auth == "curve":
            info.server_key = auth_mod.server_keys(s.data_dir)[0].decode("ascii")
            info.router_key = auth_mod.router_client_keys(s.data_dir).public.decode("ascii")
        self.membership = Membership(self.etcd, s.cluster_name, info, ttl_s=s.cluster_ttl_s, on_fenced=self._fenced)
        self.fetcher = None  # the router's ReplicaFetcher (router/replicas.py), for status
        self._isr_writes: set = set()  # (topic, partition) whose ISR write is out
        self._isr_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isr writes")
        self.keys = self.membership.keys
        self.controller = Controller(self.etcd, self.membership, rebalance_leaders=bool(s.auto_leader_rebalance))
        # woken at once by brokers coming and going (its watch); the periodic pass only catches up after
        # errors, and reads every assignment, so it is rare (10,000 partitions are a few MB of JSON)
        self.loop = ControllerLoop(self.controller, resync_s=RESYNC_S)
        # the view: replaced whole by the watch thread (see the module docstring)
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicMeta] = {}
        self.topic_ids: dict[str, int] = {}  # name -> the topic key's create revision (its id in the cluster)
        self.assignments: dict[tuple[bytes, int], PartitionAssignment] = {}
        self.controller_id = -1
        self.controller_epoch = 0
        self.revision = 0  # the etcd revision the view is complete up to
        self.synced = threading.Event()  # set once the view was read after the last registration
        self._changed: set[str] = set()
        self._full_read = False  # the view was read whole since take_changes last said so
        self._lock = threading.Lock()  # guards _changed and _full_read only
        # the cluster's access control as last read (cluster/access.py): key -> value, mirrored into the data dir
        self._access: dict[str, bytes] = {}
        self._mirror_due = False
        self.load = BrokerLoad()  # the router's latest rates (``measured``), published every LOAD_PUBLISH_S
        self._next_load = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cluster view", daemon=True)

    # --- life ------------------------------------------------------------------------------
    def start(self) -> "ClusterAgent":
        self._check_identity()
        self.membership.register(wait_s=self.s.cluster_ttl_s + 2)  # a restarted router's old lease runs out
        try:
            self._check_keys()
        except ClusterError:
            self.membership.close(revoke=True)
            raise
        log.info("cluster %s: registered broker %d at %s (lease %x, ttl %d s)", self.s.cluster_name, self.me,
                 self.endpoint, self.membership.lease, self.s.cluster_ttl_s)
        self._thread.start()
        self.loop.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.loop.stop()
        if self.controller.is_controller:
            try:
                self.controller.resign()
            except ClusterError:
                pass
        self._isr_pool.shutdown(wait=False, cancel_futures=True)
        self.membership.close(revoke=True)
        self._thread.join(timeout=5)

    def _check_identity(self) -> None:
        """The data directory joins one cluster for good: the first join records the cluster's
        name and etcd's cluster id (``cluster.json``), and a later start with another (a mistyped
        --cluster-name, another etcd, a rebuilt one) is refused, since a full read of a cluster
        that lacks this broker's topics deletes them (router/topics.py mirror_topic). Removing
        the file is how an operator moves a broker to another cluster on purpose."""
        path = os.path.join(self.s.data_dir, datadir.CLUSTER_FILE)
        mine = {"cluster": self.s.cluster_name, "etcd_cluster_id": self.etcd.cluster_id()}
        try:
            with open(path, "rb") as f:
                stored = json.loads(f.read())
        except FileNotFoundError:
            datadir.write_atomic(path, json.dumps(mine).encode())
            return
        except ValueError:
            stored = None
        if stored != mine:
            raise ClusterIdentityMismatch(
                f"{self.s.data_dir} belongs to cluster {stored} and this start would join {mine}: refused, since "
                f"joining would delete the topics that cluster does not know (remove {path} to move this broker "
                "to the other cluster on purpose)")

    def _check_keys(self) -> None:
        """Every broker of a cluster has the same auth and the same server key: a client gives one
        ``server_key`` and follows leaders to any broker. A broker that differs does not join."""
        mine = self.membership.info.server_key
        for b in read_brokers(self.etcd, self.keys).values():
            if b.id != self.me and b.server_key != mine:
                what = ("--auth curve" if b.server_key else "no --auth") if bool(b.server_key) != bool(mine) else \
                    "another server key"
                raise ClusterKeyMismatch(
                    f"broker {b.id} of cluster {self.s.cluster_name} runs with {what}: every broker needs the same auth and, "
                    f"with curve, the same server key pair (copy auth/server.key and auth/server.key_secret from a "
                    f"member's data directory into {self.s.data_dir}/auth before its first start)")

    def measured(self, bytes_in_per_s: float, bytes_out_per_s: float) -> None:
        """The router's traffic rates (each heartbeat), for the next load publication."""
        self.load = BrokerLoad(bytes_in_per_s=bytes_in_per_s, bytes_out_per_s=bytes_out_per_s, at=time.time())

    def _publish_load(self, now: float) -> None:
        """Every LOAD_PUBLISH_S: the broker's measured traffic under its lease (cluster/assign.py
        weighs it); skipped while fenced (no lease to write under)."""
        if now < self._next_load or self.membership.fenced:
            return
        self._next_load = now + LOAD_PUBLISH_S
        self.etcd.put(self.keys.load(self.me), encode(self.load), lease=self.membership.lease)

    def broker_keys(self) -> dict[str, str]:
        """The other brokers' router keys (Z85) -> their principals (``broker/<id>``), as registered."""
        return {b.router_key: f"{auth_mod.BROKER_PREFIX}{b.id}" for b in self.brokers.values()
                if b.router_key and b.id != self.me}

    def _fenced(self, reason: str) -> None:
        log.error("cluster: broker %d fenced (%s): partitions that may move are refused until it has registered "
                  "again", self.me, reason)

    # --- questions the router asks (its own thread) ----------------------------------------
    @property
    def fenced(self) -> bool:
        return self.membership.fenced

    def assignment(self, topic: bytes, partition: int) -> PartitionAssignment | None:
        return self.assignments.get((topic, partition))

    def movable(self, a: PartitionAssignment) -> bool:
        """Whether the controller could give this partition to another broker while this one is
        cut off: it has other replicas, or lost partitions are reassigned. One whose only replica
        is here under the ``offline`` policy can have no other leader: serving it while fenced
        cannot split it, so the data path keeps serving it whatever etcd's state."""
        return len(a.replicas) > 1 or self.controller.lost_policy != "offline"

    def _serves(self, a: PartitionAssignment) -> bool:
        if a.leader != self.me:
            return False
        return not self.movable(a) or (not self.membership.fenced and self.synced.is_set())

    def leads(self, topic: bytes, partition: int) -> bool:
        a = self.assignments.get((topic, partition))
        return a is not None and self._serves(a)

    def managed(self, topic: bytes) -> bool:
        """Whether the topic is the cluster's (its partitions placed by the controller); the
        broker's own topics (``__consumer_offsets``) are not."""
        return (topic, 0) in self.assignments

    def endpoint_of(self, broker: int) -> str:
        b = self.brokers.get(broker)
        return b.endpoints[0] if b is not None and b.endpoints else ""

    def refusal(self, topic: bytes, partition: int) -> tuple[str, str] | None:
        """Why this broker does not serve ``topic``/``partition`` now, and the endpoint to ask
        instead (``""``: none); None when it does (or the topic is not the cluster's)."""
        a = self.assignments.get((topic, partition))
        if a is None:
            return None
        if a.leader == self.me:
            if not self._serves(a):
                return (f"broker {self.me} is fenced (its registration lapsed): partition {topic.decode(errors='replace')}/"
                        f"{partition} is refused until it has registered again", "")
            return None
        name = f"{topic.decode(errors='replace')}/{partition}"
        if a.leader == NO_LEADER:
            return (f"partition {name} has no leader (its broker {a.replicas} is down): unavailable", "")
        ep = self.endpoint_of(a.leader)
        return (f"partition {name} is led by broker {a.leader} ({ep or 'not registered'}), not broker {self.me}", ep)

    def remote_leaders(self, topic: bytes, partitions: int) -> dict[int, list[int]]:
        """Broker id -> the partitions of ``topic`` it leads, for live brokers other than this one."""
        out: dict[int, list[int]] = {}
        for p in range(partitions):
            a = self.assignments.get((topic, p))
            if a is not None and a.leader != self.me and a.leader in self.brokers:
                out.setdefault(a.leader, []).append(p)
        return out

    def take_changes(self) -> tuple[set[str], bool]:
        """Topic names whose metadata changed since the last call (the router mirrors them), and
        whether the view was read whole meanwhile (then a topic the catalog holds from the
        cluster but etcd no longer has was deleted while this broker was not watching)."""
        if not self._changed and not self._full_read:
            return set(), False
        with self._lock:
            changed, self._changed = self._changed, set()
            full, self._full_read = self._full_read, False
        return changed, full

    def min_isr(self, topic: bytes) -> int:
        """The topic's min.insync.replicas (default 2, at most its replication factor)."""
        meta = self.topics.get(topic.decode())
        if meta is None:
            return 1
        return int(meta.config.get("min.insync.replicas", min(DEFAULT_MIN_ISR, meta.replication_factor)))

    def propose_isr(self, topic: bytes, partition: int, isr: list[int]) -> None:
        """As a partition's leader: write the ISR its worker wants (actors/replication.py) to etcd,
        on the ISR thread; one write per partition at a time (the next PING asks again)."""
        key = (topic, partition)
        if key in self._isr_writes or self.membership.fenced:
            return
        self._isr_writes.add(key)
        self._isr_pool.submit(self._write_isr, topic.decode(), partition, list(isr), key)

    def _write_isr(self, topic: str, partition: int, isr: list[int], key) -> None:
        """A compare-and-swap of the partition's assignment: only while this broker leads it
        at the leader epoch read (the controller's writes compare the same revision)."""
        try:
            kv = self.etcd.get(self.keys.partition(topic, partition))
            if kv is None:
                return
            a = decode(kv, PartitionAssignment)
            if a.leader != self.me or sorted(a.isr) == sorted(isr) or self.membership.fenced:
                return
            new = msgspec.structs.replace(a, isr=isr)  # the rest as the controller wrote it (a pending target too)
            r = self.etcd.txn([mod_revision_is(kv.key, kv.mod_revision)], [put_op(kv.key, encode(new))])
            if r.succeeded:
                log.info("partition %s/%d: ISR %s -> %s (leader epoch %d)", topic, partition, a.isr, isr, a.leader_epoch)
        except (ClusterError, ValueError) as exc:
            log.warning("partition %s/%d: ISR %s not written: %s", topic, partition, isr, exc)
        finally:
            self._isr_writes.discard(key)

    def default_replication_factor(self) -> int:
        """A topic created without a factor: the broker's default_replication_factor (3) when that
        many brokers are live, else 1 (the issue's "3 in a cluster of >= 3 brokers")."""
        want = self.s.default_replication_factor
        return want if len(self.brokers) >= want else 1

    def replication_factor(self, topic: bytes) -> int:
        meta = self.topics.get(topic.decode())
        return meta.replication_factor if meta is not None else 1

    def create_topic(self, name: str, partitions: int, config: dict, replication_factor: int = 1) -> list[PartitionAssignment]:
        """As the controller: place and write a new topic (raises ClusterError subclasses), then
        take it into the view at once (the watch brings the same a moment later)."""
        placed = self.controller.create_topic(name, partitions, config, replication_factor)
        topic = name.encode()
        assignments = dict(self.assignments)
        assignments.update({(topic, a.partition): a for a in placed})
        topics = dict(self.topics)
        topics[name] = TopicMeta(name=name, partitions=partitions, replication_factor=replication_factor,
                                 config=dict(config), controller_epoch=self.controller.epoch)
        self.assignments, self.topics = assignments, topics
        return placed

    def delete_topic(self, name: str) -> None:
        """As the controller: delete a topic's metadata, then drop it from the view at once."""
        self.controller.delete_topic(name)
        topic = name.encode()
        self.assignments = {k: a for k, a in self.assignments.items() if k[0] != topic}
        self.topics = {n: m for n, m in self.topics.items() if n != name}
        self.topic_ids = {n: i for n, i in self.topic_ids.items() if n != name}

    def create_partitions(self, name: str, total: int) -> None:
        """As the controller: grow a topic, then take the new partitions into the view at once."""
        added = self.controller.create_partitions(name, total)
        topic = name.encode()
        self.assignments = {**self.assignments, **{(topic, a.partition): a for a in added}}
        meta = self.topics[name]
        self.topics = {**self.topics, name: TopicMeta(name=name, partitions=total, replication_factor=meta.replication_factor,
                                                      config=meta.config, controller_epoch=meta.controller_epoch)}

    def alter_config(self, name: str, changes: dict) -> None:
        """As the controller: change a topic's settings, then take them into the view at once."""
        self.topics = {**self.topics, name: self.controller.alter_config(name, changes)}

    def reassign_partitions(self, name: str, targets: dict[int, list[int]]) -> list[PartitionAssignment]:
        """As the controller: start moving partitions to new replicas (cluster/controller.py
        ``reassign_partitions``), then take the new assignments into the view at once."""
        moved = self.controller.reassign_partitions(name, targets)
        topic = name.encode()
        self.assignments = {**self.assignments, **{(topic, a.partition): a for a in moved}}
        return moved

    def status(self) -> dict:
        """The cluster as this broker sees it (STATUS's ``cluster``)."""
        led: dict[int, int] = {}
        for a in self.assignments.values():
            led[a.leader] = led.get(a.leader, 0) + 1
        return {"broker_id": self.me, "cluster": self.s.cluster_name, "endpoint": self.endpoint,
                "controller": self.controller_id, "controller_epoch": self.controller_epoch,
                "fenced": self.membership.fenced, "brokers": {str(b.id): b.endpoints[0] if b.endpoints else ""
                                                             for b in self.brokers.values()},
                "partitions_led": {str(k): v for k, v in sorted(led.items())},
                "offline": sorted(f"{t.decode()}/{p}" for (t, p), a in self.assignments.items() if a.leader < 0)[:100],
                # the unclean elections this broker made as controller (records only the lost ISR held are gone)
                "unclean_elections": list(self.controller.unclean),
                **({"replication": self.fetcher.status()} if self.fetcher is not None else {})}

    # --- the watch thread --------------------------------------------------------------------
    def _read_all(self) -> None:
        """The whole view afresh, in one read (one revision: a watch from the next one misses
        nothing, which separate reads of brokers, topics and assignments could)."""
        kvs, revision = self.etcd.get_prefix(self.keys.root)
        self._apply([Event("PUT", kv) for kv in kvs], fresh=True)
        self.revision = revision
        with self._lock:
            self._changed |= set(self.topics)
            self._full_read = True

    def _apply(self, events, fresh: bool = False) -> None:
        """Take ``events`` into new dicts of the view (``fresh``: from empty ones, a full read),
        swapped in at the end: the router thread never sees a half-applied or empty view."""
        if fresh:
            brokers, topics, topic_ids, assignments, controller, access = {}, {}, {}, {}, (-1, 0), {}
        else:
            brokers, topics, assignments = dict(self.brokers), dict(self.topics), dict(self.assignments)
            topic_ids = dict(self.topic_ids)
            controller, access = (self.controller_id, self.controller_epoch), dict(self._access)
        changed: set[str] = set()
        for e in events:
            key, put = e.kv.key, e.type != "DELETE"
            try:
                self._take(e, key, put, brokers, topics, topic_ids, assignments, access, changed)
                if key == self.keys.controller:
                    controller = (decode(e.kv, ControllerInfo).broker, e.kv.create_revision) if put else (-1, 0)
            except ValueError as exc:  # a value this version cannot read (msgspec's errors are ValueErrors)
                log.error("cluster: %s at revision %d skipped: %s", key, e.kv.mod_revision, exc)
            self.revision = max(self.revision, e.kv.mod_revision)
        self.brokers, self.topics, self.topic_ids, self.assignments = brokers, topics, topic_ids, assignments
        self.controller_id, self.controller_epoch = controller
        if fresh or access != self._access:
            self._access = access
            self._mirror_due = True  # written by the watch loop, and again until it succeeds
        if changed:
            with self._lock:
                self._changed |= changed

    def _take(self, e, key: str, put: bool, brokers, topics, topic_ids, assignments, access, changed) -> None:
        """One watch event into the view's new dicts (``_apply``); raises ValueError for a value
        that cannot be read (the event is skipped, the others taken)."""
        if key.startswith(self.keys.access):
            if put:
                access[key] = e.kv.value
            else:
                access.pop(key, None)
        elif key.startswith(self.keys.brokers):
            bid = int(key[len(self.keys.brokers):])
            if put:
                brokers[bid] = decode(e.kv, BrokerInfo)
            else:
                brokers.pop(bid, None)
        elif key.startswith(self.keys.topics):
            name = key[len(self.keys.topics):]
            if put:
                topics[name] = decode(e.kv, TopicMeta)
                topic_ids[name] = e.kv.create_revision
            else:
                topics.pop(name, None)
                topic_ids.pop(name, None)
            changed.add(name)
        elif key.startswith(self.keys.partitions):
            name, _, p = key[len(self.keys.partitions):].rpartition("/")
            if put:
                a = decode(e.kv, PartitionAssignment)
                assignments[(name.encode(), a.partition)] = a
            else:
                assignments.pop((name.encode(), int(p)), None)
            changed.add(name)

    def _mirror_access(self) -> bool:
        """Write the cluster's allow-list, ACL rules and quotas into this broker's data directory,
        where its router and workers read them (broker/auth.py, acl.py, quota.py); a file is only
        rewritten when what it says changed. The allow-list first, its removals before its
        additions (a revocation must not wait on a failed write). False if a write failed: tried
        again at the next turn of the watch loop; a value etcd holds that cannot be read leaves
        the last mirrored version in force (logged)."""
        d, k = self.s.data_dir, self.keys
        ok = True
        clients = {}
        for key, value in self._access.items():
            if not key.startswith(k.clients):
                continue
            name = key[len(k.clients):]
            try:
                auth_mod.check_principal_name(name)
                clients[name] = auth_mod.check_public_key(value)
            except ValueError as exc:
                log.error("cluster: allow-list entry %r in etcd left out: %s", name, exc)
        try:
            if auth_mod.sync_allowed(auth_mod.cluster_allow_dir(d), clients):
                log.info("cluster: allow-list mirrored: %d client keys", len(clients))
        except OSError as exc:
            log.error("cluster: allow-list not mirrored into %s (tried again): %s", d, exc)
            ok = False
        for what, key, decode, read, write in (
                ("ACL rules", k.acls, acl_mod.decode_rules, acl_mod.read_rules, acl_mod.write_rules),
                ("quotas", k.quotas, quota_mod.decode_quotas, quota_mod.read_quotas, quota_mod.write_quotas)):
            try:
                wanted = decode(self._access[key]) if key in self._access else []
            except ValueError as exc:  # msgspec's decode errors are ValueErrors
                log.error("cluster: the %s in etcd cannot be read (%s): the last mirrored stay in force", what, exc)
                continue
            try:
                if _stored(read, d) != wanted:
                    write(d, wanted)
                    log.info("cluster: %d %s mirrored", len(wanted), what)
            except OSError as exc:  # a full or read-only disk: the last mirrored stay in force meanwhile
                log.error("cluster: %s not mirrored into %s (tried again): %s", what, d, exc)
                ok = False
        return ok

    def _watch(self) -> None:
        watch = None
        while not self._stop.is_set():
            try:
                if self.membership.fenced and self.membership.fence_reason != "closed":
                    if watch is not None:
                        watch.stop()
                        watch = None
                    self.synced.clear()  # partitions that may have moved wait for the view read afresh
                    self.membership.reregister(wait_s=self.s.cluster_ttl_s + 2)
                    log.info("cluster: broker %d registered again (lease %x)", self.me, self.membership.lease)
                if watch is None:
                    self._read_all()
                    watch = self.etcd.watch_prefix(self.keys.root, self.revision + 1)
                    self.synced.set()
                if self._mirror_due:
                    self._mirror_due = not self._mirror_access()
                self._publish_load(time.monotonic())
                batch = watch.get(0.5)
                if batch is None:
                    continue
                if batch.compacted:
                    watch.stop()
                    watch = None
                    continue
                self._apply(batch.events)
            except ClusterError as exc:
                log.warning("cluster: %s: %s (the view stays as last read)", type(exc).__name__, exc)
                self._stop.wait(0.5)
            except Exception:  # noqa: BLE001 - the view thread must outlive any one bad value
                log.exception("cluster view: unexpected error")
                self._stop.wait(1.0)
        if watch is not None:
            watch.stop()


def _stored(read, data_dir: str):
    try:
        return read(data_dir)
    except (OSError, ValueError):  # unreadable (msgspec's errors are ValueErrors): written afresh
        return None


def wait_synced(agent: ClusterAgent, timeout_s: float) -> bool:
    """Wait until the agent has read the view once (router start)."""
    deadline = time.monotonic() + timeout_s
    while not agent.synced.wait(0.1):
        if time.monotonic() >= deadline:
            return False
    return True
