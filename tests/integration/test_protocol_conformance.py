"""docs/PROTOCOL.md against a real broker, the way a client written from the document alone sees it.

Raw frames only (a ZeroMQ DEALER, or a worker's Unix socket), no Python client logic in between:
frame counts (section 2), header decoding (4), acks (4.1, 6), the fetch limits (7.2), duplicate
produces (10) and topic names (3). One broker (real router, workers and flusher) serves the
module; every test uses topics of its own.
"""

from __future__ import annotations

import itertools
import time

import msgspec
import pytest
import zmq

from tailrace.bench.launcher import Broker
from tailrace.client import protocol as P
from tailrace.client import unixwire
from tailrace.client.records import encode_batch, iter_batches
from tests.helpers import PROGRAMS

E = P.ErrorCode
REPLY_TIMEOUT_MS = 10_000
MAX_BATCH_BYTES = 32 * 1024  # lets a topic have a 64 KiB ring, which a few batches wrap (disk reads)
_request_ids = itertools.count(1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("conformance"), workers=2, segment_bytes=8 << 20,
               shm_budget_bytes=512 << 20, max_batch_bytes=MAX_BATCH_BYTES)
    try:
        b.start()
        yield b
    finally:
        b.stop()
        left = b.shm_regions()
        b.cleanup_shm()
    assert not left, f"shared memory left after a clean stop: {left}"


class Wire:
    """Raw frames to one endpoint: the router's or a worker's ZeroMQ socket (a DEALER, no
    envelope), or a worker's Unix socket. ``ask`` matches the reply by request id."""

    def __init__(self, endpoint: str):
        self.unix = unixwire.UnixSocket(endpoint) if endpoint.startswith(unixwire.SCHEME) else None
        if self.unix is None:
            self.ctx = zmq.Context()
            self.sock = self.ctx.socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(endpoint)

    def ask(self, frames: list[bytes]) -> tuple[int, list[bytes]]:
        """Send one request; return (code, reply frames) of the reply with its request id."""
        rid = P.unpack_routing(frames[0])[4] if len(frames[0]) >= P.ROUTING_BYTES else 0
        if self.unix is not None:
            self.unix.send_frames(frames)
        else:
            self.sock.send_multipart(frames)
        deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            assert left_ms > 0, f"no reply to {frames[0][:24].hex()} ({len(frames)} frames)"
            if self.unix is not None:
                reply = self.unix.recv_frames() if self.unix.poll(left_ms) else None
            else:
                reply = self.sock.recv_multipart() if self.sock.poll(left_ms) else None
            if reply is not None and P.unpack_routing(reply[0])[4] == rid:
                return P.unpack_routing(reply[0])[2], reply

    def close(self) -> None:
        if self.unix is not None:
            self.unix.close()
        else:
            self.sock.close(0)
            self.ctx.term()


@pytest.fixture
def router(broker):
    w = Wire(broker.bootstrap)
    yield w
    w.close()


def routing(op: int, topic: str = "", partition: int = -1) -> bytes:
    return P.pack_routing(op, partition, next(_request_ids), topic.encode())


def ok(wire: Wire, frames: list[bytes], reply_type=None):
    code, reply = wire.ask(frames)
    assert code == E.OK, f"{E(code).name}: {P.decoder(P.ErrorReply).decode(reply[1]).message}"
    return (P.decoder(reply_type).decode(reply[1]), reply) if reply_type is not None else reply


def error(wire: Wire, frames: list[bytes]) -> tuple[int, str]:
    """(code, the ErrorReply's message) of a request expected to fail."""
    code, reply = wire.ask(frames)
    return code, P.decoder(P.ErrorReply).decode(reply[1]).message if code != E.OK else "(answered OK)"


def create_topic(wire: Wire, name: str, partitions: int = 1, ring_bytes: int = 0) -> None:
    ok(wire, [routing(P.Op.CREATE_TOPIC, name), P.encode(P.CreateTopicRequest(partitions, ring_bytes))])


def produce(wire: Wire, topic: str, batch: bytes, acks: int = P.Acks.MEMORY, partition: int = 0) -> P.ProduceReply:
    return ok(wire, [routing(P.Op.PRODUCE, topic, partition), P.encode(P.ProduceRequest(acks=acks)), batch], P.ProduceReply)[0]


def fetch(wire: Wire, topic: str, offset: int, partition: int = 0, **limits) -> tuple[P.FetchReply, list]:
    info, reply = ok(wire, [routing(P.Op.FETCH, topic, partition), P.encode(P.FetchRequest(offset, **limits))], P.FetchReply)
    return info, iter_batches(reply[2])


def high_watermark(wire: Wire, topic: str, partition: int = 0) -> int:
    offsets = ok(wire, [routing(P.Op.LIST_OFFSETS, topic), P.EMPTY_MAP], P.ListOffsetsReply)[0]
    return offsets.partitions[partition].high_watermark


def topic_names(wire: Wire) -> set[str]:
    return {t.name for t in ok(wire, [routing(P.Op.LIST_TOPICS), P.EMPTY_MAP], P.ListTopicsReply)[0].topics}


def described(wire: Wire, topic: str) -> P.PartitionInfo:
    return ok(wire, [routing(P.Op.DESCRIBE_TOPIC, topic), P.EMPTY_MAP], P.DescribeReply)[0].partitions[0]


# --- section 2: frame counts ---------------------------------------------------------------------


def test_every_op_with_an_extra_or_missing_frame_gets_malformed_at_the_router_which_keeps_serving(broker, router):
    create_topic(router, "frames")
    batch = encode_batch([b"a", b"b"])
    produce_head = P.encode(P.ProduceRequest(acks=P.Acks.MEMORY))
    fetch_head = P.encode(P.FetchRequest(0))
    cases = {  # name -> (op, frames); each must be MALFORMED
        "FETCH with an extra frame": (P.Op.FETCH, [routing(P.Op.FETCH, "frames", 0), fetch_head, b"extra"]),
        "FETCH without its header": (P.Op.FETCH, [routing(P.Op.FETCH, "frames", 0)]),
        "LIST_OFFSETS with an extra frame": (P.Op.LIST_OFFSETS, [routing(P.Op.LIST_OFFSETS, "frames"), P.EMPTY_MAP, b"x"]),
        "PRODUCE with an extra frame": (P.Op.PRODUCE, [routing(P.Op.PRODUCE, "frames", 0), produce_head, batch, b""]),
        "PRODUCE without its batch": (P.Op.PRODUCE, [routing(P.Op.PRODUCE, "frames", 0), produce_head]),
        "PRODUCE without header and batch": (P.Op.PRODUCE, [routing(P.Op.PRODUCE, "frames", 0)]),
        "CREATE_TOPIC with an extra frame": (P.Op.CREATE_TOPIC, [routing(P.Op.CREATE_TOPIC, "frames-x"),
                                                                P.encode(P.CreateTopicRequest(1)), b"x"]),
        "CREATE_TOPIC without its header": (P.Op.CREATE_TOPIC, [routing(P.Op.CREATE_TOPIC, "frames-y")]),
        "LIST_TOPICS with an extra frame": (P.Op.LIST_TOPICS, [routing(P.Op.LIST_TOPICS), P.EMPTY_MAP, b"x"]),
        "DESCRIBE_TOPIC with an extra frame": (P.Op.DESCRIBE_TOPIC, [routing(P.Op.DESCRIBE_TOPIC, "frames"), P.EMPTY_MAP, b"x"]),
        "STATUS with an extra frame": (P.Op.STATUS, [routing(P.Op.STATUS), P.EMPTY_MAP, b"x"]),
        "SET_WORKERS with an extra frame": (P.Op.SET_WORKERS, [routing(P.Op.SET_WORKERS), P.encode(P.SetWorkersRequest(2)), b"x"]),
        "SET_WORKERS without its header": (P.Op.SET_WORKERS, [routing(P.Op.SET_WORKERS)]),
    }
    for name, (op, frames) in cases.items():
        code, message = error(router, frames)
        assert code == E.MALFORMED, f"{name}: got {E(code).name} ({message})"
        assert P.Op(op).name in message and f"got {len(frames)}" in message, f"{name}: unclear message {message!r}"
        assert high_watermark(router, "frames") == 0, f"{name}: the router no longer serves, or something was appended"
    assert topic_names(router) >= {"frames"} and not topic_names(router) & {"frames-x", "frames-y"}
    # the documented exception: the metadata ops whose header is never read may come without it
    for op, topic in ((P.Op.LIST_TOPICS, ""), (P.Op.STATUS, ""), (P.Op.DESCRIBE_TOPIC, "frames"), (P.Op.LIST_OFFSETS, "frames")):
        ok(router, [routing(op, topic)])
    # and well-formed requests are served as ever
    assert produce(router, "frames", batch).base_offset == 0
    info, batches = fetch(router, "frames", 0)
    assert info.next_offset == 2 and [b.record_count for b in batches] == [2]
    assert broker.proc.poll() is None and len(broker.pids()) == PROGRAMS, "a broker process died"


@pytest.mark.parametrize("transport", ["zeromq", "unix"])
def test_wrong_frame_counts_straight_to_a_worker_get_malformed_and_the_worker_keeps_serving(broker, router, transport):
    topic = f"direct-{transport}"
    create_topic(router, topic)
    batch = encode_batch([b"direct"])
    produce(router, topic, batch)  # through the router first: the owner adopts the partition
    where = described(router, topic)
    assert where.adopted
    worker = Wire(where.endpoint if transport == "zeromq" else where.local_endpoint)
    try:
        produce_head = P.encode(P.ProduceRequest(acks=P.Acks.MEMORY))
        cases = {
            "FETCH with an extra frame": [routing(P.Op.FETCH, topic, 0), P.encode(P.FetchRequest(0)), b"extra"],
            "FETCH without its header": [routing(P.Op.FETCH, topic, 0)],
            "LIST_OFFSETS with an extra frame": [routing(P.Op.LIST_OFFSETS, topic), P.EMPTY_MAP, b"x"],
            "LIST_OFFSETS without its header": [routing(P.Op.LIST_OFFSETS, topic)],
            "PRODUCE with an extra frame": [routing(P.Op.PRODUCE, topic, 0), produce_head, batch, b"x"],
            "PRODUCE with two batches": [routing(P.Op.PRODUCE, topic, 0), produce_head, batch, batch],
            "PRODUCE without its batch": [routing(P.Op.PRODUCE, topic, 0), produce_head],
        }
        for name, frames in cases.items():
            code, message = error(worker, frames)
            assert code == E.MALFORMED, f"{name}: got {E(code).name} ({message})"
            assert f"got {len(frames)}" in message, f"{name}: unclear message {message!r}"
            assert high_watermark(worker, topic) == 1, f"{name}: the worker no longer serves, or something was appended"
        # ops a worker does not serve stay UNKNOWN_OP whatever their frame count
        for frames in ([routing(P.Op.CREATE_TOPIC, "nope"), P.encode(P.CreateTopicRequest(1)), b"x"],
                       [routing(P.Op.LIST_TOPICS)], [routing(P.Op.ADOPT, topic, 0), P.EMPTY_MAP]):
            code, message = error(worker, frames)
            assert code == E.UNKNOWN_OP, f"{frames!r}: got {E(code).name} ({message})"
        assert produce(worker, topic, batch).base_offset == 1
        info, batches = fetch(worker, topic, 0)
        assert info.next_offset == 2 and [b.record_count for b in batches] == [1, 1]
    finally:
        worker.close()
    assert broker.proc.poll() is None and len(broker.pids()) == PROGRAMS, "a broker process died"


@pytest.mark.parametrize("transport", ["zeromq", "unix"])
def test_internal_ops_from_a_client_get_unknown_op_at_the_router_and_at_a_worker(broker, router, transport):
    """PING and ADOPT are the router's commands to its workers (section 3): a client sending them
    gets UNKNOWN_OP and no worker facts (pid, boot time, traffic), and no partition moves."""
    topic = f"internal-{transport}"
    create_topic(router, topic)
    produce(router, topic, encode_batch([b"x"]))  # the owner adopts the partition
    where = described(router, topic)
    worker = Wire(where.endpoint if transport == "zeromq" else where.local_endpoint)
    try:
        for wire in (router, worker):
            for frames in ([routing(P.Op.PING), P.EMPTY_MAP], [routing(P.Op.ADOPT, topic, 0), P.EMPTY_MAP]):
                code, message = error(wire, frames)
                assert code == E.UNKNOWN_OP and "internal" in message, f"{frames!r}: got {E(code).name} ({message})"
        assert produce(worker, topic, encode_batch([b"y"])).base_offset == 1  # still the owner, still serving
    finally:
        worker.close()


# --- section 3: a routing topic over 200 bytes -------------------------------------------------------


@pytest.mark.parametrize("op", [P.Op.PRODUCE, P.Op.LIST_OFFSETS, P.Op.DESCRIBE_TOPIC, P.Op.CREATE_TOPIC])
def test_a_topic_over_200_bytes_gets_invalid_request_with_the_topic_left_out_of_the_reply(router, op):
    frames = [routing(op, "t" * (P.MAX_TOPIC_BYTES + 1), 0), P.EMPTY_MAP] + ([b"x"] if op == P.Op.PRODUCE else [])
    code, reply = router.ask(frames)
    _v, rop, _c, _p, _rid, topic = P.unpack_routing(reply[0])
    assert (code, rop, topic) == (E.INVALID_REQUEST, op, b"")


# --- sections 4.1 and 6: acks ----------------------------------------------------------------------


def test_acks_other_than_0_1_2_3_get_invalid_request_and_nothing_is_appended(router):
    create_topic(router, "acks")
    batch = encode_batch([b"never"] * 3)
    produce(router, "acks", encode_batch([b"first"]))  # adopted, so the worker can be asked directly too
    worker = Wire(described(router, "acks").endpoint)
    try:
        for wire in (router, worker):
            for acks in (4, 255, -1):
                code, message = error(wire, [routing(P.Op.PRODUCE, "acks", 0), P.encode(P.ProduceRequest(acks=acks)), batch])
                assert code == E.INVALID_REQUEST, f"acks={acks}: got {E(code).name} ({message})"
                assert f"acks={acks}" in message
        assert high_watermark(router, "acks") == 1, "a produce with bad acks was appended"
        assert produce(router, "acks", batch).base_offset == 1
    finally:
        worker.close()


# --- section 4: msgpack str, never bin ------------------------------------------------------------


def test_a_bin_map_key_or_bin_string_value_gets_malformed(router):
    create_topic(router, "binkeys")
    batch = encode_batch([b"x"])
    bin_key = msgspec.msgpack.encode({b"offset": 0})
    assert bin_key[1] == 0xC4, "the key must be packed as msgpack bin 8"
    cases = {
        "FETCH with a bin key": [routing(P.Op.FETCH, "binkeys", 0), bin_key],
        "FETCH with an unknown bin key": [routing(P.Op.FETCH, "binkeys", 0), msgspec.msgpack.encode({"offset": 0, b"zz": 1})],
        "FETCH with isolation as bin": [routing(P.Op.FETCH, "binkeys", 0), msgspec.msgpack.encode({"offset": 0, "isolation": b"memory"})],
        "PRODUCE with a bin key": [routing(P.Op.PRODUCE, "binkeys", 0), msgspec.msgpack.encode({b"acks": 1}), batch],
        "CREATE_TOPIC with a bin key": [routing(P.Op.CREATE_TOPIC, "binkeys-new"), msgspec.msgpack.encode({b"partitions": 1})],
    }
    for name, frames in cases.items():
        code, message = error(router, frames)
        assert code == E.MALFORMED, f"{name}: got {E(code).name} ({message})"
    assert high_watermark(router, "binkeys") == 0 and "binkeys-new" not in topic_names(router)
    # the same maps with str keys and values are fine; unknown str keys are ignored
    ok(router, [routing(P.Op.FETCH, "binkeys", 0), msgspec.msgpack.encode({"offset": 0, "isolation": "memory", "zz": b"1"})])
    ok(router, [routing(P.Op.PRODUCE, "binkeys", 0), msgspec.msgpack.encode({"acks": 1}), batch])


# --- section 4.8: ErrorReply ----------------------------------------------------------------------


def test_an_error_reply_is_a_map_of_message_then_the_two_offsets_only_when_set(router):
    create_topic(router, "errors")
    code, reply = router.ask([routing(P.Op.FETCH, "nope", 0), P.encode(P.FetchRequest(0))])
    assert code == E.UNKNOWN_TOPIC
    assert reply[1][:9] == bytes.fromhex("81a7") + b"message"
    code, reply = router.ask([routing(P.Op.FETCH, "errors", 0), P.encode(P.FetchRequest(5))])
    assert code == E.OFFSET_OUT_OF_RANGE
    assert reply[1][:1] == b"\x83"
    assert list(msgspec.msgpack.decode(reply[1])) == ["message", "log_start_offset", "high_watermark"]


# --- sections 4.1 and 10: duplicates --------------------------------------------------------------


def test_a_duplicate_produce_is_answered_with_the_original_offset_count_and_append_time(router):
    create_topic(router, "dups")
    produce(router, "dups", encode_batch([b"before"]))
    batch = encode_batch([b"once", b"only"], producer_id=4242, base_sequence=0)
    first = produce(router, "dups", batch)
    time.sleep(0.01)  # a retry's own append time would differ by this much
    again = produce(router, "dups", batch)
    assert first.append_time_us > 0
    assert (again.base_offset, again.record_count, again.append_time_us) == (first.base_offset, 2, first.append_time_us)
    assert high_watermark(router, "dups") == 3, "the duplicate was appended"
    _info, batches = fetch(router, "dups", first.base_offset)
    assert batches[0].append_time_us == first.append_time_us, "the reply's time is not the stored batch's"


# --- section 7.2: fetch limits --------------------------------------------------------------------


def _records_batches(sizes):
    return [encode_batch([b"r%06d" % i for i in range(n)]) for n in sizes]


def _fetched(router, topic, offset, **limits):
    info, batches = fetch(router, topic, offset, **limits)
    return [b.record_count for b in batches], info


@pytest.mark.parametrize("source", ["ring", "disk"])
def test_a_fetch_never_starts_a_batch_once_max_records_is_reached_and_never_exceeds_max_bytes(router, source):
    topic = f"limits-{source}"
    create_topic(router, topic, ring_bytes=64 * 1024 if source == "disk" else 0)
    frames = _records_batches([188, 29, 5])
    for f in frames:
        produce(router, topic, f, acks=P.Acks.DURABLE)
    if source == "disk":  # wrap the 64 KiB ring a few times: offsets 0..221 are then only on disk
        filler = encode_batch([bytes(90)] * 100)
        for _ in range(20):
            produce(router, topic, filler, acks=P.Acks.DURABLE)
    # records: a batch is started only while fewer than max_records records (from offset) are in
    assert _fetched(router, topic, 0, max_records=188)[0] == [188]
    counts, info = _fetched(router, topic, 0, max_records=189)
    assert counts == [188, 29] and info.next_offset == 217 and info.source == source  # 217 > 189: the last batch carries it over
    assert _fetched(router, topic, 0, max_records=217)[0] == [188, 29]
    assert _fetched(router, topic, 0, max_records=218)[0] == [188, 29, 5]
    assert _fetched(router, topic, 0, max_records=1)[0] == [188]  # the first batch always comes
    # counted from offset: from 100, the first batch brings 88
    assert _fetched(router, topic, 100, max_records=88)[0] == [188]
    assert _fetched(router, topic, 100, max_records=89)[0] == [188, 29]
    # bytes: never over max_bytes, except by a first batch larger than it
    two = len(frames[0]) + len(frames[1])
    assert _fetched(router, topic, 0, max_bytes=two)[0] == [188, 29]
    assert _fetched(router, topic, 0, max_bytes=two - 1)[0] == [188]
    assert _fetched(router, topic, 0, max_bytes=1)[0] == [188]


# --- section 3: topic names -----------------------------------------------------------------------


def test_dot_and_dot_dot_are_refused_as_topic_names_and_other_dotted_names_are_not(router):
    for name in (".", ".."):
        code, message = error(router, [routing(P.Op.CREATE_TOPIC, name), P.encode(P.CreateTopicRequest(1))])
        assert code == E.INVALID_REQUEST, f"{name!r}: got {E(code).name} ({message})"
    create_topic(router, "...")
    create_topic(router, ".hidden")
    names = topic_names(router)
    assert {"...", ".hidden"} <= names and not names & {".", ".."}
