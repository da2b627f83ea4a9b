"""The cluster's metadata in etcd: every key name and every value's schema, declared once.

All keys of cluster ``<c>`` sit under ``/tailrace/<c>/``::

    /tailrace/<c>/brokers/<id>            BrokerInfo (JSON), under the broker's lease
    /tailrace/<c>/controller              ControllerInfo (JSON), under the controller broker's lease;
                                          its create revision is the controller epoch
    /tailrace/<c>/topics/<name>           TopicMeta (JSON); its create revision is the topic id
    /tailrace/<c>/partitions/<name>/<p>   PartitionAssignment (JSON), one key per partition
    /tailrace/<c>/load/<id>               BrokerLoad (JSON), under the broker's lease, every 10 s
    /tailrace/<c>/access/acls             the ACL rules, as <data-dir>/auth/acls.json (broker/acl.py)
    /tailrace/<c>/access/quotas           the quotas, as <data-dir>/auth/quotas.json (broker/quota.py)
    /tailrace/<c>/access/clients/<name>   one allowed client's public key (Z85): principal <name>

Values are JSON text (readable with ``etcdctl get --prefix /tailrace/``). Only the controller
writes topics and partitions, each write a transaction that compares the controller epoch
(cluster/controller.py); each broker writes its own registration; nobody writes the controller
key but by a create-if-absent transaction. The operator's commands write ``access/``
(cluster/access.py: ``tailrace acl|quota|keys ... --cluster``), each change a compare-and-swap on
what it read; every broker mirrors it into its data directory (router/cluster_agent.py). Records
and committed offsets never go into etcd.

A partition's ``target`` is a reassignment in progress (Kafka's KIP-455, cluster/controller.py
``reassign``): the replicas it moves to, the preferred leader first; empty when none is pending
(a value written before the field existed reads as none). While it is pending ``replicas`` is the
target followed by the old replicas not in it (every broker listed copies the partition, the new
ones from an empty log), and the controller finishes it (``replicas`` = the target, the ISR cut to
it, leadership moved into it if need be) once every target replica is in the ISR.

Vocabulary: *controller epoch* = create revision of the controller key (grows with every new
controller: revisions only grow); *leader epoch* = a partition's count of leader changes, from 0,
bumped by every change of its leader (the number a broker will stamp in the batches it leads and
check in requests); *topic id* = create revision of the topic key (a name deleted and made again
gets a new one).
"""

from __future__ import annotations

import msgspec

from tailrace.broker.catalog import valid_topic_name

from .etcd import Etcd, KeyValue

ROOT = "/tailrace"
NO_LEADER = -1  # Kafka's: a partition whose only replicas are gone has no leader (unavailable)


class BrokerInfo(msgspec.Struct):
    id: int
    endpoints: list[str]  # the router's client endpoints (its --bind), as clients reach them
    rack: str | None = None
    started: float = 0.0  # unix time in seconds the broker registered
    # with --auth curve (Z85 public keys): the broker's server key (one for the whole cluster:
    # clients give one server_key) and its router's client key (other brokers let it in as "broker/<id>")
    server_key: str = ""
    router_key: str = ""


class BrokerLoad(msgspec.Struct):
    """What a broker measured of its traffic (its router's rates over the last 5 s), which the
    controller weighs when it places partitions (cluster/assign.py)."""
    bytes_in_per_s: float = 0.0
    bytes_out_per_s: float = 0.0
    at: float = 0.0  # unix time in seconds of the measurement

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_in_per_s + self.bytes_out_per_s


class ControllerInfo(msgspec.Struct):
    broker: int  # the controller broker's id


class TopicMeta(msgspec.Struct):
    name: str
    partitions: int
    replication_factor: int = 1
    config: dict[str, int | str] = {}
    controller_epoch: int = 0  # the controller epoch that created it


class PartitionAssignment(msgspec.Struct):
    topic: str
    partition: int
    replicas: list[int]  # broker ids; replicas[0] is the preferred leader
    leader: int  # a broker id, or NO_LEADER
    leader_epoch: int = 0
    isr: list[int] = []  # in-sync replicas (the leader alone until replication exists)
    controller_epoch: int = 0  # the controller epoch that wrote this version
    target: list[int] = []  # a reassignment in progress: the replicas it moves to ([]: none pending)


_ENCODER = msgspec.json.Encoder()


def encode(value: msgspec.Struct) -> bytes:
    return _ENCODER.encode(value)


def decode(kv: KeyValue, type_):
    return msgspec.json.decode(kv.value, type=type_)


def reassigning(value: bytes) -> bool:
    """Whether a partition key's value is an assignment with a reassignment pending (what wakes
    the controller on an ISR change: cluster/controller.py ControllerLoop); False for anything it
    cannot read (a deletion's empty value)."""
    if b'"target":[]' in value or b'"target"' not in value:
        return False  # the common case, decided without decoding
    try:
        return bool(msgspec.json.decode(value, type=PartitionAssignment).target)
    except msgspec.DecodeError:
        return False


def valid_cluster_name(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isalnum() or c in "._-" for c in name)


class Keys:
    """The key names of one cluster."""

    def __init__(self, cluster: str):
        if not valid_cluster_name(cluster):
            raise ValueError(f"cluster={cluster!r}: 1-64 letters, digits, '.', '_' or '-'")
        self.cluster = cluster
        self.root = f"{ROOT}/{cluster}/"
        self.brokers = self.root + "brokers/"
        self.controller = self.root + "controller"
        self.topics = self.root + "topics/"
        self.partitions = self.root + "partitions/"
        self.loads = self.root + "load/"
        self.access = self.root + "access/"
        self.acls = self.access + "acls"
        self.quotas = self.access + "quotas"
        self.clients = self.access + "clients/"

    def broker(self, broker_id: int) -> str:
        return f"{self.brokers}{int(broker_id)}"

    def load(self, broker_id: int) -> str:
        return f"{self.loads}{int(broker_id)}"

    def client(self, name: str) -> str:
        if not name or "/" in name or name.startswith(".") or name != name.strip():
            raise ValueError(f"client name {name!r}: a key file's name (no '/', not starting with '.')")
        return self.clients + name

    def topic(self, name: str) -> str:
        if not valid_topic_name(name):
            raise ValueError(f"topic={name!r} is not a valid topic name")
        return self.topics + name

    def partitions_of(self, name: str) -> str:
        self.topic(name)  # checks the name
        return f"{self.partitions}{name}/"

    def partition(self, name: str, partition: int) -> str:
        return f"{self.partitions_of(name)}{int(partition)}"


# --- reads anyone may do (brokers, clients through a broker, `tailrace cluster status`) ---

def read_brokers(etcd: Etcd, keys: Keys) -> dict[int, BrokerInfo]:
    """The registered (live: their leases hold) brokers by id."""
    kvs, _ = etcd.get_prefix(keys.brokers)
    brokers = (decode(kv, BrokerInfo) for kv in kvs)
    return {b.id: b for b in brokers}


def read_loads(etcd: Etcd, keys: Keys) -> dict[int, float]:
    """Broker id -> the bytes per second (in + out) it last published."""
    kvs, _ = etcd.get_prefix(keys.loads)
    out = {}
    for kv in kvs:
        try:
            out[int(kv.key[len(keys.loads):])] = decode(kv, BrokerLoad).bytes_per_s
        except (ValueError, msgspec.DecodeError):
            continue  # a value this version cannot read weighs nothing
    return out


def read_controller(etcd: Etcd, keys: Keys) -> tuple[int, int] | None:
    """(controller broker id, controller epoch), or None while there is none."""
    kv = etcd.get(keys.controller)
    return None if kv is None else (decode(kv, ControllerInfo).broker, kv.create_revision)


def read_topics(etcd: Etcd, keys: Keys) -> dict[str, tuple[TopicMeta, int]]:
    """name -> (TopicMeta, topic id)."""
    kvs, _ = etcd.get_prefix(keys.topics)
    return {t.name: (t, kv.create_revision) for kv in kvs for t in (decode(kv, TopicMeta),)}


def read_assignments(etcd: Etcd, keys: Keys, topic: str | None = None
                     ) -> tuple[dict[tuple[str, int], tuple[PartitionAssignment, int]], int]:
    """(topic, partition) -> (PartitionAssignment, its mod revision), of one topic or all, and the
    revision they were read at (watch from the next one)."""
    kvs, revision = etcd.get_prefix(keys.partitions_of(topic) if topic else keys.partitions)
    out = {}
    for kv in kvs:
        a = decode(kv, PartitionAssignment)
        out[(a.topic, a.partition)] = (a, kv.mod_revision)
    return out, revision
