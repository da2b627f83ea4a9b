"""The router's links to its workers: one DEALER per worker (identity ``b"router"``), connected
to the worker's endpoint, registered with the router's poller.

With ``--auth curve`` each DEALER carries the router's CURVE keys (broker/auth.py): the workers
obey only the router's proven key. Sends never block the loop on a worker that is down: its
DEALER queues up to the high-water mark, then ``send`` says False.
"""

from __future__ import annotations

import zmq

from tailrace.broker import settings as settings_mod
from tailrace.client import protocol as P

HWM = 100_000


class WorkerLinks:
    def __init__(self, s: settings_mod.Settings, ctx: zmq.Context | None, poller: zmq.Poller | None, keys=None):
        self.s = s
        self.ctx, self.poller, self.keys = ctx, poller, keys
        self.dealers: dict[int, zmq.Socket] = {}  # worker -> DEALER connected to its endpoint

    def __contains__(self, w: int) -> bool:
        return w in self.dealers

    def connect(self, w: int) -> None:
        if w in self.dealers or self.ctx is None:
            return
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.IDENTITY, P.ROUTER_IDENTITY)
        d.setsockopt(zmq.SNDHWM, HWM)
        d.setsockopt(zmq.RCVHWM, HWM)
        d.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            self.keys.apply(d)
        d.connect(self.s.worker_endpoint(w))
        self.dealers[w] = d
        self.poller.register(d, zmq.POLLIN)

    def disconnect(self, w: int) -> None:
        d = self.dealers.pop(w, None)
        if d is not None:
            self.poller.unregister(d)
            d.close(0)

    def send(self, w: int, frames: list[bytes]) -> None:
        P.send_frames(self.dealers[w], frames)

    def send_all(self, frames: list[bytes]) -> None:
        """To every worker, never blocking: a worker that is down queues up to the HWM, then
        misses this one (a ping: the next one goes in HEARTBEAT_S)."""
        for d in self.dealers.values():
            try:
                P.send_frames(d, frames, P.NOBLOCK)
            except zmq.Again:
                pass

    def close(self) -> None:
        for d in self.dealers.values():
            d.close(0)
        self.dealers.clear()
