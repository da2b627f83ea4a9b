"""Share groups on the wire (docs/PROTOCOL.md 4.9): queue semantics over the log, Kafka's KIP-932 shape.

A share group's members read the same partitions. ``SHARE_FETCH`` first applies the
acknowledgements it carries (ranges of offsets: ACCEPT, RELEASE, REJECT), then *acquires*
records for the group's lock duration and returns them: per partition, the acquired offset
ranges with their delivery counts, and the record batches that hold them (whole batches as the
log stores them; the client keeps the acquired records and drops the rest of a batch, as Kafka's
share consumer does). ``SHARE_ACKNOWLEDGE`` applies acknowledgements only. Both are answered
once what they changed is durable in ``__share_group_state``. The routing header's topic field
names the group.
"""

from __future__ import annotations

import msgspec

# acknowledgement types (Kafka's AcknowledgeType ids)
ACCEPT, RELEASE, REJECT = 1, 2, 3
ACK_TYPES = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT}

# a record's state in a share partition (router/share_state.py keeps one byte per offset)
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED, DEAD = 0, 1, 2, 3, 4
STATE_NAMES = {AVAILABLE: "available", ACQUIRED: "acquired", ACKNOWLEDGED: "acknowledged", ARCHIVED: "archived",
               DEAD: "dead-letter pending"}

# headers a dead-lettered record carries, besides its own (section 4.9)
DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET = "tailrace.dlq.topic", "tailrace.dlq.partition", "tailrace.dlq.offset"
DLQ_COUNT, DLQ_GROUP, DLQ_ERROR, DLQ_REASON = ("tailrace.dlq.delivery_count", "tailrace.dlq.group", "tailrace.dlq.error",
                                               "tailrace.dlq.reason")


class ShareAck(msgspec.Struct, array_like=True):
    """One acknowledged range: ``[topic, partition, first, last, type, delay_ms, error]``,
    ``first``..``last`` inclusive."""
    topic: str
    partition: int
    first: int
    last: int
    type: int  # ACCEPT, RELEASE or REJECT
    delay_ms: int = -1  # RELEASE: -1 the group's backoff for the record's delivery count; >= 0 this delay
    error: str = ""  # RELEASE/REJECT: why (a dead-lettered record carries the last one)


class ShareFetchRequest(msgspec.Struct, omit_defaults=True):
    member_id: str  # the client's own id (a UUID): the group knows it from its first request
    topics: list[str] = []  # the subscription (SHARE_FETCH); every partition of each
    acks: list[ShareAck] = []
    max_records: int = 500  # acquired records in the reply, at most
    max_bytes: int = 8 << 20  # the reply's batches, about (whole batches: one may go past)
    max_wait_ms: int = 500  # wait this long for records when none can be acquired now
    leave: bool = False  # the member leaves: what it holds is released now (not at its locks' end)


class AcquiredRange(msgspec.Struct, array_like=True):
    first: int
    last: int  # inclusive
    delivery_count: int


class SharePartitionData(msgspec.Struct, array_like=True):
    """One partition's part of a SHARE_FETCH reply: ``[topic, partition, acquired, body_bytes]``;
    its batches are the next ``body_bytes`` of frame 2."""
    topic: str
    partition: int
    acquired: list[AcquiredRange]
    body_bytes: int


class AckOutcome(msgspec.Struct, array_like=True):
    """What became of one ShareAck: ``[topic, partition, first, last, code, message]``. OK, or
    INVALID_RECORD_STATE for offsets of the range the member did not hold (nothing changed for
    those), UNKNOWN_TOPIC/UNKNOWN_PARTITION."""
    topic: str
    partition: int
    first: int
    last: int
    code: int
    message: str = ""


class ShareFetchReply(msgspec.Struct):
    partitions: list[SharePartitionData]
    acks: list[AckOutcome] = []
    lock_duration_ms: int = 0  # how long the acquired records stay this member's


class ListShareGroupsReply(msgspec.Struct):
    groups: list[str]


class SharePartitionInfo(msgspec.Struct, array_like=True):
    """``[topic, partition, start, end, in_flight, acquired, available, delivery_histogram, dead]``:
    ``start`` is the first offset not yet done (Kafka's share-partition start offset), ``end``
    the first never read; in_flight counts the offsets between them that are not done."""
    topic: str
    partition: int
    start: int
    end: int
    in_flight: int
    acquired: int
    available: int
    delivery_histogram: list[int]  # [records in flight delivered 0 times, 1 time, ...]
    dead: int  # dead-lettered (or archived past the limit) since the broker started


class ShareMemberInfo(msgspec.Struct, array_like=True):
    member_id: str
    topics: list[str]
    acquired: int
    idle_ms: int


class ShareGroupInfo(msgspec.Struct):
    group: str
    config: dict[str, str]  # the group's settings, defaults filled in
    members: list[ShareMemberInfo]
    partitions: list[SharePartitionInfo]
    dlq_topic: str  # "" when dead records are archived
    # a cluster: the other live brokers' endpoints. Each broker describes the partitions it leads
    # and the members that fetch from it; Admin.describe_share_group asks them all and merges.
    brokers: list[str] = []


class ShareStateCopy(msgspec.Struct, omit_defaults=True):
    """SHARE_STATE_COPY (45), between a cluster's brokers only (section 4.9): ``records``, a
    batch of snapshot records the leader of their partitions wrote (router/share_state.py
    ``SnapshotRecord``), for the other broker to keep; or, with ``pull``, a request for every
    snapshot the broker holds, answered with them in ``records``."""
    records: bytes = b""
    pull: bool = False


def merge_infos(infos: list[ShareGroupInfo]) -> ShareGroupInfo:
    """A cluster's share group as one description: each broker's (the first is the one asked,
    its settings kept) with the partitions it leads and the members that fetch from it; a member
    seen at several brokers holds the sum of what it acquired there, idle the least."""
    first = infos[0]
    members: dict[str, ShareMemberInfo] = {}
    for info in infos:
        for m in info.members:
            seen = members.get(m.member_id)
            members[m.member_id] = m if seen is None else ShareMemberInfo(
                m.member_id, sorted(set(seen.topics) | set(m.topics)), seen.acquired + m.acquired, min(seen.idle_ms, m.idle_ms))
    parts = sorted((p for info in infos for p in info.partitions), key=lambda p: (p.topic, p.partition))
    return ShareGroupInfo(first.group, first.config, list(members.values()), parts, first.dlq_topic, first.brokers)


class AlterShareGroupRequest(msgspec.Struct):
    config: dict[str, str]  # name -> value; "" resets it to the broker's default
