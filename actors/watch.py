"""WATCH (docs/PROTOCOL.md 8d): same-host ring readers' doorbells, rung after appends.

A reader on the worker's Unix socket names an abstract socket address (its bell) and the slots
it reads; the worker sends one byte to the bell after a turn that appended to one of them (a
``durable`` reader: after a turn with a flusher sync instead). The connection's end is the
watch's end (``unwatch``), and a bell nobody holds any more ends its watch.
"""

from __future__ import annotations

import msgspec

from tailrace.client import protocol as P
from tailrace.shm.doorbell import Ringer

from .unix_server import UnixIdent

_watch_dec = msgspec.msgpack.Decoder(P.WatchRequest)


class Watchers:
    """The watches of one worker's Unix connections, and the ``Ringer`` that rings them."""

    def __init__(self, ringer: Ringer | None, rows: int):
        self.ringer = ringer
        self.rows = rows  # slots in the control table: a watch names slots below it
        # Unix connection identity -> (abstract address, slots, a durable reader: rung after syncs instead)
        self.bells: dict[bytes, tuple[bytes, frozenset[int], bool]] = {}

    def ring(self, appended=(), synced: bool = False) -> None:
        """One byte to each memory reader watching a slot in ``appended`` (with ``synced``: to
        each durable reader); a bell nobody holds any more ends its watch."""
        for ident, (bell, slots, durable) in list(self.bells.items()):
            if (synced and durable) or (not durable and not slots.isdisjoint(appended)):
                if not self.ringer.ring(bell, b"w"):
                    del self.bells[ident]

    def unwatch(self, ident: bytes) -> None:
        """A Unix connection closed: its watch ends with it."""
        self.bells.pop(ident, None)


def watch(ctx: Watchers, ident, assign, topic, partition, rest, who, reply) -> None:
    """Ring this connection's doorbell after turns that append to the slots it names (no slots:
    the watch ends). Only on the Unix socket: the bell is a local address."""
    if len(ident) != 1 or type(ident[0]) is not UnixIdent:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            "WATCH is served on a worker's Unix socket only (same host: docs/PROTOCOL.md 8d)"))
    req = _watch_dec.decode(rest[1])
    bell = req.bell
    if not bell.startswith(P.WATCH_BELL_PREFIX) or len(bell) > P.WATCH_BELL_MAX or "\x00" in bell:
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(
            f"bell {bell[:P.WATCH_BELL_MAX]!r}: an abstract socket name starting with {P.WATCH_BELL_PREFIX!r}, "
            f"at most {P.WATCH_BELL_MAX} characters"))
    rows = ctx.rows
    if len(req.slots) > P.WATCH_SLOTS_MAX or any(not 0 <= s < rows for s in req.slots):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"slots: at most {P.WATCH_SLOTS_MAX}, each 0..{rows - 1}"))
    if req.isolation not in ("memory", "durable"):
        return reply(P.ErrorCode.INVALID_REQUEST, P.ErrorReply(f"isolation {req.isolation!r}: memory or durable"))
    if req.slots:
        ctx.bells[ident[0]] = (b"\x00" + bell.encode(), frozenset(req.slots), req.isolation == "durable")
    else:
        ctx.bells.pop(ident[0], None)
    reply(P.ErrorCode.OK)
