"""Helpers the tests share: supervisorctl, restarts, kills, RSS, raw sockets, auditable payloads.

(The broker launcher, the in-process storage stack and the audit workload are bench/launcher.py,
bench/inprocess.py and bench/audit.py: the benchmarks use them too.)

Some facts these tests depend on:

- A worker's ROUTER socket ignores a second peer that presents an identity already in use
  (libzmq's default, ``ZMQ_ROUTER_HANDOVER`` = 0). While the real router is connected, a test
  socket with identity ``b"router"`` is therefore never heard: a test that speaks to a worker
  *as* the router stops the router program first (``supervisorctl stop router``) and closes its
  own sockets before starting it again.
- The router's owner epochs are ``generation << 32 | n`` with the generation in
  ``<data_dir>/router.json``, bumped at every router start. An epoch of ``generation << 32 |
  HIGH`` therefore beats every assignment of the router generation that is running (or was
  stopped), and loses to the next one.
- Every program dies with supervisord (SIGTERM from the kernel: it stops cleanly), and
  supervisord with ``tailrace serve``. A "host crash", where nobody is told anything, is
  therefore simulated by freezing ``tailrace serve`` and supervisord (SIGSTOP), killing every
  program with SIGKILL, then killing the two frozen ones; a test may then unlink the instance's
  shared memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import zmq

from tailrace.client import protocol as P
from tailrace.bench.launcher import SUPERVISORD_CONF, alive
from tailrace.broker.datadir import ROUTER_FILE

# supervisord's programs of a 2-worker test broker: flusher, router, metrics, worker-0, worker-1
PROGRAMS = 5
ASSIGN = P.ASSIGN  # slot, owner epoch: the router's assign frame (client/protocol.py)
HIGH = 0x7FFF_0000  # low 32 bits of a test epoch: above any router counter of one generation


def supervisorctl(broker, *args: str) -> str:
    """Run supervisorctl against this broker's supervisord; return its stdout."""
    env = {**broker.env(), "TAILRACE_PYTHON": sys.executable, "TAILRACE_LOG_DIR": str(broker.data_dir / "logs"),
           "TAILRACE_RUN_DIR": broker.run_dir}
    return subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(SUPERVISORD_CONF), *args],
                          env=env, capture_output=True, text=True, timeout=60).stdout


def running_pids(broker) -> dict[str, int]:
    """Program name -> pid of every RUNNING program, as ``broker.pids()`` reads them, but asked of
    supervisord's socket from this process (supervisorctl's own XML-RPC call), not by starting
    supervisorctl: about 10 ms instead of 0.4-1 s, for tests that poll it."""
    import xmlrpc.client

    from supervisor.xmlrpc import SupervisorTransport

    transport = SupervisorTransport(None, None, f"unix://{broker.run_dir}/supervisor.sock")
    proxy = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
    try:
        infos = proxy.supervisor.getAllProcessInfo()
    finally:
        transport.close()
    return {i["name"]: i["pid"] for i in infos if i["statename"] == "RUNNING"}


# What a load's producer holds queued or unacknowledged in bounded_producer. The default (32 MiB,
# ~1M of bench/audit.py's 32-byte records) went on being drained for 4-35 s after a test stopped
# its load, load with nothing more happening, all of it then read back by the audit; 4 MiB still
# keeps a batch in flight on every partition.
LOAD_BUFFER_BYTES = 4 << 20


def bounded_producer(producer_class, buffer_bytes: int = LOAD_BUFFER_BYTES):
    """A factory for ``produce_until(producer=...)``: ``producer_class`` with a ``buffer_bytes``
    buffer, whose ``send_buffers`` waits while the buffer is full. The blocking Producer does that
    itself; the asyncio one (tests/clients.py) holds such sends back as futures, without limit,
    so here its caller waits for them too, as a blocking caller would."""

    def make(bootstrap, **options):
        prod = producer_class(bootstrap, buffer_memory=buffer_bytes, **options)
        inner = getattr(prod, "inner", None)
        if inner is not None:
            send_buffers = prod.send_buffers

            def send_buffers_waiting(*args, **kwargs):
                send_buffers(*args, **kwargs)
                while inner._blocked:  # sends waiting for room in buffer_memory (client/aio.py)
                    prod.poll(5)

            prod.send_buffers = send_buffers_waiting
        return prod

    return make


def router_generation(broker) -> int:
    return int(json.loads((broker.data_dir / ROUTER_FILE).read_text())["generation"])


def winning_epoch(broker, bump: int = 0) -> int:
    """An owner epoch above every assignment of the current router generation."""
    return (router_generation(broker) << 32) | (HIGH + bump)


def wait_restarted(broker, old: dict, names, timeout_s: float = 30) -> dict:
    """Wait until every program in ``names`` runs under a new pid; return the new pid map."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = broker.pids()
        if all(n in now and now[n] != old.get(n) for n in names) and len(now) >= len(old):
            broker.wait_ready(timeout_s)
            return now
        time.sleep(0.05)
    raise AssertionError(f"{names} not restarted by supervisord within {timeout_s}s")


def hard_kill_all(broker) -> None:
    """kill -9 every program with supervisord and ``tailrace serve`` frozen, then those two:
    nothing runs, nothing was told to stop (nor restarted). bench/launcher.py's, which the
    benches use too."""
    broker.hard_kill_all()


_alive = alive  # tests name it so


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def broker_rss_kib(broker) -> dict[str, int]:
    return {name: rss_kib(pid) for name, pid in broker.pids().items()}


class Raw:
    """One DEALER socket speaking raw frames; replies are matched by request id and op."""

    def __init__(self, endpoint: str, identity: bytes | None = None, rcvhwm: int = 100_000):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(endpoint)
        self.router_mode = identity == b"router"

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout_ms: int) -> list[bytes] | None:
        if not self.sock.poll(timeout_ms):
            return None
        return self.sock.recv_multipart()

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def reply_code(frames: list[bytes], router_mode: bool) -> tuple[int, int, int]:
    """(op, code, request_id) of a reply; router-mode replies start with the client id frame."""
    routing = frames[1] if router_mode else frames[0]
    _v, op, code, _p, rid, _t = P.unpack_routing(routing)
    return op, code, rid


MSG_BYTES = 100


def partition_payload(partition: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` distinct 100-byte values for a partition: (values uint8 buffer, int32 offsets)."""
    seq = np.arange(start, start + count, dtype=np.int64)
    vals = np.zeros((count, MSG_BYTES), dtype=np.uint8)
    vals[:, 0] = partition
    vals[:, 1:9] = seq.view(np.uint8).reshape(count, 8)
    vals[:, 9:] = ((seq[:, None] * 31 + np.arange(MSG_BYTES - 9)) % 251).astype(np.uint8)
    offsets = np.arange(count + 1, dtype=np.int32) * MSG_BYTES
    return vals.reshape(-1), offsets


def check_numbered(body: bytes, off: int, next_offset: int) -> int:
    """``body`` (record batches whose values are their own offsets: bench/inprocess.py
    ``append_numbered``) starts with the batch holding ``off``, runs on without a gap, and ends
    at ``next_offset``; returns how many batches it holds."""
    from tailrace.client.records import iter_batches
    views = iter_batches(body)
    first = views[0]
    assert first.base_offset <= off < first.base_offset + first.record_count, (off, first.base_offset)
    expect = first.base_offset
    for v in views:
        assert v.base_offset == expect, (off, v.base_offset, expect)
        assert [v.value(i) for i in range(v.record_count)] == [b"%d" % (v.base_offset + i) for i in range(v.record_count)]
        expect += v.record_count
    assert next_offset == expect, (off, next_offset, expect)
    return len(views)
