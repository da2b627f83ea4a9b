"""Reading one of the broker's own topics back at a router start, step by step.

The share coordinator (router/share.py) and the timer (router/timer.py) keep their state in an
internal topic of one partition and rebuild it at start by reading that topic from its log start
to its high watermark, through the partition's owner like any fetch. ``ReadBack`` is that loop:
``step`` asks for the next ``READ_BYTES`` (again at each ``due`` tick while unanswered), ``take``
turns the owner's reply into the next body to apply (moving past a log start that retention
moved), and ``done`` says when the high watermark was reached.
"""

from __future__ import annotations

import time
from typing import Callable

from tailrace.client import protocol as P

READ_BYTES = 8 << 20  # one step's read, at most
RETRY_S = 2.0  # a step unanswered this long is asked again

_fetch_reply = P.decoder(P.FetchReply)
_error_reply = P.decoder(P.ErrorReply)


class ReadBack:
    def __init__(self, topic: str, next_id: Callable[[], int], send_internal: Callable):
        self.topic = topic.encode()
        self.next_id, self.send_internal = next_id, send_internal
        self.offset = 0  # the next offset to apply
        self.rid = 0  # the step in flight
        self.sent = 0.0
        self.done = False

    def due(self, now: float) -> bool:
        return not self.done and now - self.sent > RETRY_S

    def step(self) -> None:
        self.sent = time.monotonic()
        self.rid = self.next_id()
        header = P.encode(P.FetchRequest(self.offset, max_bytes=READ_BYTES))
        self.send_internal(self.topic, 0, [P.pack_routing(P.Op.FETCH, 0, self.rid, self.topic), header])

    def take(self, code: int, frames: list):
        """The body of a step's reply to apply (records below ``offset`` are to be skipped), or
        None (nothing to apply: the step was asked again, or the tick will ask it again). After
        applying it, call ``advance``."""
        if code == P.ErrorCode.OFFSET_OUT_OF_RANGE:  # retention moved the log start: on from there
            err = _error_reply.decode(frames[1])
            if 0 <= err.high_watermark < self.offset:  # a start offset past the log (its owner's note is newer): all of it
                self.offset = 0
            self.offset = max(self.offset, err.log_start_offset)
            self.step()
            return None
        if code != P.ErrorCode.OK:
            return None
        self._head = _fetch_reply.decode(frames[1])
        return frames[2] if len(frames) > 2 and len(frames[2]) else b""

    def advance(self) -> bool:
        """After a body was applied: True when the high watermark is reached, else the next step goes."""
        self.offset = max(self.offset, self._head.next_offset)
        if self.offset >= self._head.high_watermark:
            self.done = True
        else:
            self.step()
        return self.done
