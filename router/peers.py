"""Router -> router links in a cluster: the questions one broker asks another.

A DESCRIBE_TOPIC or LIST_OFFSETS that a client asks any broker is answered for the whole topic
(docs/DESIGN.md "Cluster"): the broker answers the partitions it leads from its own workers and
asks each other live leader of the topic for the rest, with ``local=True`` (that broker's own log
only, never asked onwards). ``PeerLinks`` holds one DEALER per other broker's advertised client
endpoint, connected on first use and registered in the router's poller; replies come back as
ordinary client replies (``[routing, body]``), matched by the router's internal request id.
"""

from __future__ import annotations

import zmq

from tailrace.client import protocol as P


class PeerLinks:
    def __init__(self, ctx: zmq.Context, poller: zmq.Poller):
        self.ctx, self.poller = ctx, poller
        self.socks: dict[str, zmq.Socket] = {}  # endpoint -> DEALER

    def send(self, endpoint: str, frames: list[bytes]) -> bool:
        """Queue ``frames`` to the broker at ``endpoint``; False if they could not be queued."""
        sock = self.socks.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.connect(endpoint)
            self.socks[endpoint] = sock
            self.poller.register(sock, zmq.POLLIN)
        try:
            P.send_frames(sock, frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self) -> None:
        for sock in self.socks.values():
            self.poller.unregister(sock)
            sock.close(0)
        self.socks.clear()
