"""The request envelope: the checks every request passes before its handler, the same at the
router and at a worker, each against the op's row in client/ops.py.

In the order a request meets them:

1. access (``refusal``, with ``--auth curve`` and ACL rules): the principal's rules allow the
   op's ACL operation on what the routing header names; an internal op (PING, ADOPT) is never
   allowed to a client. Refused: ``NOT_AUTHORIZED``, with the topic echoed.
2. the routing header (``Envelope.check``): topic at most MAX_TOPIC_BYTES (else
   ``INVALID_REQUEST``, and the reply's topic is left empty: a reply never echoes much of a
   request), version (``UNSUPPORTED_VERSION``), an op this endpoint takes (``UNKNOWN_OP``; a
   same-host-only op at the router is ``INVALID_REQUEST``), the op's frame count
   (``MALFORMED``), and an internal op only from the router (``UNKNOWN_OP`` without auth).

Headers (frame 1) are decoded by the handlers, with the struct the row names: a decode error is
``MALFORMED`` there. Quotas do not refuse: the worker holds a reply over its principal's rate
back (broker/quota.py). A refusal is a (code, message) pair the caller sends in its own reply
shape (the worker counts replies, the router does not), so each endpoint keeps its one reply
function.

Per request this is a dict lookup by op and a few integer compares, as before the spec existed.
"""

from __future__ import annotations

import struct

from tailrace.client import ops
from tailrace.client import protocol as P

from . import auth

Refusal = tuple[int, str]  # (ErrorCode, message)


class Envelope:
    """The routing-header checks of one endpoint, ``"router"`` or ``"worker"``."""

    def __init__(self, endpoint: str):
        assert endpoint in ("router", "worker"), endpoint
        self.endpoint = endpoint
        self.frames = ops.frames_at(endpoint)  # op -> frame counts taken here
        self.internal = ops.INTERNAL_OPS
        # ops known here but served elsewhere: the refusal they get instead of "unknown op"
        self.elsewhere: dict[int, Refusal] = {}
        for row in ops.SPEC:
            if row.op in self.frames:
                continue
            if row.served == ops.WORKER_UNIX:
                why = (P.ErrorCode.INVALID_REQUEST,
                       f"{row.op.name} is served on a worker's Unix socket only (same host: docs/PROTOCOL.md 8d)")
            elif row.served == ops.INTERNAL:
                why = (P.ErrorCode.UNKNOWN_OP, f"op {int(row.op)} ({row.op.name}) is internal: router to worker only")
            else:
                why = (P.ErrorCode.UNKNOWN_OP, f"unknown op {int(row.op)} ({row.op.name} is served by the router)")
            self.elsewhere[row.op] = why

    def check(self, version: int, op: int, topic: bytes, nframes: int, from_router: bool = False) -> Refusal | None:
        """Why this request is refused here (None: hand it to its handler). ``nframes`` counts
        the routing header and what follows it; ``from_router``: it came on the router's link."""
        if len(topic) > P.MAX_TOPIC_BYTES:
            return P.ErrorCode.INVALID_REQUEST, f"topic name of {len(topic)} bytes: at most {P.MAX_TOPIC_BYTES}"
        if version not in P.PROTOCOL_VERSIONS:
            return P.ErrorCode.UNSUPPORTED_VERSION, f"protocol version {version} unsupported; this broker speaks {P.PROTOCOL_VERSIONS}"
        accepted = self.frames.get(op)
        if accepted is None:
            return self.elsewhere.get(op) or (P.ErrorCode.UNKNOWN_OP, f"unknown op {op}")
        if op in self.internal and not from_router:  # before the frame count: a client learns nothing of its shape
            return P.ErrorCode.UNKNOWN_OP, f"op {int(op)} ({P.Op(op).name}) is internal: router to worker only"
        if nframes not in accepted:
            return P.ErrorCode.MALFORMED, ops.frame_count_message(op, nframes, len(accepted) > 1)
        return None


def refusal(acls, principal: str, ident: list, frames: list) -> list | None:
    """The NOT_AUTHORIZED reply frames for a client request ``[*ident, routing, ...]`` its
    principal's rules do not allow, else None (allowed, no rules, or a routing header too short
    to read: the envelope answers that one MALFORMED)."""
    if acls is None or not acls.enabled or len(frames) <= len(ident):
        return None
    routing = frames[len(ident)]
    try:
        _v, op, _c, _p, _r, topic = P.unpack_routing(routing)
    except struct.error:
        return None
    why = acls.refusal_for(principal, op, topic)
    return None if why is None else auth.refusal(ident, routing, why)
