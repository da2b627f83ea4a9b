"""Hostile clients on the workers' Unix sockets (actors/unix_server.py), mirroring what
test_fuzz.py and test_overload_and_hygiene.py do on ZeroMQ: bad framing earns MALFORMED and a
closed connection, well-framed garbage earns named errors, a client that pipelines fetches and
never reads costs a bounded amount of memory and is disconnected; the worker never restarts and
keeps serving everyone else."""

from __future__ import annotations

import select
import socket
import struct
import time
from collections import Counter, deque

import pytest
import zmq

from hypothesis import given
from hypothesis import strategies as st

from tailrace.actors.unix_server import UNIX_IDENT
from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.client.connection import Connection
from tailrace.client.records import encode_batch, iter_batches
from tailrace.client.unixwire import MAX_FRAMES, U16, U32, FrameReader, WireError, encode, path_of
from tailrace.broker import reply_port as RP

from tests.helpers import rss_kib
from .test_fuzz import PROBE_TIMEOUT_MS, Prober, _code_name, _fuzz_broker, fuzz, mutated, probe_worker, produce_and_read_back, requests



class Closed(Exception):
    pass


class UnixRaw:
    """A raw same-host client: framed frames or plain bytes out, framed replies in."""

    def __init__(self, endpoint: str, rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(path_of(endpoint))
        self.reader = FrameReader(1 << 31)
        self.ready: deque = deque()
        self.closed_how: str | None = None  # "eof" or "reset" once the worker closed it
        self.received = 0

    def send(self, frames) -> None:
        self.sock.sendall(b"".join(bytes(b) for b in encode(frames)))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, timeout_s: float) -> bool:
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout_s))
        if not r:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            self.closed_how = "reset"
            return True
        if not data:
            self.closed_how = "eof"
            return True
        self.received += len(data)
        self.reader.feed(data)
        self.ready.extend(self.reader.messages())
        return True

    def recv(self, timeout_ms: int) -> list[bytes] | None:
        """The next reply, None after ``timeout_ms``; raises Closed once the worker closed it."""
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.ready:
            if self.closed_how:
                raise Closed(self.closed_how)
            if not self._fill(deadline - time.monotonic()) and time.monotonic() >= deadline:
                return None
        return self.ready.popleft()

    def read_to_close(self, timeout_s: float) -> list[list[bytes]]:
        """Every reply until the worker closes the connection (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while not self.closed_how and time.monotonic() < deadline:
            self._fill(deadline - time.monotonic())
        out = list(self.ready)
        self.ready.clear()
        return out

    def close(self) -> None:
        self.sock.close()


def _code(frames: list[bytes]) -> int:
    return P.unpack_routing(frames[0])[2]


def _broker(make_broker):
    b, owners = _fuzz_broker(make_broker)
    assert sorted(owners.values()) == [0, 1], owners
    return b, owners


def _good_round_trip(b, owners, tag: bytes) -> None:
    """A fresh Unix connection per worker: a produce, then a fetch of exactly what it stored."""
    for p, w in owners.items():
        conn = Connection(b.settings.worker_unix_endpoint(w))
        try:
            value = b"%s %d" % (tag, p)
            r = conn.request(P.Op.PRODUCE, "probe", p, P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)), encode_batch([value]))
            base = P.decoder(P.ProduceReply).decode(r.header).base_offset
            r = conn.request(P.Op.FETCH, "probe", p, P.encode(P.FetchRequest(base, max_records=1)))
            batch = iter_batches(r.body)[0]
            assert batch.base_offset == base and batch.value(0) == value
        finally:
            conn.close()


def _raw_header(total: int, nframes: int | None = None, lens=(), payload: bytes = b"") -> bytes:
    head = U32.pack(total)
    if nframes is not None:
        head += U16.pack(nframes) + struct.pack(f"<{len(lens)}I", *lens)
    return head + payload


def _framing_errors(limit: int) -> dict[str, bytes]:
    list_offsets = b"".join(encode([P.pack_routing(P.Op.LIST_OFFSETS, -1, 7, b"probe"), P.EMPTY_MAP]))
    return {
        "an HTTP request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "0xFF bytes": b"\xff" * 16,
        "total 0": _raw_header(0) + bytes(8),
        "total 5": _raw_header(5, 1, (), b"\0\0\0"),
        "total one over the limit": _raw_header(limit + 1),
        "total 1 GiB": _raw_header(1 << 30, 1, (1 << 30,)),
        "0 frames": _raw_header(6, 0, (), bytes(4)),
        f"{MAX_FRAMES + 1} frames": _raw_header(2 + 4 * (MAX_FRAMES + 1), MAX_FRAMES + 1, (0,) * (MAX_FRAMES + 1)),
        "lengths add up to less": _raw_header(2 + 8 + 20, 2, (16, 2), bytes(20)),
        "lengths add up to more": _raw_header(2 + 8 + 16, 2, (16, 2), bytes(16)),
        "a good request, then a bad header": list_offsets + _raw_header(3) + bytes(8),
    }


def test_bad_framing_on_a_unix_socket_gets_malformed_and_a_closed_connection_and_the_worker_keeps_serving(make_broker):
    b, owners = _broker(make_broker)
    pids = b.pids()
    limit = b.settings.max_batch_bytes + (1 << 20)  # the worker's largest message (actors/worker.py)
    outcomes = {}
    for name, data in _framing_errors(limit).items():
        for w in (0, 1):
            raw = UnixRaw(b.settings.worker_unix_endpoint(w))
            try:
                raw.send_bytes(data)
                replies = raw.read_to_close(10)
            finally:
                raw.close()
            codes = [P.ErrorCode(_code(f)).name for f in replies]
            outcomes[(name, w)] = (codes, raw.closed_how)
            assert raw.closed_how, f"{name} (worker {w}): connection still open after 10 s; replies {codes}"
            assert codes and codes[-1] == "MALFORMED", f"{name} (worker {w}): replies {codes}, {raw.closed_how}"
            assert "framing" in P.decoder(P.ErrorReply).decode(replies[-1][1]).message
    # other ways to be rude: connect and leave, half a message and leave, a request and leave
    # before the reply, many connections at once
    rude = 0
    for w in (0, 1):
        ep = b.settings.worker_unix_endpoint(w)
        UnixRaw(ep).close()
        r = UnixRaw(ep)
        r.send_bytes(b"".join(encode([P.pack_routing(P.Op.LIST_OFFSETS, -1, 1, b"probe"), P.EMPTY_MAP]))[:9])
        r.close()
        r = UnixRaw(ep)
        r.send([P.pack_routing(P.Op.FETCH, 0, 2, b"probe"), P.encode(P.FetchRequest(0, max_wait_ms=500))])
        r.close()
        many = [UnixRaw(ep) for _ in range(200)]
        for i, m in enumerate(many):
            m.send([P.pack_routing(P.Op.LIST_OFFSETS, -1, i, b"probe"), P.EMPTY_MAP])
        assert all(_code(m.recv(PROBE_TIMEOUT_MS)) == P.ErrorCode.OK for m in many)
        for m in many:
            m.close()
        rude += 203
    time.sleep(0.7)  # the parked fetch's reply finds its connection gone
    _good_round_trip(b, owners, b"after bad framing")
    produce_and_read_back(b.bootstrap, "probe", 2)
    assert b.pids() == pids, f"a broker process restarted: {pids} -> {b.pids()}"
    logs = "\n".join(f.read_text(errors="replace") for f in (b.data_dir / "logs").glob("worker-*.log"))
    logged = logs.count("closing a Unix-socket client after a framing error")
    first_good = outcomes[("a good request, then a bad header", 0)][0]
    for w in (0, 1):  # served in order, however the kernel cut the bytes: OK, then MALFORMED
        assert outcomes[("a good request, then a bad header", w)][0] == ["OK", "MALFORMED"], outcomes
    print(f"\nbad framing: {len(outcomes)} connections with a framing error, each answered "
          f"{Counter(c[-1] for c, _h in outcomes.values())} and closed ({Counter(h for _c, h in outcomes.values())}); "
          f"{logged} log lines; a good request sent just before a bad header got {first_good[:-1] or 'no reply'}; "
          f"{rude} rude connections (closed at once, half a message, gone before the reply, 200 at a time); "
          f"pids unchanged; a good produce + fetch on fresh Unix connections works")
    assert logged >= len(outcomes), logged


def test_worker_survives_random_well_framed_frames_on_its_unix_socket(make_broker):
    """test_fuzz's requests, framed correctly: every one is answered with a named code (or not at
    all, for acks=0) and followed by a good produce + fetch on the same connection."""
    b, owners = _broker(make_broker)
    pids = b.pids()
    raws = {w: UnixRaw(b.settings.worker_unix_endpoint(w)) for w in (0, 1)}
    probers = {w: Prober(raws[w]) for w in raws}
    probe_partition = {w: p for p, w in owners.items()}
    topics = [b"fz", b"probe", b"nope", b"", b"\xff\xfe"]
    sent = Counter()

    @fuzz(400)
    @given(st.sampled_from([0, 1]), requests(topics))
    def case(w, frames):
        raws[w].send(frames)
        sent[w] += 1
        probe_worker(probers[w], frames, b"probe", probe_partition[w])

    try:
        case()
        # replies still due (long polls) come in; none closes the connection
        for w, r in raws.items():
            while (f := r.recv(300)) is not None:
                probers[w].codes[_code_name(f, False)] += 1
        assert not any(r.closed_how for r in raws.values())
    finally:
        for r in raws.values():
            r.close()
    _good_round_trip(b, owners, b"after fuzz")
    produce_and_read_back(b.bootstrap, "probe", 2)
    assert b.pids() == pids, f"a broker process restarted: {pids} -> {b.pids()}"
    codes = probers[0].codes + probers[1].codes
    print(f"\nUnix-socket fuzz (well framed): {sum(sent.values())} cases, each followed by a good produce + fetch on the "
          f"same connection; replies to garbage by code {dict(codes.most_common())}; pids unchanged")
    unnamed = {k: v for k, v in codes.items() if k not in P.ErrorCode.__members__}
    assert not unnamed, f"replies without a named code: {unnamed}"
    assert "INTERNAL" not in codes, codes


def test_worker_survives_random_framing_damage_on_its_unix_socket(make_broker):
    """Well-framed messages, then their framing damaged (bytes flipped, cut, grown): the worker's
    answer agrees with a local FrameReader: MALFORMED and a closed connection for a framing
    error, ordinary replies otherwise; never a crash."""
    b, owners = _broker(make_broker)
    pids = b.pids()
    limit = b.settings.max_batch_bytes + (1 << 20)
    stats = Counter()

    @fuzz(250)
    @given(st.sampled_from([0, 1]), st.lists(requests([b"fz", b"probe", b"nope"]), min_size=1, max_size=3), st.data())
    def case(w, msgs, data):
        stream = b"".join(bytes(x) for m in msgs for x in encode(m))
        stream = data.draw(mutated(stream))
        reader = FrameReader(limit)
        reader.feed(stream)
        try:
            reader.messages()
            bad = False
        except WireError:
            bad = True
        raw = UnixRaw(b.settings.worker_unix_endpoint(w))
        try:
            raw.send_bytes(stream)
            raw.sock.shutdown(socket.SHUT_WR)  # the end of what this client says
            replies = raw.read_to_close(PROBE_TIMEOUT_MS / 1000)
        finally:
            raw.close()
        assert raw.closed_how, f"connection not closed after the client's EOF: {stream[:64]!r}"
        codes = [_code_name(f, False) for f in replies]
        if bad:
            assert codes and codes[-1] == "MALFORMED", (codes, stream[:64])
            stats["framing errors"] += 1
        else:
            stats["read as framed"] += 1
        stats["replies"] += len(codes)
        assert all(c in P.ErrorCode.__members__ for c in codes), codes

    case()
    _good_round_trip(b, owners, b"after framing fuzz")
    assert b.pids() == pids, f"a broker process restarted: {pids} -> {b.pids()}"
    print(f"\nUnix-socket framing fuzz: {stats['framing errors'] + stats['read as framed']} connections with damaged "
          f"framing: {stats['framing errors']} framing errors answered MALFORMED and closed, {stats['read as framed']} "
          f"still well framed (answered or waiting, closed at the client's EOF); {stats['replies']} replies; pids unchanged")
    assert stats["framing errors"] > 0


def test_a_unix_client_that_pipelines_fetches_and_never_reads_is_bounded_and_disconnected(make_broker):
    b = make_broker(workers=2)
    with Admin(b.bootstrap) as admin:
        admin.create_topic("big", 1)
    with Producer(b.bootstrap, acks="memory") as prod:
        for _ in range(20):
            prod.send_batch("big", [bytes(4096)] * 60, partition=0)  # 4.7 MiB
    with Admin(b.bootstrap) as admin:
        owner = admin.describe_topic("big").partitions[0]
    pid = b.pids()[f"worker-{owner.worker}"]
    # warm the path up (the same fetch, read), then measure
    warm = Connection(owner.local_endpoint)
    for _ in range(20):
        warm.request(P.Op.FETCH, "big", 0, P.encode(P.FetchRequest(0, max_bytes=1 << 20)))
    rss_before = rss_kib(pid)
    raw = UnixRaw(owner.local_endpoint)
    fetches = 400
    try:
        for rid in range(fetches):
            raw.send([P.pack_routing(P.Op.FETCH, 0, rid, b"big"), P.encode(P.FetchRequest(0, max_bytes=1 << 20))])
        sent_at = time.monotonic()
        peak, last, deadline = 0, None, time.monotonic() + 4
        while time.monotonic() < deadline:
            peak = max(peak, rss_kib(pid) - rss_before)
            if peak == last:
                break
            last = peak
            time.sleep(0.5)
        # meanwhile other clients are served, over the Unix socket and from the ring
        r = warm.request(P.Op.FETCH, "big", 0, P.encode(P.FetchRequest(0, max_bytes=1 << 20)))
        served_meanwhile = len(r.body)
        # the stalled connection is closed once its queue has not moved for BACKLOG_STALL_S
        time.sleep(max(0.0, RP.BACKLOG_STALL_S + 1.5 - (time.monotonic() - sent_at)))
        peak = max(peak, rss_kib(pid) - rss_before)
        replies = raw.read_to_close(10)
    finally:
        raw.close()
        warm.close()
    logs = (b.data_dir / "logs" / f"worker-{owner.worker}.log").read_text(errors="replace")
    dropped = [line for line in logs.splitlines() if "replies to Unix-socket clients" in line]
    with Consumer(b.bootstrap, same_host=True, max_wait_ms=100) as cons:
        cons.assign("big", start="earliest")
        got = 0
        deadline = time.monotonic() + 10
        while got < 1200 and time.monotonic() < deadline:
            got += len(cons.poll(500))
    limit_kib = (RP.PEER_BACKLOG_BYTES >> 10) + 32 * 1024
    print(f"\n{fetches} unread 1 MiB fetches on a Unix socket: owner worker RSS growth {peak} KiB (limit {limit_kib}); "
          f"the worker closed the connection ({raw.closed_how}) after the client had {raw.received >> 10} KiB in its "
          f"buffers ({len(replies)} whole replies); drop log lines: {dropped[:1]}; another client fetched "
          f"{served_meanwhile} bytes meanwhile; a same-host consumer then polls {got} records; worker pid unchanged: "
          f"{b.pids()[f'worker-{owner.worker}'] == pid}")
    assert raw.closed_how in ("eof", "reset"), "the worker kept a connection whose replies had not moved for 5 s"
    assert raw.received < RP.PEER_BACKLOG_BYTES, f"{raw.received} bytes delivered: the backlog was not dropped"
    assert peak < limit_kib, f"worker RSS grew {peak} KiB"
    assert dropped, "replies the client never read were dropped without a log line"
    assert served_meanwhile > 0 and got == 1200
    assert b.pids()[f"worker-{owner.worker}"] == pid


def test_a_zeromq_client_cannot_have_its_replies_delivered_into_a_unix_connection(make_broker):
    """Replies go back to the client that asked, whatever identity a ZeroMQ peer chooses: one
    that calls itself ``b"\\x00UNX\\x00" + u32 1`` (9 bytes, like the worker's name for its first
    Unix connection; libzmq accepts it) must get its own replies, and the Unix client none."""
    b = make_broker(workers=1)
    with Admin(b.bootstrap) as admin:
        admin.create_topic("t", 1)
    produce_and_read_back(b.bootstrap, "t", 1, n=1)
    victim = UnixRaw(b.settings.worker_unix_endpoint(0))  # the worker's Unix connection number 1
    ctx = zmq.Context()
    z = ctx.socket(zmq.DEALER)
    z.setsockopt(zmq.LINGER, 0)
    try:
        victim.send([P.pack_routing(P.Op.LIST_OFFSETS, -1, 1, b"t"), P.EMPTY_MAP])
        assert _code(victim.recv(PROBE_TIMEOUT_MS)) == P.ErrorCode.OK
        z.setsockopt(zmq.IDENTITY, UNIX_IDENT + struct.pack("<I", 1))
        z.connect(b.settings.worker_endpoint(0))
        time.sleep(0.3)
        z.send_multipart([P.pack_routing(P.Op.LIST_OFFSETS, -1, 4242, b"t"), P.EMPTY_MAP])
        got_own = bool(z.poll(3000))
        stray = victim.recv(1000)
    finally:
        z.close(0)
        ctx.term()
        victim.close()
    print(f"\nZeroMQ client with identity {UNIX_IDENT + struct.pack('<I', 1)!r}: got its reply {got_own}; the Unix "
          f"client received {'a reply to request id %d' % P.unpack_routing(stray[0])[4] if stray else 'nothing'}")
    assert stray is None, "a ZeroMQ client's reply was delivered to a Unix-socket client"
    assert got_own
