"""The op spec: one row per request type, and every op table of the broker a view of it.

Kafka's ``ApiKeys`` and NATS's API table in one shape (docs/ARCHITECTURE decision 15). A row
says, for one op::

    op        the id in the routing header's byte 1 (``protocol.Op``)
    frames    request frames, routing header included: 2 (routing, header map), 3 with a body
    many      the header names many partitions of the topic (``partitions``): the router forwards
              it to one owner with an assign entry per partition (docs/PROTOCOL.md 8)
    bodies    the body is one frame per partition the header lists: 3 frames or more (up to
              MAX_REQUEST_PARTITIONS + 2)
    header    whether the router also takes the routing header alone (frame 1 left out)
    names     what the routing header's topic field carries: a topic, a group, or nothing
    served    who serves it to clients (SERVED): the router, a worker, or nobody (internal)
    acl       the ACL operation it needs under ``--auth curve`` with rules (broker/acl.py
              OPERATIONS), or INTERNAL for router -> worker commands, refused to every client
    request   the msgspec struct frame 1 is decoded as; None: frame 1 is never read
    reply     the struct of an OK reply's frame 1

Adding an op is: its row here, its handler, a client call, a CLI command. The router's and the
workers' frame tables, the ACL needs (broker/acl.py, which refuses to import if a client-facing
op names no operation it knows) and docs/PROTOCOL.md's op table (``doc_table``, compared by
tests/unit/test_ops.py; ``python -m tailrace.client.ops`` prints it) all come from ``SPEC``.

This module is the client layer: the ACL operation is a plain string here, checked against
broker/acl.py's list there, so a client can read what an op needs without the broker's code.
"""

from __future__ import annotations

from typing import NamedTuple

from . import protocol as P
from . import share_protocol as S
from .delayed import DelayedProduceReply, DelayedProduceRequest
from .protocol import Op

# Who serves an op to clients (the ``served`` column).
ROUTER = "router"  # the router answers it itself
COORDINATOR = "coordinator"  # the router's group coordinator (router/groups.py) answers it
SHARE = "share coordinator"  # the router's share-group coordinator (router/share.py) answers it
OWNER = "owner"  # the partition's owner: the router forwards it, a worker that hosts the partition serves it directly
ANY_WORKER = "any worker"  # the router asks a worker on the client's behalf; every worker serves it directly
WORKER_UNIX = "worker unix"  # a worker on its same-host Unix socket only (docs/PROTOCOL.md 8b, 8d)
INTERNAL = "internal"  # router -> worker only; refused to clients, with or without auth
SERVED = (ROUTER, COORDINATOR, SHARE, OWNER, ANY_WORKER, WORKER_UNIX, INTERNAL)
AT_ROUTER = frozenset({ROUTER, COORDINATOR, SHARE, OWNER, ANY_WORKER})  # the router takes these from clients
AT_WORKER = frozenset({OWNER, ANY_WORKER, WORKER_UNIX, INTERNAL})  # a worker takes these (INTERNAL from the router only)

# What the routing header's topic field names (the ``names`` column); it is also what an ACL rule
# is matched against: a topic, a group, or nothing (the op needs its operation on anything).
TOPIC, GROUP, NOTHING = "topic", "group", "nothing"


class OpSpec(NamedTuple):
    op: Op
    frames: int
    header: bool  # True: the router also takes the routing header alone (frame 1 may be left out)
    names: str
    served: str
    acl: str  # an ACL operation (broker/acl.py OPERATIONS), or INTERNAL
    request: type | None
    reply: type
    many: bool = False  # names many partitions: one assign entry each (see the top)
    bodies: bool = False  # one body frame per partition: ``frames`` or more (see the top)


R = OpSpec
SPEC: tuple[OpSpec, ...] = (
    #  op                   frames header  names    served       acl         request                    reply
    R(Op.PRODUCE,           3, False, TOPIC,   OWNER,       "produce",  P.ProduceRequest,          P.ProduceReply),
    R(Op.FETCH,             2, False, TOPIC,   OWNER,       "consume",  P.FetchRequest,            P.FetchReply),
    R(Op.LIST_OFFSETS,      2, True,  TOPIC,   ANY_WORKER,  "describe", P.ListOffsetsRequest,      P.ListOffsetsReply),
    R(Op.WATCH,             2, False, TOPIC,   WORKER_UNIX, "consume",  P.WatchRequest,            P.Empty),
    R(Op.PRODUCE_MULTI,     3, False, TOPIC,   OWNER,       "produce",  P.ProduceMultiRequest,     P.ProduceMultiReply, True, True),
    R(Op.FETCH_MULTI,       2, False, TOPIC,   OWNER,       "consume",  P.FetchMultiRequest,       P.FetchMultiReply,   True),
    R(Op.PRODUCE_DELAYED,   3, False, TOPIC,   ROUTER,      "produce",  DelayedProduceRequest,     DelayedProduceReply),
    R(Op.CREATE_TOPIC,      2, False, TOPIC,   ROUTER,      "create",   P.CreateTopicRequest,      P.TopicInfo),
    R(Op.LIST_TOPICS,       2, True,  NOTHING, ROUTER,      "describe", P.ListTopicsRequest,       P.ListTopicsReply),
    R(Op.DESCRIBE_TOPIC,    2, True,  TOPIC,   ROUTER,      "describe", P.DescribeRequest,         P.DescribeReply),
    R(Op.STATUS,            2, True,  NOTHING, ROUTER,      "admin",    None,                      P.StatusReply),
    R(Op.SET_WORKERS,       2, False, NOTHING, ROUTER,      "admin",    P.SetWorkersRequest,       P.StatusReply),
    R(Op.CREATE_PARTITIONS, 2, False, TOPIC,   ROUTER,      "alter",    P.CreatePartitionsRequest, P.TopicInfo),
    R(Op.ALTER_CONFIGS,     2, False, TOPIC,   ROUTER,      "alter",    P.AlterConfigsRequest,     P.TopicInfo),
    R(Op.DELETE_TOPIC,      2, False, TOPIC,   ROUTER,      "delete",   None,                      P.TopicInfo),
    R(Op.ALTER_PARTITION_REASSIGNMENTS, 2, False, TOPIC, ROUTER, "alter", P.AlterPartitionReassignmentsRequest,
      P.AlterPartitionReassignmentsReply),
    R(Op.GROUP_HEARTBEAT,   2, False, GROUP,   COORDINATOR, "group",    P.GroupHeartbeatRequest,   P.GroupHeartbeatReply),
    R(Op.OFFSET_COMMIT,     2, False, GROUP,   COORDINATOR, "group",    P.OffsetCommitRequest,     P.CommittedOffsets),
    R(Op.OFFSET_FETCH,      2, False, GROUP,   COORDINATOR, "group",    P.OffsetFetchRequest,      P.CommittedOffsets),
    R(Op.LIST_GROUPS,       2, False, NOTHING, COORDINATOR, "admin",    P.ListGroupsRequest,       P.ListGroupsReply),
    R(Op.DESCRIBE_GROUP,    2, False, GROUP,   COORDINATOR, "group",    None,                      P.GroupInfo),
    R(Op.DELETE_GROUP,      2, False, GROUP,   COORDINATOR, "group",    None,                      P.Empty),
    R(Op.FIND_COORDINATOR,  2, True,  GROUP,   ROUTER,      "group",    None,                      P.FindCoordinatorReply),
    R(Op.SHARE_FETCH,       2, False, GROUP,   SHARE,       "share",    S.ShareFetchRequest,       S.ShareFetchReply),
    R(Op.SHARE_ACKNOWLEDGE, 2, False, GROUP,   SHARE,       "share",    S.ShareFetchRequest,       S.ShareFetchReply),
    R(Op.LIST_SHARE_GROUPS, 2, False, NOTHING, SHARE,       "admin",    None,                      S.ListShareGroupsReply),
    R(Op.DESCRIBE_SHARE_GROUP, 2, False, GROUP, SHARE,      "share",    None,                      S.ShareGroupInfo),
    R(Op.ALTER_SHARE_GROUP, 2, False, GROUP,   SHARE,       "share",    S.AlterShareGroupRequest,  S.ShareGroupInfo),
    R(Op.SHARE_STATE_COPY,  2, False, NOTHING, SHARE,       "admin",    S.ShareStateCopy,          S.ShareStateCopy),
    R(Op.PING,              2, False, NOTHING, INTERNAL,    INTERNAL,   None,                      P.PingReply),
    R(Op.ADOPT,             2, False, TOPIC,   INTERNAL,    INTERNAL,   None,                      P.Empty),
    R(Op.REPLICA_APPEND,    3, False, TOPIC,   INTERNAL,    INTERNAL,   P.ReplicaAppendRequest,    P.ReplicaAppendReply),
    R(Op.LEADER_AND_ISR,    2, False, TOPIC,   INTERNAL,    INTERNAL,   P.LeaderAndIsrRequest,     P.Empty),
)
del R

BY_OP: dict[int, OpSpec] = {row.op: row for row in SPEC}


class SpecError(Exception):
    """Raised at import when a row of SPEC breaks a rule every op keeps."""


def check_spec(spec) -> None:
    """The rules every row keeps; raises SpecError naming the row (run at import, and by the tests
    on planted rows)."""
    seen = set()
    for row in spec:
        name = f"op {row.op.name} ({int(row.op)})"
        if row.op in seen:
            raise SpecError(f"{name}: two rows")
        seen.add(row.op)
        if row.frames not in (2, 3):
            raise SpecError(f"{name}: frames={row.frames}, 2 (routing header, header map) or 3 (and a body)")
        if row.many and (row.header or row.served != OWNER or row.request is None):
            raise SpecError(f"{name}: a many-partition op is served by the partitions' owner and names them in its header")
        if row.bodies and (row.frames != 3 or not row.many):
            raise SpecError(f"{name}: a frame per partition is 3 frames or more, of a many-partition op")
        if row.header and (row.frames != 2 or row.served not in AT_ROUTER):
            raise SpecError(f"{name}: only a 2-frame op the router takes may leave its header out")
        if row.served not in SERVED or row.names not in (TOPIC, GROUP, NOTHING):
            raise SpecError(f"{name}: served={row.served!r} names={row.names!r}")
        if (row.served == INTERNAL) != (row.acl == INTERNAL):
            raise SpecError(f"{name}: served={row.served!r} acl={row.acl!r}: internal ops, and only they, need INTERNAL")
        if not row.acl:
            raise SpecError(f"{name}: a client-facing op with no ACL operation (access control fails closed)")
    missing = [op.name for op in Op if op not in seen]
    if missing:
        raise SpecError(f"ops without a row: {', '.join(missing)}")


check_spec(SPEC)

# --- views -----------------------------------------------------------------------------------
INTERNAL_OPS = frozenset(row.op for row in SPEC if row.served == INTERNAL)
GROUP_OPS = frozenset(row.op for row in SPEC if row.served == COORDINATOR)
FORWARDED = frozenset(row.op for row in SPEC if row.served == OWNER)  # the router sends these to the owner
ACL_NEEDS = {row.op: row.acl for row in SPEC if row.served != INTERNAL}  # op -> ACL operation
READS_HEADER = frozenset(row.op for row in SPEC if row.request is not None)  # frame 1 decoded and checked
# op -> the decoder of its request header, by its row's ``request`` type: what every handler decodes frame 1 with
DECODERS = {row.op: P.decoder(row.request) for row in SPEC if row.request is not None}


def frame_counts(row: OpSpec, endpoint: str):
    """The request frame counts ``endpoint`` ("router" or "worker") takes for ``row``'s op."""
    if row.bodies:
        return range(row.frames, P.MAX_REQUEST_PARTITIONS + 3)
    return (row.frames, 1) if row.header and endpoint == "router" else (row.frames,)


def frames_at(endpoint: str) -> dict[int, tuple[int, ...] | range]:
    """op -> the request frame counts ``endpoint`` ("router" or "worker") takes."""
    served = AT_ROUTER if endpoint == "router" else AT_WORKER
    return {row.op: frame_counts(row, endpoint) for row in SPEC if row.served in served}


_FRAME_NAMES = ("routing header", "header map", "one record batch")


def frame_count_message(op: int, got: int, header_optional: bool = False) -> str:
    """The MALFORMED message for a request of ``op`` that came with ``got`` frames."""
    row = BY_OP[op]
    want = row.frames
    if row.bodies:
        return (f"op {Op(op).name} ({int(op)}) takes a routing header, a header map and one record batch per partition "
                f"(1 to {P.MAX_REQUEST_PARTITIONS}), got {got} frames")
    alt = " or 1 (the routing header alone)" if header_optional else ""
    return f"op {Op(op).name} ({int(op)}) takes {want} frames ({', '.join(_FRAME_NAMES[:want])}){alt}, got {got}"


# --- docs/PROTOCOL.md section 3's op table ------------------------------------------------------
_SERVED_TEXT = {
    ROUTER: ("yes", "no (`UNKNOWN_OP`)"),
    COORDINATOR: ("yes (group coordinator)", "no (`UNKNOWN_OP`)"),
    SHARE: ("yes (share-group coordinator)", "no (`UNKNOWN_OP`)"),
    OWNER: ("forwarded to the partition's owner", "yes, for partitions it hosts"),
    ANY_WORKER: ("asks a worker", "yes, any topic"),
    WORKER_UNIX: ("no (`INVALID_REQUEST`)", "on its Unix socket only"),
    INTERNAL: ("no (internal)", "from the router only"),
}


def doc_table() -> str:
    """The op table of docs/PROTOCOL.md section 3, as it must read there."""
    lines = ["| op | code | request frames | routing topic | router | worker directly | ACL operation | request (frame 1) | reply (frame 1) |",
             "|---|---:|---|---|---|---|---|---|---|"]
    for row in SPEC:
        frames = f"{row.frames} (or 1)" if row.header else f"2 + one per partition" if row.bodies else str(row.frames)
        at_router, at_worker = _SERVED_TEXT[row.served]
        acl = "none: refused to clients" if row.acl == INTERNAL else f"`{row.acl}`"
        request = f"`{row.request.__name__}`" if row.request is not None else "not read"
        lines.append(f"| `{row.op.name}` | {int(row.op)} | {frames} | {row.names} | {at_router} | {at_worker} | {acl} "
                     f"| {request} | `{row.reply.__name__}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(doc_table(), end="")
