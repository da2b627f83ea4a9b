"""Admin: create, list and describe topics; list offsets; broker status; move partitions; consumer
groups and share groups.

Each operation is written once, as a ``Call`` (the request to make and how to read its reply):
``Admin`` makes it with a blocking round trip, ``aio.AsyncAdmin`` with an awaited one.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import msgspec

from . import protocol as P
from . import share_protocol as S
from .connection import CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, Connection, Reply
from .errors import NotControllerError, NotCoordinatorError, TailraceError
from .security import curve_keys


class Call(NamedTuple):
    op: int
    topic: str
    partition: int
    header: bytes
    parse: Callable[[Reply], Any]


def _status(r: Reply) -> dict:
    return msgspec.msgpack.decode(r.header)


class AdminCalls:
    """The admin operations as ``Call`` values (no I/O)."""

    @staticmethod
    def create_topic(name: str, partitions: int, ring_bytes: int = 0, config: dict | None = None,
                     replication_factor: int = 0) -> Call:
        conf = {str(k): str(v) for k, v in (config or {}).items()}
        req = P.CreateTopicRequest(partitions, ring_bytes, conf, int(replication_factor))
        return Call(P.Op.CREATE_TOPIC, name, -1, P.encode(req),
                    lambda r: P.decoder(P.TopicInfo).decode(r.header))

    @staticmethod
    def list_topics(internal: bool = False) -> Call:
        """``internal``: the broker's own topics (``__consumer_offsets``) too."""
        header = P.encode(P.ListTopicsRequest(internal=True)) if internal else P.EMPTY_MAP
        return Call(P.Op.LIST_TOPICS, "", -1, header, lambda r: P.decoder(P.ListTopicsReply).decode(r.header).topics)

    @staticmethod
    def describe_topic(name: str) -> Call:
        return Call(P.Op.DESCRIBE_TOPIC, name, -1, P.EMPTY_MAP, lambda r: P.decoder(P.DescribeReply).decode(r.header))

    @staticmethod
    def list_offsets(name: str, timestamp_ms: int | None = None) -> Call:
        header = P.EMPTY_MAP if timestamp_ms is None else P.encode(P.ListOffsetsRequest(int(timestamp_ms)))
        return Call(P.Op.LIST_OFFSETS, name, -1, header,
                    lambda r: P.decoder(P.ListOffsetsReply).decode(r.header).partitions)

    @staticmethod
    def alter_configs(name: str, config: dict) -> Call:
        conf = {str(k): "" if v is None else str(v) for k, v in config.items()}
        return Call(P.Op.ALTER_CONFIGS, name, -1, P.encode(P.AlterConfigsRequest(conf)),
                    lambda r: P.decoder(P.TopicInfo).decode(r.header))

    @staticmethod
    def create_partitions(name: str, total: int) -> Call:
        return Call(P.Op.CREATE_PARTITIONS, name, -1, P.encode(P.CreatePartitionsRequest(int(total))),
                    lambda r: P.decoder(P.TopicInfo).decode(r.header))

    @staticmethod
    def reassign_partitions(name: str, partitions: dict) -> Call:
        req = P.AlterPartitionReassignmentsRequest({int(p): [int(b) for b in r] for p, r in partitions.items()})
        return Call(P.Op.ALTER_PARTITION_REASSIGNMENTS, name, -1, P.encode(req),
                    lambda r: P.decoder(P.AlterPartitionReassignmentsReply).decode(r.header).partitions)

    @staticmethod
    def delete_topic(name: str) -> Call:
        return Call(P.Op.DELETE_TOPIC, name, -1, P.EMPTY_MAP, lambda r: P.decoder(P.TopicInfo).decode(r.header))

    @staticmethod
    def list_groups() -> Call:
        return Call(P.Op.LIST_GROUPS, "", -1, P.EMPTY_MAP, lambda r: P.decoder(P.ListGroupsReply).decode(r.header).groups)

    @staticmethod
    def find_coordinator(group: str) -> Call:
        return Call(P.Op.FIND_COORDINATOR, group, -1, P.EMPTY_MAP, lambda r: P.decoder(P.FindCoordinatorReply).decode(r.header))

    @staticmethod
    def describe_group(group: str) -> Call:
        return Call(P.Op.DESCRIBE_GROUP, group, -1, P.EMPTY_MAP, lambda r: P.decoder(P.GroupInfo).decode(r.header))

    @staticmethod
    def delete_group(group: str) -> Call:
        return Call(P.Op.DELETE_GROUP, group, -1, P.EMPTY_MAP, lambda r: None)

    @staticmethod
    def committed(group: str, topics: list[str] | None = None) -> Call:
        return Call(P.Op.OFFSET_FETCH, group, -1, P.encode(P.OffsetFetchRequest(topics)),
                    lambda r: {(t, p): o for t, p, o in P.decoder(P.CommittedOffsets).decode(r.header).offsets})

    @staticmethod
    def commit(group: str, offsets: dict, member_id: str = "", member_epoch: int = -1) -> Call:
        req = P.OffsetCommitRequest([(t, int(p), int(o)) for (t, p), o in offsets.items()], member_id, member_epoch)
        return Call(P.Op.OFFSET_COMMIT, group, -1, P.encode(req),
                    lambda r: {(t, p): o for t, p, o in P.decoder(P.CommittedOffsets).decode(r.header).offsets})

    @staticmethod
    def list_share_groups() -> Call:
        return Call(P.Op.LIST_SHARE_GROUPS, "", -1, P.EMPTY_MAP,
                    lambda r: P.decoder(S.ListShareGroupsReply).decode(r.header).groups)

    @staticmethod
    def describe_share_group(group: str) -> Call:
        return Call(P.Op.DESCRIBE_SHARE_GROUP, group, -1, P.EMPTY_MAP, lambda r: P.decoder(S.ShareGroupInfo).decode(r.header))

    @staticmethod
    def alter_share_group(group: str, config: dict) -> Call:
        conf = {str(k): "" if v is None else str(v) for k, v in config.items()}
        return Call(P.Op.ALTER_SHARE_GROUP, group, -1, P.encode(S.AlterShareGroupRequest(conf)),
                    lambda r: P.decoder(S.ShareGroupInfo).decode(r.header))

    @staticmethod
    def status() -> Call:
        return Call(P.Op.STATUS, "", -1, P.EMPTY_MAP, _status)

    @staticmethod
    def set_workers(workers: int) -> Call:
        return Call(P.Op.SET_WORKERS, "", -1, P.encode(P.SetWorkersRequest(workers)), _status)


def other_brokers(status: dict) -> list[str]:
    """The endpoints of a cluster's other live brokers, from a broker's STATUS (none: one host)."""
    cluster = status.get("cluster") or {}
    me = str(cluster.get("broker_id", ""))
    return sorted(ep for bid, ep in (cluster.get("brokers") or {}).items() if ep and bid != me)


class Admin:
    def __init__(self, bootstrap: str | None = None, timeout_ms: int = 10_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS, *, key_file=None, server_key=None):
        self.conn = Connection(bootstrap, connect_timeout_ms, curve_keys(key_file, server_key))
        self.timeout_ms = timeout_ms
        self._connect = (connect_timeout_ms, curve_keys(key_file, server_key))
        self._elsewhere: dict[str, Connection] = {}  # a cluster: the controller and group coordinators brokers named

    def _call(self, c: Call):
        try:
            return c.parse(self.conn.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms))
        except (NotControllerError, NotCoordinatorError) as exc:
            # a cluster: topic admin goes to the controller, a group's ops to its coordinator, as the reply names
            endpoint = exc.details.get("endpoint")
            if not endpoint or endpoint == self.conn.endpoint:
                raise
            conn = self._elsewhere.get(endpoint)
            if conn is None:
                conn = self._elsewhere[endpoint] = Connection(endpoint, *self._connect)
            return c.parse(conn.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms))

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0, config: dict | None = None,
                     replication_factor: int = 0) -> P.TopicInfo:
        """``config``: the topic's own settings, Kafka's names (``{"retention.ms": 3600000}``;
        ``protocol.TOPIC_CONFIGS`` lists them). ``replication_factor``: copies of each
        partition on distinct brokers of a cluster (0: the default, 1)."""
        return self._call(AdminCalls.create_topic(name, partitions, ring_bytes, config, replication_factor))

    def alter_configs(self, name: str, config: dict) -> P.TopicInfo:
        """Set topic settings; a value of None (or "") resets one to the broker's default.
        Returns the topic with its effective settings."""
        return self._call(AdminCalls.alter_configs(name, config))

    def list_topics(self, internal: bool = False) -> list[P.TopicInfo]:
        """Every topic this principal may describe; the broker's own (``__consumer_offsets``)
        only with ``internal=True``."""
        return self._call(AdminCalls.list_topics(internal))

    def describe_topic(self, name: str) -> P.DescribeReply:
        return self._call(AdminCalls.describe_topic(name))

    def list_offsets(self, name: str, timestamp_ms: int | None = None) -> list[P.PartitionOffsets]:
        """Log start, high watermark and durable watermark of every partition, one round trip.
        With ``timestamp_ms`` (ms since the epoch, >= 0) each partition's ``time_offset`` is
        the earliest offset appended at or after it (-1: none is)."""
        return self._call(AdminCalls.list_offsets(name, timestamp_ms))

    def create_partitions(self, name: str, total: int) -> P.TopicInfo:
        """Grow topic ``name`` to ``total`` partitions (Kafka's createPartitions: only up). The
        new partitions are numbered after the old ones; a key may hash to another partition from
        now on (docs/DESIGN.md). Producers see the new count within ``METADATA_MAX_AGE_S``."""
        return self._call(AdminCalls.create_partitions(name, total))

    def reassign_partitions(self, name: str, partitions: dict[int, list[int]]) -> list[P.PartitionReassignment]:
        """Move partitions of topic ``name`` to other brokers of a cluster, ``{partition: [broker
        ids]}``, the first the preferred leader (Kafka's alterPartitionReassignments). Returns once
        the move has started: the new replicas are listed and copy the leader; the controller
        finishes each move (replicas = the target, leadership moved into it) once they are all in
        sync. ``describe_topic`` shows the progress (a partition's ``target`` is [] once done).
        Refused: a single host, a broker not live or named twice, an empty list
        (``InvalidRequestError``), an unknown topic or partition."""
        return self._call(AdminCalls.reassign_partitions(name, partitions))

    def delete_topic(self, name: str) -> P.TopicInfo:
        """Delete topic ``name`` (Kafka's deleteTopics): from the reply on, its producers and
        consumers get ``UNKNOWN_TOPIC``; its slots, rings, shared-memory budget and index files
        are given back within a second, its journal bytes with their segments. A topic created
        later under the same name is a new one (new id, offsets from 0). Returns what was deleted."""
        return self._call(AdminCalls.delete_topic(name))

    def list_groups(self) -> list[P.GroupInfo]:
        """Every consumer group: name, state (empty, stable, reconciling) and epoch. In a cluster
        each broker lists the groups it coordinates, so every live broker is asked (as Kafka's
        AdminClient does); a broker that does not answer is left out."""
        groups = {g.group: g for g in self._call(AdminCalls.list_groups())}
        for endpoint in other_brokers(self.status()):
            conn = self._elsewhere.get(endpoint)
            if conn is None:
                conn = self._elsewhere[endpoint] = Connection(endpoint, *self._connect)
            c = AdminCalls.list_groups()
            try:
                found = c.parse(conn.request(c.op, c.topic, c.partition, c.header, timeout_ms=self.timeout_ms))
            except TailraceError:  # gone, not ready, refused: its groups are left out
                continue
            for g in found:
                groups.setdefault(g.group, g)
        return sorted(groups.values(), key=lambda g: g.group)

    def find_coordinator(self, group: str) -> P.FindCoordinatorReply:
        """The broker that coordinates ``group`` (a cluster; a single host answers -1, itself)."""
        return self._call(AdminCalls.find_coordinator(group))

    def describe_group(self, group: str) -> P.GroupInfo:
        """A group's members (each one's target and what it holds now) and committed offsets."""
        return self._call(AdminCalls.describe_group(group))

    def delete_group(self, group: str) -> None:
        """Delete a group and its committed offsets (only while it has no members)."""
        return self._call(AdminCalls.delete_group(group))

    def committed(self, group: str, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
        """The group's committed offsets, {(topic, partition): next offset to read}."""
        return self._call(AdminCalls.committed(group, topics))

    def reset_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Set a group's committed offsets (only while it has no members, as Kafka's
        ``kafka-consumer-groups --reset-offsets``), durably before the reply."""
        return self._call(AdminCalls.commit(group, offsets))

    def list_share_groups(self) -> list[str]:
        """The names of every share group the broker knows (client/share.py; docs/PROTOCOL.md 4.9)."""
        return self._call(AdminCalls.list_share_groups())

    def describe_share_group(self, group: str) -> S.ShareGroupInfo:
        """A share group's settings (defaults filled in), members, and per share partition its
        start and end offsets, records in flight, acquired and available, the delivery-count
        histogram and the dead-lettered count; its dead-letter topic ("" when dead records are
        archived). ``UnknownGroupError`` for a group the broker does not know."""
        info = self._call(AdminCalls.describe_share_group(group))
        if not info.brokers:
            return info
        infos = [info]  # a cluster: each broker describes the partitions it leads, merged here
        for ep in info.brokers:
            conn = self._elsewhere.get(ep)
            if conn is None:
                conn = self._elsewhere[ep] = Connection(ep, *self._connect)
            try:
                r = conn.request(P.Op.DESCRIBE_SHARE_GROUP, group, -1, timeout_ms=self.timeout_ms)
            except TailraceError:  # a broker gone meanwhile, or one that has not seen the group: what the others know
                continue
            infos.append(P.decoder(S.ShareGroupInfo).decode(r.header))
        return S.merge_infos(infos)

    def alter_share_group(self, group: str, config: dict[str, str]) -> S.ShareGroupInfo:
        """Set share group settings (``share.record.lock.duration.ms``, ``share.delivery.count.limit``,
        ``share.retry.backoff.ms``, ``share.dlq.topic``, ``share.auto.offset.reset``,
        ``share.session.timeout.ms``); a value of None or "" resets one to the default. Makes the
        group if it does not exist yet (so it can be set up before its first member). Returns the
        group as ``describe_share_group`` does, once the settings are durable."""
        info = self._call(AdminCalls.alter_share_group(group, config))
        return self.describe_share_group(group) if info.brokers else info

    def status(self) -> dict:
        return self._call(AdminCalls.status())

    def set_workers(self, workers: int) -> dict:
        """Tell the router to place partitions on workers 0..workers-1 (it does not start or stop
        processes: ``tailrace workers set`` does both). Returns the router's status."""
        return self._call(AdminCalls.set_workers(workers))

    def close(self) -> None:
        self.conn.close()
        for conn in self._elsewhere.values():
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
