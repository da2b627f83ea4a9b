"""The worker's loop waits on one epoll over its ZeroMQ sockets' ZMQ_FDs (actors/worker.py,
"Waiting on ZeroMQ sockets"). That fd signals edges, and a send on the socket can take in the
signal of an arrival: these tests put a real WorkerProcess (real shared memory, files, ipc
sockets; the storage stack the unit tests use) through exactly those moments, with a wait long
enough that a missed signal shows as a turn that blocks."""

from __future__ import annotations

import time

import pytest
import zmq

from tailrace.actors.worker import DRAIN_MAX, WorkerProcess
from tailrace.bench.inprocess import make_storage
from tailrace.client import protocol as P
from tailrace.client.connection import request_frames
from tailrace.client.records import encode_batch
from tailrace.shm.layout import COL

LONG_WAIT_MS = 4000  # the loop's wait in these tests: a lost signal costs all of it


@pytest.fixture
def loop(tmp_path):
    """(WorkerProcess serving on ipc, a DEALER client with identity b"client" connected to it)."""
    st = make_storage(tmp_path, ipc_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    proc = WorkerProcess(st.s, 0, st.flusher.table)
    ctx = zmq.Context()
    client = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.IDENTITY, b"client")
    client.connect(st.s.worker_endpoint(0))
    yield proc, client
    client.close(0)
    ctx.term()
    proc.stop()
    st.close()


def _ping(client, rid: int) -> None:
    client.send_multipart(request_frames(P.Op.PING, "", -1, rid))


def _turn(proc) -> float:
    """One loop turn with the long wait in place of the loop's idle one; seconds it took. (While
    replies wait for room in a peer's queue the loop's own short wait stays: that is no signal.)"""
    if not proc.worker.port.backlog:
        proc.timeout_ms = LONG_WAIT_MS
    t0 = time.monotonic()
    proc.do_work()
    return time.monotonic() - t0


def _serve_until_answered(proc, client, rid: int) -> None:
    """Turns until the reply to ``rid`` is at the client: while it is owed, no turn may wait
    out the long wait (a turn with nothing else to do returns once the request is seen)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        took = _turn(proc)
        assert took < LONG_WAIT_MS / 2000, f"a turn waited {took:.1f} s with request {rid} owed"
        while client.poll(100):  # a reply sent in the turn may still be crossing the socket
            frames = client.recv_multipart()
            if P.unpack_routing(frames[0])[4] == rid:
                return
    raise AssertionError(f"request {rid} not answered in 10 s")


def _settle(proc) -> None:
    """Turns until nothing is left to look at without a signal."""
    for _ in range(10):
        if not (proc.sock_due or proc.reads_due or proc.worker.port.zmq.touched):
            return
        proc.timeout_ms = 1
        proc.do_work()
    raise AssertionError("the loop still has sockets due after 10 turns")


def test_a_request_is_served_by_the_turns_its_arrival_wakes(loop):
    proc, client = loop
    _ping(client, 1)
    _serve_until_answered(proc, client, 1)


def test_a_request_whose_signal_a_send_took_in_is_served_by_the_next_turn(loop):
    proc, client = loop
    _ping(client, 1)  # the worker learns the client's identity
    _serve_until_answered(proc, client, 1)
    _settle(proc)  # the reply's send is looked at, and the socket is quiet again
    _ping(client, 2)
    time.sleep(0.1)  # arrived: the socket's fd holds the arrival's command
    assert proc.worker.port.send([b"client", P.pack_routing(P.Op.PING, -1, 99, b""), P.EMPTY_MAP])
    # that send processed the command: the fd is quiet, and only asking the socket finds request 2
    _serve_until_answered(proc, client, 2)


def test_a_drain_stopped_at_its_limit_is_taken_up_by_the_next_turn_without_a_signal(loop):
    """acks=none produce requests, as the router hands them over: nothing is sent back, so no
    send makes the loop ask the socket again; only the drain's own note that it stopped early does."""
    proc, _client = loop
    st_table = proc.worker.table
    router = proc.ctx.socket(zmq.DEALER)  # in the router's place (its identity, its frames)
    router.setsockopt(zmq.IDENTITY, P.ROUTER_IDENTITY)
    router.connect(proc.s.worker_endpoint(0))
    try:
        slot = proc.worker.catalog.get("t").slots[0]
        assign = P.ASSIGN.pack(slot, 2)  # a newer epoch than the storage stack's own actors
        header = P.encode(P.ProduceRequest(acks=int(P.Acks.NONE)))
        body = encode_batch([b"x"])
        n = DRAIN_MAX + 5
        for rid in range(1, n + 1):
            router.send_multipart([b"client", assign, P.pack_routing(P.Op.PRODUCE, 0, rid, b"t"), header, body])
        time.sleep(0.3)  # all of them waiting in the worker's socket
        row = st_table.rows[slot]
        deadline = time.monotonic() + 10
        while int(row[COL["next_offset"]]) < n and time.monotonic() < deadline:
            assert _turn(proc) < LONG_WAIT_MS / 2000, "a turn waited although requests were left"
        assert int(row[COL["next_offset"]]) == n
    finally:
        router.close(0)
