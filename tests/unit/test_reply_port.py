"""ReplyPort: replies out of a ROUTER socket never block and never queue without bound.

Real ZeroMQ sockets over ipc (the transport workers use), no broker."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from tailrace.broker import reply_port as RP
from tailrace.client import protocol as P

log = logging.getLogger("test")


@pytest.fixture
def pair(tmp_path):
    """make(rcvhwm) -> (ReplyPort on a ROUTER configured as the broker's, DEALER peer b"peer")."""
    ctx = zmq.Context()
    socks = []

    def make(rcvhwm: int):
        router = ctx.socket(zmq.ROUTER)
        RP.ReplyPort.configure(router)
        ep = f"ipc://{tmp_path}/r.ipc"
        router.bind(ep)
        peer = ctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.IDENTITY, b"peer")
        peer.setsockopt(zmq.RCVHWM, rcvhwm)
        peer.connect(ep)
        socks.extend((router, peer))
        peer.send(b"hello")  # the ROUTER knows a peer once it has heard from it
        assert router.poll(5000)
        router.recv_multipart()
        return RP.ReplyPort(router, log, "test"), peer

    yield make
    for s in socks:
        s.close(0)
    ctx.term()


def test_a_burst_past_the_hwm_waits_in_the_backlog_and_arrives_complete_and_in_order(pair):
    port, peer = pair(rcvhwm=10)  # the peer reads, but only after the burst
    for i in range(2000):
        assert port.send([b"peer", b"%d" % i])
    assert port.backlog, "2,000 replies to a peer holding 10 fit in 64 + kernel buffers?"
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 2000 and time.monotonic() < deadline:
        port.flush()
        while peer.poll(1):
            got.append(int(peer.recv()))
    assert got == list(range(2000)) and port.dropped == 0 and not port.backlog and port.total_backlog == 0


def test_a_peer_that_never_reads_costs_at_most_the_byte_budget_then_replies_drop(pair):
    port, _peer = pair(rcvhwm=1)
    big = bytes(1 << 20)
    sent = [port.send([b"peer", big]) for _ in range(200)]
    held = port.backlog_bytes.get(b"peer", 0)
    assert port.dropped > 0 and sent.count(False) == port.dropped
    assert held <= RP.PEER_BACKLOG_BYTES and port.total_backlog == held
    assert port.dropped >= 200 - RP.PEER_SNDHWM - RP.PEER_BACKLOG_BYTES // len(big) - 16  # 16: kernel buffers
    port.moved_at[b"peer"] -= RP.BACKLOG_STALL_S + 1  # as if it had not read for the stall time
    port.flush()
    assert not port.backlog and port.total_backlog == 0


def test_replies_to_a_peer_that_is_gone_are_dropped_not_raised(pair):
    port, _peer = pair(rcvhwm=1000)
    assert not port.send([b"ghost", b"reply"]) and port.dropped == 1
