"""One client request at the router, as a handler sees it (after the envelope check).

Handlers (router/topics.py, router/status.py, router/offsets.py, the group coordinator) take a
narrow context of their own and a ``Request``; they answer through ``reply``, once, now or
later (an offsets question or a group commit is answered when a worker has replied).
"""

from __future__ import annotations

from typing import Callable, NamedTuple


class Request(NamedTuple):
    ident: bytes  # the client's ROUTER identity
    routing: bytes  # the routing header as it came
    op: int
    partition: int
    topic: bytes  # the routing header's topic field: a topic, a group, or empty (client/ops.py ``names``)
    frames: list[bytes]  # [ident, routing, header map, body...]
    reply: Callable  # reply(code, body struct or None): the routing header echoed (router/server.py)
    principal: str | None  # who asks, with --auth curve; else None

    @property
    def name(self) -> str:
        return self.topic.decode("utf-8", "replace")

    @property
    def header(self) -> bytes | None:
        """Frame 1, the header map; None when the op's row lets it be left out and it was."""
        return self.frames[2] if len(self.frames) > 2 else None
