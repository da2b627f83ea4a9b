"""The ZeroMQ envelope: frame order, the routing header, request and reply bodies, error codes.

A client is a DEALER socket connected to the router's ROUTER (default tcp://127.0.0.1:7420), or
to a worker's endpoint directly. Every request is one multipart message::

    frame 0   routing header   fixed 16 bytes + topic name (UTF-8), see ROUTING below
    frame 1   header           a msgpack map (may be empty: 0x80), fields per op
    frame 2   body             ops that carry bytes only (produce: record batches)

Every reply mirrors it: routing header (same op and request_id, ``code`` set), a msgpack map, and
for fetch a body frame of back-to-back record batches. The router reads only frame 0; it never
decodes frame 1 or 2 of a produce or fetch.

Routing header (little-endian)::

     0   1   2       4               8                              16
     +---+---+-------+---------------+------------------------------+-----------------+
     |ver|op | code  |  partition    |        request_id            | topic (UTF-8)...|
     +---+---+-------+---------------+------------------------------+-----------------+

``ver`` is PROTOCOL_VERSION; ``code`` is 0 in requests and an ErrorCode in replies;
``partition`` is -1 where an op does not name one; ``request_id`` is chosen by the client and
echoed so a client may keep many requests in flight on one socket.
"""

from __future__ import annotations

import enum
import struct

import msgspec

PROTOCOL_VERSION = 2  # 2: the client reads record format v2 (docs/PROTOCOL.md 1); a broker still serves 1
PROTOCOL_VERSIONS = (1, 2)
ROUTING = struct.Struct("<BBHiQ")
ROUTING_BYTES = ROUTING.size
MAX_TOPIC_BYTES = 200  # a topic name's UTF-8 bytes at most (catalog.valid_topic_name)

# Router -> worker. The router's DEALER to each worker presents the identity ROUTER_IDENTITY, and
# every request it forwards carries one frame more than the client sent, right after the client's
# identity: the assign frame, the partition's slot (u32) and the owner epoch the router placed it
# with (u64), little-endian. A worker that sees a higher epoch for a slot adopts the partition
# (fencing the old owner). Only the router sends it; a client never does (PROTOCOL.md, 8).
ROUTER_IDENTITY = b"router"
ASSIGN = struct.Struct("<IQ")  # slot, owner epoch
assert ASSIGN.size == 12
assert ROUTING_BYTES == 16


class Op(enum.IntEnum):
    PRODUCE = 1
    FETCH = 2
    LIST_OFFSETS = 3
    WATCH = 4  # same host only: ring a client's doorbell when partitions it reads from the rings move (section 8d)
    PRODUCE_MULTI = 5  # one batch for each of many partitions of one topic owned by one worker (section 4.1a)
    FETCH_MULTI = 6  # fetch from many partitions of one topic owned by one worker, one long poll over all (section 4.2a)
    PRODUCE_DELAYED = 7  # a batch appended to its partition at a given time, kept by the router's timer till then (section 4.1c)
    CREATE_TOPIC = 10
    LIST_TOPICS = 11
    DESCRIBE_TOPIC = 12
    STATUS = 13
    SET_WORKERS = 14  # change the number of workers the router places partitions on
    CREATE_PARTITIONS = 15  # grow a topic to a new partition count (Kafka's CreatePartitions)
    ALTER_CONFIGS = 16  # set or reset a topic's settings (Kafka's IncrementalAlterConfigs)
    DELETE_TOPIC = 17  # delete a topic and everything of it (Kafka's DeleteTopics)
    ALTER_PARTITION_REASSIGNMENTS = 18  # cluster: move partitions' replicas to other brokers (Kafka's KIP-455)
    # consumer groups (router/groups.py): the routing header's topic field names the group
    GROUP_HEARTBEAT = 20  # join, stay, leave; the reply is the member's assignment (Kafka's KIP-848)
    OFFSET_COMMIT = 21  # store a group's offsets durably
    OFFSET_FETCH = 22  # a group's committed offsets
    LIST_GROUPS = 23
    DESCRIBE_GROUP = 24
    DELETE_GROUP = 25
    FIND_COORDINATOR = 26  # which broker coordinates this group (a cluster: one broker per group; Kafka's FindCoordinator)
    # share groups (router/share.py, client/share_protocol.py): queue semantics, per-record acks (Kafka's KIP-932)
    SHARE_FETCH = 40  # acknowledge what was delivered, and acquire records for a lock duration
    SHARE_ACKNOWLEDGE = 41  # acknowledge only
    LIST_SHARE_GROUPS = 42
    DESCRIBE_SHARE_GROUP = 43
    ALTER_SHARE_GROUP = 44  # set or reset a share group's settings
    SHARE_STATE_COPY = 45  # cluster, broker to broker: share-partition state copied to (or pulled from) another broker
    # internal: router <-> worker only
    PING = 30
    ADOPT = 31  # take this partition now (assign frame carries slot and epoch)
    REPLICA_APPEND = 32  # cluster follower: append batches as the partition's leader stored them (router/replicas.py)
    LEADER_AND_ISR = 33  # cluster leader: the partition's replicas, ISR and leader epoch (actors/replication.py)


class GroupHeartbeatRequest(msgspec.Struct, omit_defaults=True):
    member_id: str = ""  # "" to join
    member_epoch: int = 0  # 0 join, -1 leave, -2 leave for now (a static member keeps its partitions until its session ends)
    instance_id: str = ""  # static membership (Kafka's group.instance.id)
    topics: list[str] | None = None  # the subscription; None: unchanged
    owned: list[tuple[str, int]] = []  # the partitions the member holds now
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000


class GroupHeartbeatReply(msgspec.Struct):
    member_id: str
    member_epoch: int
    assignment: list[tuple[str, int]]  # what the member may hold now: revoke the rest, start the new
    heartbeat_interval_ms: int  # when to come back (sooner while partitions are moving)


class OffsetCommitRequest(msgspec.Struct, omit_defaults=True):
    offsets: list[tuple[str, int, int]]  # (topic, partition, next offset to read)
    member_id: str = ""  # "" only while the group has no members (a reset, or a consumer outside it)
    member_epoch: int = -1
    # cluster, broker to broker only: > 0, the coordinator's copy of the group's whole offsets at this
    # version (every broker keeps every group's offsets: router/groups.py); deleted: the group is gone
    replica: int = 0
    deleted: bool = False


class FindCoordinatorReply(msgspec.Struct):
    broker_id: int  # -1: a single host (the broker asked coordinates every group)
    endpoint: str  # the coordinator's client endpoint ("": the broker asked)


class ListGroupsRequest(msgspec.Struct, omit_defaults=True):
    replicas: bool = False  # cluster, broker to broker: every group this broker holds offsets of, with them and their version


class CommittedOffsets(msgspec.Struct):
    offsets: list[tuple[str, int, int]]


class OffsetFetchRequest(msgspec.Struct, omit_defaults=True):
    topics: list[str] | None = None  # None: every topic the group has offsets for


class GroupMember(msgspec.Struct):
    member_id: str
    instance_id: str
    topics: list[str]
    assignment: list[tuple[str, int]]  # its target: what it will hold once partitions have moved
    owned: list[tuple[str, int]]  # what it holds now (revoking included)


class GroupInfo(msgspec.Struct):
    group: str
    state: str  # empty | stable | reconciling
    epoch: int
    members: list[GroupMember]
    offsets: list[tuple[str, int, int]]
    version: int = 0  # how many times its offsets were written (a cluster keeps the highest copy)


class ListGroupsReply(msgspec.Struct):
    groups: list[GroupInfo]  # members and offsets left out (empty lists)


class SetWorkersRequest(msgspec.Struct):
    workers: int


class CreatePartitionsRequest(msgspec.Struct):
    partitions: int  # the new total, more than the topic has (Kafka's totalCount)


class AlterConfigsRequest(msgspec.Struct):
    config: dict[str, str]  # name -> value; "" resets the name to the broker's default


class AlterPartitionReassignmentsRequest(msgspec.Struct):
    """ALTER_PARTITION_REASSIGNMENTS (section 4.7d'): partitions of the routing header's topic ->
    the broker ids each moves to, the preferred leader first (Kafka's AlterPartitionReassignments)."""
    partitions: dict[int, list[int]]


class PartitionReassignment(msgspec.Struct):
    """One partition as the reassignment left it: while it is under way ``replicas`` is the target
    followed by the replicas it replaces and ``target`` says where it goes ([]: nothing pending,
    the replicas are the target already)."""
    partition: int
    replicas: list[int]
    target: list[int]
    leader: int
    leader_epoch: int
    isr: list[int]


class AlterPartitionReassignmentsReply(msgspec.Struct):
    partitions: list[PartitionReassignment]  # in partition order


# What each op takes (frames, the header rule, who serves it, its ACL need): client/ops.py, SPEC.


class Acks(enum.IntEnum):
    NONE = 0  # no reply at all (one-way)
    MEMORY = 1  # replied once the batch is in the shared-memory ring
    DURABLE = 2  # replied once the flusher's fsync covers the batch (a replicated partition: on every in-sync replica)
    ALL = 3  # replied once every in-sync replica holds the batch (the high watermark covers it; Kafka's acks=all)


ACKS_BY_NAME = {"none": Acks.NONE, "memory": Acks.MEMORY, "durable": Acks.DURABLE, "all": Acks.ALL}


class ErrorCode(enum.IntEnum):
    OK = 0
    MALFORMED = 1  # wrong frame count, undecodable header, bad routing header
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OP = 3
    UNKNOWN_TOPIC = 4
    UNKNOWN_PARTITION = 5
    CORRUPT_BATCH = 6  # CRC-32C mismatch or inconsistent batch structure
    BATCH_TOO_LARGE = 7
    OFFSET_OUT_OF_RANGE = 8  # details carry log_start_offset and high_watermark
    NOT_OWNER = 9  # this worker does not own the partition (retriable, refresh metadata)
    BACKPRESSURE = 10  # the partition's ring is full; retry after a short wait
    STORAGE_UNAVAILABLE = 11  # the journal cannot be written (latched I/O error)
    TOPIC_EXISTS = 12
    SHM_BUDGET_EXCEEDED = 13
    INVALID_REQUEST = 14  # a field out of range (negative offset, bad partitions count...)
    TIMEOUT = 15
    NOT_READY = 16  # broker still starting or shutting down (retriable)
    INTERNAL = 17
    NOT_AUTHORIZED = 18  # the principal may not do this (or its key left the allow-list); nothing changed
    AUTHENTICATION_FAILED = 19  # the CURVE handshake was refused (no key, wrong key, unknown key)
    UNKNOWN_MEMBER_ID = 20  # the group does not know this member (it left, or its session expired): join again
    FENCED_MEMBER_EPOCH = 21  # the member does not own what it commits (its partitions moved): nothing stored
    GROUP_NOT_EMPTY = 22  # the group has members: it cannot be deleted or have its offsets reset
    UNKNOWN_GROUP = 23
    OUT_OF_ORDER_SEQUENCE = 24  # an idempotent batch's base sequence is not the next one the partition expects: nothing stored
    INTERNAL_TOPIC = 25  # the topic is the broker's own (__consumer_offsets): topic admin may not create, alter or delete it
    STORAGE_FULL = 26  # the journal's filesystem is fuller than disk_max_used_ratio: produce refused, nothing stored (retriable)
    FETCH_SESSION_NOT_FOUND = 27  # FETCH_MULTI: the worker holds no such session (expired, or the worker restarted): send every position again
    INVALID_TIMESTAMP = 28  # a CreateTime record's timestamp is further from the broker's clock than the topic allows: nothing stored
    NOT_LEADER_OR_FOLLOWER = 29  # cluster: this broker does not lead the partition (ErrorReply.endpoint: the leader's, if it has one)
    NOT_CONTROLLER = 30  # cluster: topic admin goes to the controller broker (ErrorReply.endpoint: its endpoint)
    NOT_COORDINATOR = 32  # cluster: another broker coordinates this group (ErrorReply.endpoint: its endpoint)
    METADATA_UNAVAILABLE = 31  # cluster: etcd cannot be reached or has no controller now: the metadata change was not made (retriable)
    NOT_ENOUGH_REPLICAS = 33  # cluster: fewer in-sync replicas than min.insync.replicas: an acks=all/durable batch is refused, nothing stored (retriable)
    INVALID_RECORD_STATE = 34  # share groups: an acknowledgement of records this member does not hold (not acquired, or its lock expired): nothing changed for them


RETRIABLE = frozenset({ErrorCode.NOT_OWNER, ErrorCode.BACKPRESSURE, ErrorCode.NOT_READY, ErrorCode.TIMEOUT,
                       ErrorCode.STORAGE_FULL, ErrorCode.FETCH_SESSION_NOT_FOUND, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                       ErrorCode.NOT_CONTROLLER, ErrorCode.METADATA_UNAVAILABLE, ErrorCode.NOT_COORDINATOR,
                       ErrorCode.NOT_ENOUGH_REPLICAS})


def pack_routing(op: int, partition: int, request_id: int, topic: bytes, code: int = 0) -> bytes:
    return ROUTING.pack(PROTOCOL_VERSION, op, code, partition, request_id) + topic


def unpack_routing(frame: bytes) -> tuple[int, int, int, int, int, bytes]:
    """Return (version, op, code, partition, request_id, topic); raises struct.error if short."""
    version, op, code, partition, request_id = ROUTING.unpack_from(frame)
    return version, op, code, partition, request_id, frame[ROUTING_BYTES:]


# --- msgpack headers (frame 1). Field names are the wire names. -------------------------------


class ProduceRequest(msgspec.Struct, omit_defaults=True):
    acks: int = Acks.MEMORY
    timeout_ms: int = 30_000


class ProduceReply(msgspec.Struct):
    base_offset: int
    record_count: int
    append_time_us: int
    throttle_ms: int = 0  # how long the broker held this reply back: the client is over its quota


# PRODUCE_MULTI (docs/PROTOCOL.md 4.1a): frame 1 names the partitions, frames 2.. carry one record
# batch each, in that order; the reply holds one outcome per partition, in the same order. One
# partition's error never fails its neighbours; a durable request is answered once the fsync covers
# every batch of it that was stored.
MAX_REQUEST_PARTITIONS = 4096  # partitions (batch frames) one multi-partition request may carry
NO_SLOT = 0xFFFF_FFFF  # router -> worker, in a multi-partition assign entry: not routed to you; the epoch field is the code
ASSIGN_COUNT = struct.Struct("<I")  # router -> worker: a many-partition op's assign frame starts with its entry count


class ProduceMultiRequest(msgspec.Struct, omit_defaults=True):
    partitions: list[int]  # the partition of each batch frame, in frame order; no partition twice
    acks: int = Acks.MEMORY
    timeout_ms: int = 30_000


class PartitionOutcome(msgspec.Struct, array_like=True):
    """One partition's outcome in a multi-partition reply: a msgpack array
    ``[partition, code, base_offset, record_count, append_time_us, message]``; ``code`` 0 is
    stored (base_offset..base_offset+record_count-1; a retried batch answers its first
    storing), else an ErrorCode whose meaning is the single-partition op's, with ``message``."""
    partition: int
    code: int
    base_offset: int = -1
    record_count: int = 0
    append_time_us: int = 0
    message: str = ""


class ProduceMultiReply(msgspec.Struct):
    results: list[PartitionOutcome]
    throttle_ms: int = 0  # how long the broker held this reply back: the client is over its quota


class FetchRequest(msgspec.Struct, omit_defaults=True):
    offset: int
    max_bytes: int = 1 << 20
    max_records: int = 1 << 20
    max_wait_ms: int = 0
    isolation: str = "memory"  # "memory": up to the high watermark; "durable": up to the durable watermark
    # cluster, broker to broker only: the follower broker asking (its log ends at ``offset``), and
    # what it has synced; it reads the leader's whole log, past the high watermark
    replica: int = -1
    replica_durable: int = -1
    # ... and the leader epoch of its batch just below ``offset`` (-1: its copy is empty), which
    # the leader checks against its own log (KIP-320's last fetched epoch): a copy that diverged
    # is answered with where to cut it (FetchReply.diverging_*), not with batches
    last_epoch: int = -1
    leader_epoch: int = -1  # the leader epoch the follower follows: a leader at another refuses (NOT_LEADER_OR_FOLLOWER)


class LeaderAndIsrRequest(msgspec.Struct, omit_defaults=True):
    """LEADER_AND_ISR (router -> worker): this broker leads a replicated partition; who else holds
    it and which of them are in sync (Kafka's LeaderAndIsr)."""
    leader: int  # this broker's id
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    min_isr: int = 1  # the topic's min.insync.replicas
    lag_ms: int = 30_000  # replica.lag.time.max.ms: a follower not caught up this long leaves the ISR


class ReplicaAppendRequest(msgspec.Struct, omit_defaults=True):
    """REPLICA_APPEND (router -> worker): frame 2 holds whole batches back to back, as the leader's
    FETCH returned them (empty: only say where the copy ends)."""
    leader: int = -1  # the broker the batches came from
    leader_epoch: int = 0  # its leader epoch when the follower asked
    wait_sync: bool = False  # with no batches: answer once the copy is synced to its end (router/replicas.py)
    truncate_to: int = -1  # cut the copy back to this offset (a batch boundary at or below, see actors/truncate.py) before appending; -1: no cut
    # ... or less: to where the copy's own batches of this epoch end, if that is lower (the
    # leader's diverging epoch: FetchReply.diverging_epoch; -1: truncate_to as it is)
    truncate_epoch: int = -1


class ReplicaAppendReply(msgspec.Struct):
    log_end: int  # the follower's next offset: where its next fetch from the leader starts
    durable_end: int  # what its flusher has synced
    log_start: int
    leader_epoch: int = 0  # echoed
    last_epoch: int = -1  # the leader epoch of the copy's batch just below log_end (-1: empty)


class FetchMultiRequest(msgspec.Struct, omit_defaults=True):
    """FETCH_MULTI (docs/PROTOCOL.md 4.2a). ``partitions`` and ``offsets`` pair up: where to read
    each partition from. In a session (``session_id`` > 0) they list only what changed since the
    session's last request (positions that moved, partitions added); ``forget`` drops partitions."""
    partitions: list[int] = []
    offsets: list[int] = []
    max_bytes: int = 1 << 20  # per partition
    max_records: int = 1 << 20  # per partition
    max_total_bytes: int = 16 << 20  # the whole reply: partitions past it are left for the next request
    max_wait_ms: int = 0  # wait this long for any partition to have data
    isolation: str = "memory"
    session_id: int = -1  # -1: no session; 0: open one (the reply names it); > 0: the session's id
    forget: list[int] = []


class PartitionFetch(msgspec.Struct, array_like=True):
    """One partition's part of a FETCH_MULTI reply, a msgpack array ``[partition, code,
    high_watermark, durable_watermark, log_start_offset, next_offset, body_bytes, message]``: its
    batches are the next ``body_bytes`` of frame 2 (section 4.2a)."""
    partition: int
    code: int
    high_watermark: int = -1
    durable_watermark: int = -1
    log_start_offset: int = -1
    next_offset: int = -1
    body_bytes: int = 0
    message: str = ""


class FetchMultiReply(msgspec.Struct):
    results: list[PartitionFetch]
    session_id: int = -1
    throttle_ms: int = 0


class FetchReply(msgspec.Struct):
    high_watermark: int
    durable_watermark: int
    log_start_offset: int
    next_offset: int  # where the next fetch should start
    source: str = ""  # "ring" or "disk" (diagnostic)
    throttle_ms: int = 0  # how long the broker held this reply back: the client is over its quota
    # a replica's FETCH whose copy diverged from the leader's log: the largest epoch at or below
    # its last_epoch that the leader's log holds, and where that epoch ends there; the follower
    # cuts its copy to min(diverging_end, its own end of that epoch) and fetches again (-1: no divergence)
    diverging_epoch: int = -1
    diverging_end: int = -1


class ListOffsetsRequest(msgspec.Struct, omit_defaults=True):
    timestamp_ms: int = -1  # >= 0: also find each partition's first offset appended at or after it
    local: bool = False  # cluster: this broker's own log only (what one broker asks another); default: every leader's


class DescribeRequest(msgspec.Struct, omit_defaults=True):
    local: bool = False  # cluster: this broker's partitions as it holds them (what one broker asks another)


WATCH_BELL_PREFIX = "tailrace-bell-"  # a WATCH's doorbell: an abstract Unix datagram socket named so
WATCH_BELL_MAX = 100  # characters of its name (sockaddr_un holds 107 after the leading NUL)
WATCH_SLOTS_MAX = 4096  # ring slots one WATCH may name (the control table's rows)


class WatchRequest(msgspec.Struct, omit_defaults=True):
    """Same host only (a worker's Unix socket, docs/PROTOCOL.md 8d): when it appends to one of
    ``slots`` (at most twice per loop turn; with isolation "durable", after every sync) the worker sends
    one byte to the abstract Unix datagram socket ``bell`` (its name without the leading NUL,
    starting with ``WATCH_BELL_PREFIX``). One watch per connection: a new one replaces it, an
    empty ``slots`` ends it, and so does closing the connection."""
    bell: str
    slots: list[int] = []
    isolation: str = "memory"


class PartitionOffsets(msgspec.Struct):
    partition: int
    log_start_offset: int
    high_watermark: int
    durable_watermark: int
    ring_unflushed_bytes: int = 0  # bytes in the ring not yet written to the journal (what backpressure counts)
    appended_bytes: int = 0  # bytes appended to the ring since the broker's last full start
    # with ListOffsetsRequest.timestamp_ms: the earliest offset whose batch was appended at or
    # after it and that append time (-1, -1: every record is older; Kafka's offsetsForTimes null)
    time_offset: int = -1
    time_timestamp_ms: int = -1


class ListOffsetsReply(msgspec.Struct):
    topic: str
    partitions: list[PartitionOffsets]


class CreateTopicRequest(msgspec.Struct, omit_defaults=True):
    partitions: int
    ring_bytes: int = 0  # 0 = broker default
    config: dict[str, str] = {}  # the topic's own settings (TOPIC_CONFIGS), Kafka's --config
    # copies of each partition, on distinct brokers (cluster only; 0 = the default: 1; a single host holds one)
    replication_factor: int = 0


class TopicInfo(msgspec.Struct):
    name: str
    topic_id: int
    partitions: int
    ring_bytes: int
    config: dict[str, str] = {}  # effective settings: the topic's own, else the broker's default
    replication_factor: int = 1


from .topic_configs import TOPIC_CONFIGS  # noqa: E402,F401 - a part of the wire's vocabulary, kept beside it


class PartitionInfo(msgspec.Struct):
    partition: int
    worker: int
    endpoint: str
    log_start_offset: int = 0
    high_watermark: int = 0
    durable_watermark: int = 0
    adopted: bool = False  # the owner has taken the partition on: clients may address it directly
    slot: int = -1  # the partition's ring slot (same-host readers map /tailrace-<instance>-r<slot>)
    local_endpoint: str = ""  # the owner's same-host endpoint, unix://... (client/unixwire.py)
    ring_unflushed_bytes: int = 0  # as PartitionOffsets
    appended_bytes: int = 0
    # cluster (else -1 / ""): the broker leading the partition (-1: none, it is unavailable), its
    # leader epoch, and that broker's client endpoint when it is not the broker that answered
    leader: int = -1
    leader_epoch: int = -1
    leader_endpoint: str = ""
    replicas: list[int] = []  # cluster: the brokers holding a copy, the preferred leader first
    isr: list[int] = []  # cluster: the replicas in sync with the leader
    target: list[int] = []  # cluster: a reassignment under way: the replicas it moves to ([]: none)


class DescribeReply(msgspec.Struct):
    topic: TopicInfo
    partitions: list[PartitionInfo]
    instance: str = ""  # shared-memory instance name of the broker (same-host ring reads)
    data_id: int = 0  # the data directory's identity, as the control table carries it
    max_batch_bytes: int = 0  # the largest batch the broker takes (its max_batch_bytes; 0: not said)
    broker_id: int = -1  # cluster: the answering broker's id (-1: a single host)


class ListTopicsRequest(msgspec.Struct, omit_defaults=True):
    internal: bool = False  # also the broker's own topics (__consumer_offsets), hidden otherwise


class ListTopicsReply(msgspec.Struct):
    topics: list[TopicInfo]


ERROR_TEXT_MAX = 1024  # an error's message is cut here: a reply never echoes much of a request


class ErrorReply(msgspec.Struct, omit_defaults=True):
    message: str
    log_start_offset: int = -1
    high_watermark: int = -1
    endpoint: str = ""  # NOT_LEADER_OR_FOLLOWER / NOT_CONTROLLER: the client endpoint of the broker to ask instead

    def __post_init__(self):
        if len(self.message) > ERROR_TEXT_MAX:
            self.message = self.message[: ERROR_TEXT_MAX - 20] + f"... ({len(self.message)} chars)"


def echo_topic(topic: bytes) -> bytes:
    """The topic a reply's routing header repeats: a name over the limit is not repeated."""
    return topic if len(topic) <= MAX_TOPIC_BYTES else b""


# What a header decode can raise on hostile bytes: msgspec's own error, bad UTF-8 in a topic,
# and RecursionError for msgpack nested past the interpreter's depth (every one is MALFORMED).
DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class PingReply(msgspec.Struct):
    """A worker's answer to the router's PING (every HEARTBEAT_S): who and what it is, and the
    load it saw since its last answer (router/load.py turns these into partition loads)."""

    worker: int
    pid: int
    boot_ns: int  # changes when the worker restarts
    partitions: int  # actors it hosts
    bytes: dict[int, int] = {}  # slot -> bytes appended since the last PING
    busy: list[int] = []  # slots with parked fetches or durable waiters now
    held: dict[int, int] = {}  # slot -> how many of those
    totals: list[int] = []  # TOTALS since the worker started: records and bytes in (produced) and out (fetched)
    unflushed: int = 0  # records its partitions hold that are not yet durable
    isr: dict[int, list[int]] = {}  # slot -> the ISR its leader wants now, where it differs (actors/replication.py)


TOTALS = ("records_in", "bytes_in", "records_out", "bytes_out")


class WorkerStatus(msgspec.Struct):
    worker: int
    endpoint: str
    partitions: int
    alive: bool
    retiring: bool


class StatusReply(msgspec.Struct):
    """The router's STATUS (and SET_WORKERS) answer; ``Admin.status()`` returns it as a dict."""

    pid: int
    uptime_s: float
    bind: str
    data_dir: str
    generation: int
    forwarded: int  # produce and fetch requests forwarded to workers
    moves: list[list[int]]  # [slot, from worker, to worker] of every move since start
    topics: int
    partitions: int
    worker_count: int
    spread_pending: bool
    workers: list[WorkerStatus]
    # traffic the workers counted since they started, restarts included (TOTALS; what same-host ring readers take is not seen)
    records_in: int = 0
    bytes_in: int = 0
    records_out: int = 0
    bytes_out: int = 0
    rates: dict[str, float] = {}  # the same per second, over the last RATE_WINDOW_S
    unflushed_records: int = 0  # acked records not yet durable, over all partitions
    journal_bytes: int = 0  # the journal's disk use
    shm_used_bytes: int = 0  # the topics' rings' full sizes (the most they could hold; rings are sparse)
    shm_resident_bytes: int = 0  # the memory this broker's shared regions hold now (at most the budget, plus the table)
    shm_budget_bytes: int = 0
    storage_full: bool = False  # produce is refused (STORAGE_FULL) until the journal's filesystem has room
    disk_used_ratio: float = -1.0  # the journal's filesystem, as the flusher last saw it (-1: not known)
    disk_max_used_ratio: float = 0.0  # the limit (the broker's setting)
    records_force_deleted: int = 0  # records disk_full_policy=delete_oldest deleted inside retention, since boot
    cluster: dict | None = None  # --cluster: broker id, controller, live brokers' endpoints, partitions led per broker


class Empty(msgspec.Struct):
    pass


EMPTY_MAP = b"\x80"
encode = msgspec.msgpack.Encoder().encode


def decoder(kind):
    return msgspec.msgpack.Decoder(kind)


# --- fast multipart I/O: client/multipart.py (re-exported: P.send_frames, P.drain, ...) ------------
from .multipart import (COPY_THRESHOLD, NOBLOCK, RCVMORE, SNDMORE, _get, _recv, drain, recv_frames,  # noqa: E402,F401
                        recv_frames_nocopy, send_frames, socket_events)
