"""Topic admin at the router: create, list, grow, alter and delete topics, and (a cluster)
move partitions' replicas between brokers.

Each handler is ``handler(ctx, req)`` over a ``TopicContext``: the settings, the catalog (topic
definitions, written durably by the catalog before any reply), the placement (routes and
owners, router/placement.py) and, with ``--auth curve``, the ACL rules LIST_TOPICS filters by.
Nothing here touches a socket: a handler answers through ``req.reply``.

The broker's own topics (``__consumer_offsets``) are refused to topic admin (INTERNAL_TOPIC).
A new partition's index and lock files are made with the topic (``prepare_slots``): its first
write then costs no file creation.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tailrace.broker import acl, datadir, record_policy
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import INTERNAL_TOPICS, Catalog, internal_topic_refusal, valid_topic_name
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.persistence.retire import free_slots
from tailrace.shm.layout import ring_region_bytes

from .placement import Placement
from .request import Request

log = logging.getLogger("tailrace.router")

MAX_PARTITIONS = 16384  # per topic: as many as the default slots
MIN_RING_BYTES = 64 * 1024

_create_dec = ops.DECODERS[P.Op.CREATE_TOPIC]
_create_partitions_dec = ops.DECODERS[P.Op.CREATE_PARTITIONS]
_alter_configs_dec = ops.DECODERS[P.Op.ALTER_CONFIGS]
_list_topics_dec = ops.DECODERS[P.Op.LIST_TOPICS]
_reassign_dec = ops.DECODERS[P.Op.ALTER_PARTITION_REASSIGNMENTS]


@dataclass
class TopicContext:
    s: settings_mod.Settings
    catalog: Catalog
    placement: Placement
    acls: acl.Acls | None = None  # with --auth curve: LIST_TOPICS shows what the principal may describe
    cluster: object | None = None  # with --cluster: the router's ClusterAgent (router/cluster_agent.py)


def info(s: settings_mod.Settings, t) -> P.TopicInfo:
    """A topic as clients see it, with its effective settings (its own, else the broker's)."""
    config = {"retention.ms": str(t.config.get("retention.ms", s.retention_ms)),
              "retention.bytes": str(t.config.get("retention.bytes", s.retention_bytes)), "ring.bytes": str(t.ring_bytes),
              **record_policy.effective(t.config)}
    return P.TopicInfo(t.name, t.topic_id, t.partitions, t.ring_bytes, config)


def _refused_internal(req: Request, does: str) -> bool:
    why = internal_topic_refusal(req.name, does)
    if why is not None:
        req.reply(P.ErrorCode.INTERNAL_TOPIC, P.ErrorReply(why))
    return why is not None


def create_topic(ctx: TopicContext, req: Request) -> None:
    if _refused_internal(req, "created"):
        return
    body = _create_dec.decode(req.header)
    name, reply = req.name, req.reply
    config, why = check_config(body.config, creating=True)
    if why is not None:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(why))
    if "ring.bytes" in config:
        if body.ring_bytes and body.ring_bytes != config["ring.bytes"]:
            return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("ring_bytes and config ring.bytes disagree"))
        body.ring_bytes = config.pop("ring.bytes")
    if not valid_topic_name(name):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"bad topic name {name!r}: 1-{P.MAX_TOPIC_BYTES} UTF-8 bytes of letters, digits, '.', '_', '-', not '.' or '..'"))
    if ctx.catalog.get(name) is not None:
        return reply(P.ErrorCode.TOPIC_EXISTS, P.ErrorReply(f"topic {name!r} exists"))
    if not 1 <= body.partitions <= MAX_PARTITIONS:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"partitions={body.partitions} must be 1..{MAX_PARTITIONS}"))
    s = ctx.s
    ring = body.ring_bytes or s.ring_bytes
    if ring < MIN_RING_BYTES or ring % 4096 or ring < 2 * s.max_batch_bytes:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"ring_bytes={ring} must be a multiple of 4096, >= {MIN_RING_BYTES} and >= 2 x max_batch_bytes ({s.max_batch_bytes})"))
    if ctx.cluster is not None:
        return create_in_cluster(ctx, req, body.partitions, ring, config,
                                 body.replication_factor or ctx.cluster.default_replication_factor())
    if body.replication_factor > 1:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"replication_factor={body.replication_factor}: a single host holds one copy of each partition "
            "(replicas need a cluster: tailrace serve --cluster)"))
    entry, why = add_topic(ctx, name, body.partitions, ring, config)
    if entry is None:
        return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(why))
    reply(P.ErrorCode.OK, info(s, entry))


def _elsewhere(ctx: TopicContext, req: Request) -> bool:
    """A cluster's topic admin that this broker does not make: answered (NOT_CONTROLLER with the
    controller's endpoint, or METADATA_UNAVAILABLE) before any local check, True. At the
    controller the topic is first taken in as etcd has it (its watch may lag its own write)."""
    if ctx.cluster is None:
        return False
    agent = ctx.cluster
    if agent.controller.is_controller and not agent.fenced:
        mirror_topic(ctx, req.name)
        return False
    return not _as_controller(ctx, req, lambda: None)


def _as_controller(ctx: TopicContext, req: Request, change) -> bool:
    """Run ``change()`` (a controller write) for a topic admin request in a cluster: True if it
    was made; else the request is answered (NOT_CONTROLLER with the controller's endpoint,
    METADATA_UNAVAILABLE, TOPIC_EXISTS or UNKNOWN_TOPIC) and nothing changed."""
    from tailrace.cluster.errors import (ClusterError, InvalidReassignment, MetadataConflict,  # only ever in a cluster
                                         NotController, NotEnoughBrokers)

    agent = ctx.cluster
    if agent.fenced or (agent.controller_id == agent.me and not agent.controller.is_controller):
        req.reply(P.ErrorCode.METADATA_UNAVAILABLE, P.ErrorReply(
            f"broker {agent.me} cannot reach the cluster's metadata (etcd) now: nothing changed, try again"))
        return False
    if not agent.controller.is_controller:
        ep = agent.endpoint_of(agent.controller_id)
        if not ep:
            req.reply(P.ErrorCode.METADATA_UNAVAILABLE, P.ErrorReply("the cluster has no controller now: try again"))
        else:
            req.reply(P.ErrorCode.NOT_CONTROLLER, P.ErrorReply(
                f"broker {agent.me} is not the controller: broker {agent.controller_id} is, at {ep}", endpoint=ep))
        return False
    try:
        change()
    except MetadataConflict as exc:
        code = P.ErrorCode.TOPIC_EXISTS if req.op == P.Op.CREATE_TOPIC else P.ErrorCode.UNKNOWN_TOPIC
        req.reply(code, P.ErrorReply(f"topic {req.name!r} " + ("exists" if code == P.ErrorCode.TOPIC_EXISTS else
                                                              f"changed or is gone in the cluster: {exc}")))
        return False
    except NotController as exc:
        req.reply(P.ErrorCode.METADATA_UNAVAILABLE, P.ErrorReply(f"{exc}: try again"))
        return False
    except (NotEnoughBrokers, InvalidReassignment) as exc:  # Kafka's INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT
        req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(str(exc)))
        return False
    except ClusterError as exc:
        req.reply(P.ErrorCode.METADATA_UNAVAILABLE, P.ErrorReply(
            f"the cluster's metadata cannot be changed now ({type(exc).__name__}: {exc}): nothing changed, try again"))
        return False
    return True


def create_in_cluster(ctx: TopicContext, req: Request, partitions: int, ring: int, config: dict, rf: int = 1) -> None:
    """CREATE_TOPIC in a cluster: only the controller places a topic (its write fenced by the
    controller epoch, cluster/controller.py); any other broker answers NOT_CONTROLLER with the
    controller's endpoint. The topic is in etcd before the reply, and in this broker's catalog
    (each broker mirrors every cluster topic, router/server.py ``mirror``)."""
    name = req.name
    stored = {**{k: v for k, v in config.items() if v is not None}, "ring.bytes": ring}
    if rf < 1:
        return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"replication_factor={rf} must be >= 1"))
    if not _as_controller(ctx, req, lambda: ctx.cluster.create_topic(name, partitions, stored, rf)):
        return
    entry = mirror_topic(ctx, name)
    if entry is None:
        return req.reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(
            f"topic {name!r} was placed in the cluster but does not fit this broker's shared-memory budget"))
    out = info(ctx.s, entry)
    out.replication_factor = rf
    req.reply(P.ErrorCode.OK, out)


def mirror_topic(ctx: TopicContext, name: str, watched: bool = False):
    """Make this broker's catalog hold cluster topic ``name`` as etcd has it: added with all
    its partitions (rings are made only for those this broker leads and is asked for), grown,
    its settings changed, or (``watched``: the watch saw its key change, so it was a cluster
    topic) deleted. Returns the catalog entry, or None if the topic is gone or does not fit."""
    meta = ctx.cluster.topics.get(name)
    entry = ctx.catalog.get(name)
    if meta is None:
        if watched and entry is not None and name not in INTERNAL_TOPICS:
            _delete_local(ctx, name.encode(), entry)  # the watch saw it deleted in the cluster
        return None
    cluster_id = ctx.cluster.topic_ids.get(name, 0)
    if entry is not None and cluster_id and entry.cluster_id != cluster_id:
        if entry.cluster_id:  # deleted and made again in the cluster while this broker did not see it
            log.info("cluster topic %r is another topic now (id %d, was %d): the old one is deleted here",
                     name, cluster_id, entry.cluster_id)
            _delete_local(ctx, name.encode(), entry)
            entry = None
        else:  # made here by the controller before the watch brought its id, or by an older version
            entry = ctx.catalog.set_cluster_id(name, cluster_id)
    if entry is not None:
        if meta.partitions > entry.partitions:
            entry = _grow_local(ctx, entry, meta.partitions) or entry
        wanted = {k: v for k, v in meta.config.items() if k != "ring.bytes"}
        if wanted != entry.config:
            changes = {**wanted, **{k: None for k in entry.config if k not in wanted}}
            entry = ctx.catalog.set_config(name, changes)
            log.info("cluster topic %r settings now %s", name, wanted)
        return entry
    if entry is None:
        config = {k: v for k, v in meta.config.items() if k != "ring.bytes"}
        entry, why = add_topic(ctx, name, meta.partitions, int(meta.config.get("ring.bytes", ctx.s.ring_bytes)), config,
                               cluster_id=cluster_id)
        if entry is None:
            log.error("cluster topic %r not taken into this broker's catalog: %s", name, why)
        else:
            log.info("cluster topic %r (%d partitions) taken into the catalog", name, meta.partitions)
    return entry


def _delete_local(ctx: TopicContext, topic: bytes, t) -> None:
    """Delete a topic from this broker's catalog (as DELETE_TOPIC does; a cluster's deletion)."""
    ctx.catalog.delete_topic(t.name)
    ctx.placement.forget_topic(topic, t.slots)
    log.info("topic %r deleted (id %d, slots %s)", t.name, t.topic_id, t.slots)


def _grow_local(ctx: TopicContext, t, total: int):
    """Grow a topic in this broker's catalog to ``total`` partitions; None if they do not fit."""
    s, catalog = ctx.s, ctx.catalog
    why = over_budget(s, t.ring_bytes)
    if why is not None:
        log.error("topic %r cannot grow to %d partitions here: %s", t.name, total, why)
        return None
    free = free_slots(catalog, s, total - t.partitions)
    if catalog.slots_available(s.max_slots, free) < total - t.partitions:
        log.error("topic %r cannot grow to %d partitions here: no free slots (max_slots=%d)", t.name, total, s.max_slots)
        return None
    old = t.partitions
    entry = catalog.add_partitions(t.name, total, free)
    prepare_slots(s, entry.slots[old:])
    ctx.placement.place_topic(t.name, first=old)
    log.info("topic %r grown from %d to %d partitions", t.name, old, total)
    return entry


def over_budget(s: settings_mod.Settings, ring: int) -> str | None:
    """Why a partition of this ring size cannot be made, or None. The budget bounds the pages the
    rings hold, not their sizes (rings are sparse and give their flushed pages back: actors/
    keeper.py), so partitions are bounded by the slots; one ring must still fit a worker's
    share of the budget, or a full ring of it could never be written."""
    share = s.shm_budget_bytes // max(1, s.workers)
    if ring_region_bytes(ring) > share:
        return (f"a ring of {ring} bytes ({ring_region_bytes(ring)} with its descriptors) is larger than a worker's "
                f"share of the shared-memory budget ({s.shm_budget_bytes} / {s.workers} workers)")
    return None


def add_topic(ctx: TopicContext, name: str, partitions: int, ring: int, config: dict[str, int], cluster_id: int = 0):
    """Add a checked topic where the shared-memory budget and the slots allow: (its entry,
    None), written durably, its files made and its partitions placed; or (None, why not).
    Also how the group coordinator makes ``__consumer_offsets``."""
    s, catalog = ctx.s, ctx.catalog
    why = over_budget(s, ring)
    if why is not None:
        return None, f"topic {name!r}: {why}"
    free = free_slots(catalog, s, partitions)
    if catalog.slots_available(s.max_slots, free) < partitions:
        return None, f"no free partition slots (max_slots={s.max_slots}; a deleted topic's are free within a second)"
    entry = catalog.add_topic(name, partitions, ring, config, free, cluster_id=cluster_id)
    prepare_slots(s, entry.slots)
    ctx.placement.place_topic(name)
    return entry, None


def list_topics(ctx: TopicContext, req: Request) -> None:
    internal = req.header is not None and _list_topics_dec.decode(req.header).internal
    topics = [t for t in ctx.catalog.data.topics.values() if internal or t.name not in INTERNAL_TOPICS]
    if req.principal is not None and ctx.acls is not None and ctx.acls.enabled:  # what it may describe
        topics = [t for t in topics if ctx.acls.may_describe(req.principal, t.name)]
    req.reply(P.ErrorCode.OK, P.ListTopicsReply([info(ctx.s, t) for t in topics]))


def create_partitions(ctx: TopicContext, req: Request) -> None:
    """Grow a topic (Kafka's CreatePartitions: to a new total, never down). The catalog is
    written before the reply; the new partitions are placed like a new topic's."""
    if _refused_internal(req, "altered") or _elsewhere(ctx, req):
        return
    total = _create_partitions_dec.decode(req.header).partitions
    name, reply, s, catalog = req.name, req.reply, ctx.s, ctx.catalog
    t = catalog.get(name)
    if t is None:
        return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
    if not t.partitions < total <= MAX_PARTITIONS:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"partitions={total}: a topic only grows; topic {name!r} has {t.partitions}, at most {MAX_PARTITIONS}"))
    why = over_budget(s, t.ring_bytes)
    if why is not None:
        return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(f"topic {name!r}: {why}"))
    free = free_slots(catalog, s, total - t.partitions)
    if catalog.slots_available(s.max_slots, free) < total - t.partitions:
        return reply(P.ErrorCode.SHM_BUDGET_EXCEEDED, P.ErrorReply(f"no free partition slots (max_slots={s.max_slots})"))
    if ctx.cluster is not None:
        if not _as_controller(ctx, req, lambda: ctx.cluster.create_partitions(name, total)):
            return
        entry = mirror_topic(ctx, name)
        return reply(P.ErrorCode.OK, info(s, entry if entry is not None else catalog.get(name)))
    entry = _grow_local(ctx, t, total)
    reply(P.ErrorCode.OK, info(s, entry))


def alter_configs(ctx: TopicContext, req: Request) -> None:
    """Set or reset a topic's settings, durably before the reply; the flusher applies
    retention.ms at its next pass."""
    if _refused_internal(req, "altered") or _elsewhere(ctx, req):
        return
    body = _alter_configs_dec.decode(req.header)
    name, reply = req.name, req.reply
    if ctx.catalog.get(name) is None:
        return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
    config, why = check_config(body.config, creating=False)
    if why is not None:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(why))
    if ctx.cluster is not None:
        if not _as_controller(ctx, req, lambda: ctx.cluster.alter_config(name, config)):
            return
        entry = mirror_topic(ctx, name)
        return reply(P.ErrorCode.OK, info(ctx.s, entry if entry is not None else ctx.catalog.get(name)))
    entry = ctx.catalog.set_config(name, config)
    log.info("topic %r settings changed: %s", name, config)
    reply(P.ErrorCode.OK, info(ctx.s, entry))


def delete_topic(ctx: TopicContext, req: Request) -> None:
    """Delete a topic (Kafka's DeleteTopics). The catalog without it, its slots retired, is
    written durably before the reply: that is the deletion. From then on the router answers
    its requests UNKNOWN_TOPIC, the workers drop its actors at their next catalog check, and
    the flusher clears its slots (persistence/retire.py); recovery skips its journal batches."""
    if _refused_internal(req, "deleted") or _elsewhere(ctx, req):
        return
    name = req.name
    ctx.catalog.reload()
    t = ctx.catalog.get(name)
    if t is None:
        return req.reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
    if ctx.cluster is not None and not _as_controller(ctx, req, lambda: ctx.cluster.delete_topic(name)):
        return
    _delete_local(ctx, req.topic, t)
    req.reply(P.ErrorCode.OK, info(ctx.s, t))


def alter_partition_reassignments(ctx: TopicContext, req: Request) -> None:
    """Move partitions' replicas to other brokers (Kafka's AlterPartitionReassignments, KIP-455):
    the controller adds the new replicas at once and finishes each move once they are in sync
    (cluster/controller.py ``reassign_partitions``); the reply is each partition as the first
    write left it. A single host has one copy of everything and nowhere to move it."""
    if ctx.cluster is None:
        return req.reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            "reassignment needs a cluster: a single host holds the one copy of each partition (tailrace serve --cluster)"))
    if _refused_internal(req, "reassigned") or _elsewhere(ctx, req):
        return
    targets = _reassign_dec.decode(req.header).partitions
    name, reply = req.name, req.reply
    t = ctx.catalog.get(name)
    if t is None:
        return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
    if not targets:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply("name at least one partition to reassign"))
    missing = sorted(p for p in targets if not 0 <= p < t.partitions)
    if missing:
        return reply(P.ErrorCode.UNKNOWN_PARTITION, P.ErrorReply(
            f"topic {name!r} has {t.partitions} partitions: no partition {', '.join(map(str, missing))}"))
    moved: list = []
    if not _as_controller(ctx, req, lambda: moved.extend(ctx.cluster.reassign_partitions(name, dict(targets)))):
        return
    reply(P.ErrorCode.OK, P.AlterPartitionReassignmentsReply([
        P.PartitionReassignment(a.partition, list(a.replicas), list(a.target), a.leader, a.leader_epoch, list(a.isr))
        for a in moved]))


def prepare_slots(s: settings_mod.Settings, slots) -> None:
    """Make new partitions' index and lock files now, with the topic: a file created on the
    data directory's filesystem costs about 0.2 ms here, and the first write to 1,000 fresh
    partitions paid 0.4 s for them. Empty files; their owners open them as they would."""
    index_dir = os.path.join(s.data_dir, datadir.INDEX_DIR)
    os.makedirs(index_dir, exist_ok=True)
    for slot in slots:
        for path, mode in ((os.path.join(index_dir, datadir.index_name(slot)), 0o666),
                           (os.path.join(s.ipc_path(), datadir.slot_lock_name(slot)), 0o600)):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, mode))
            except OSError as exc:  # the owner makes it then: only slower
                log.warning("could not make %s ahead: %s", path, exc)


def check_config(config: dict[str, str], creating: bool) -> tuple[dict[str, int | str | None], str | None]:
    """A request's topic settings as stored values (None: back to the broker's default), or
    why they are refused. Names and values: ``P.TOPIC_CONFIGS``."""
    out: dict[str, int | str | None] = {}
    for name, raw in config.items():
        if name not in P.TOPIC_CONFIGS:
            return {}, f"unknown topic setting {name!r}: one of {', '.join(P.TOPIC_CONFIGS)}"
        if name == "ring.bytes" and not creating:
            return {}, "ring.bytes is set when a topic is created; a topic's rings do not change size"
        if raw == "" and not creating:
            out[name] = None
            continue
        if name in record_policy.DEFAULTS:
            value, why = record_policy.check_value(name, raw)
            if why is not None:
                return {}, why
            out[name] = value
            continue
        if name == "unclean.leader.election.enable":
            flag = {"true": 1, "1": 1, "false": 0, "0": 0}.get(str(raw).strip().lower())
            if flag is None:
                return {}, f"{name}={raw!r}: true or false"
            out[name] = flag
            continue
        try:
            value = int(raw)
        except (TypeError, ValueError):
            return {}, f"{name}={raw!r}: an integer"
        if name in ("retention.ms", "retention.bytes") and value < -1:
            return {}, f"{name}={value}: a count, or -1 for no limit"
        if name == "min.insync.replicas" and value < 1:
            return {}, f"{name}={value}: at least 1"
        out[name] = value
    return out, None


# op -> handler(ctx, req): the topic admin rows of client/ops.py SPEC served by the router
HANDLERS = {P.Op.CREATE_TOPIC: create_topic, P.Op.LIST_TOPICS: list_topics, P.Op.CREATE_PARTITIONS: create_partitions,
            P.Op.ALTER_CONFIGS: alter_configs, P.Op.DELETE_TOPIC: delete_topic,
            P.Op.ALTER_PARTITION_REASSIGNMENTS: alter_partition_reassignments}
