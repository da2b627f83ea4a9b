"""The same-host wire format (client/unixwire.py): ``encode`` and ``FrameReader`` agree on every
frame list, whatever the stream's chunking; every framing error is a ``WireError``; a message
cut short yields nothing until its last byte arrives."""

from __future__ import annotations

import struct
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailrace.client.unixwire import MAX_FRAMES, U16, U32, FrameReader, WireError, encode

LIMIT = 1 << 16
STATS: Counter = Counter()

frames_st = st.lists(st.binary(max_size=300), min_size=1, max_size=MAX_FRAMES)
messages_st = st.lists(frames_st, min_size=1, max_size=6)


def _wire(frames) -> bytes:
    return b"".join(bytes(b) for b in encode(frames))


def _raw(total: int, nframes: int | None = None, lens=(), payload: bytes = b"") -> bytes:
    """A message header written by hand (for the lies ``encode`` never tells)."""
    head = U32.pack(total)
    if nframes is not None:
        head += U16.pack(nframes) + struct.pack(f"<{len(lens)}I", *lens)
    return head + payload


@st.composite
def chunkings(draw, size: int) -> list[int]:
    """Cut points of a stream of ``size`` bytes: byte by byte, one piece, or random pieces."""
    mode = draw(st.sampled_from(["bytes", "whole", "random", "random"]))
    if mode == "bytes":
        return list(range(1, size))
    if mode == "whole":
        return []
    return sorted(set(draw(st.lists(st.integers(1, max(1, size - 1)), max_size=40))))


def _cases(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


@_cases(300)
@given(messages_st, st.data())
def _round_trip(msgs, data):
    stream = b"".join(_wire(m) for m in msgs)
    ends, at = [], 0
    for m in msgs:
        at += len(_wire(m))
        ends.append(at)
    assert ends[-1] == len(stream)
    cuts = data.draw(chunkings(len(stream)))
    reader = FrameReader(LIMIT)
    got, fed = [], 0
    for stop in [*cuts, len(stream)]:
        reader.feed(memoryview(stream)[fed:stop])  # memoryviews, as the socket loop feeds them
        fed = stop
        got += reader.messages()
        # exactly the messages whose last byte has arrived, no more, no fewer
        assert len(got) == sum(e <= fed for e in ends), (fed, ends, len(got))
    assert got == msgs
    assert all(type(f) is bytes for m in got for f in m)
    assert not reader.buf, "bytes left over after the last whole message"
    STATS["streams"] += 1
    STATS["messages"] += len(msgs)
    STATS["frames"] += sum(len(m) for m in msgs)
    STATS["chunks"] += len(cuts) + 1


def test_encode_then_read_in_any_chunking_gives_back_every_message_in_order():
    STATS.clear()
    _round_trip()
    print(f"\nunixwire round trip: {STATS['streams']} streams, {STATS['messages']} messages, "
          f"{STATS['frames']} frames, fed in {STATS['chunks']} chunks")
    assert STATS["streams"] > 0


def test_a_partial_message_yields_nothing_until_its_last_byte():
    frames = [b"routing-header-16", b"\x80", bytes(range(256)) * 4, b""]
    wire = _wire(frames)
    reader = FrameReader(LIMIT)
    checked = 0
    for i in range(len(wire) - 1):
        reader.feed(wire[i : i + 1])
        assert reader.messages() == [], f"a message came out after {i + 1} of {len(wire)} bytes"
        checked += 1
    reader.feed(wire[-1:])
    assert reader.messages() == [frames]
    assert reader.messages() == []
    # a whole message followed by the start of another: only the first comes out
    reader.feed(wire + wire[:7])
    assert reader.messages() == [frames]
    reader.feed(wire[7:])
    assert reader.messages() == [frames]
    # empty frames are frames: one empty frame is the smallest message (total = 6)
    reader.feed(_wire([b""]))
    assert reader.messages() == [[b""]]
    print(f"\npartial message: {checked} prefixes of a {len(wire)}-byte message yielded nothing; completed once")


def _bad_cases() -> dict[str, bytes]:
    cases = {
        "total one over the limit": _raw(LIMIT + 1),
        "total 0xFFFFFFFF": b"\xff\xff\xff\xff",
        "0 frames": _raw(6, 0, (), b"\0\0\0\0"),
        "0 frames, total 2 (encode([]))": _raw(2, 0),
        "17 frames": _raw(2 + 4 * 17, 17, (0,) * 17),
        "17 frames with data": _raw(2 + 4 * 17 + 17, 17, (1,) * 17, b"x" * 17),
        "65535 frames": _raw(8, 0xFFFF, (), b"\0" * 6),
        "3 frames, total too small for their lengths": _raw(6, 3, (), b"\0" * 4),
        "lengths add up to less than total": _raw(2 + 8 + 10, 2, (3, 4), b"x" * 10),
        "lengths add up to more than total": _raw(2 + 8 + 7, 2, (3, 5), b"x" * 7),
        "one length far past total": _raw(2 + 4 + 5, 1, (0xFFFFFFFF,), b"x" * 5),
    }
    for total in range(6):
        cases[f"total {total}"] = _raw(total) + b"\x01\x00" + b"\0" * 8
    return cases


@pytest.mark.parametrize("prefix", [b"", "good"], ids=["alone", "after-a-good-message"])
def test_every_framing_error_raises_wire_error(prefix):
    good = _wire([b"a", b"bc"])
    if prefix == "good":
        prefix = good
    cases = _bad_cases()
    for name, bad in cases.items():
        reader = FrameReader(LIMIT)
        reader.feed(prefix + bad)
        if prefix:  # the good message in front comes out first, in order; the error next
            assert reader.messages() == [[b"a", b"bc"]], name
        with pytest.raises(WireError):
            reader.messages()
            raise AssertionError(f"{name}: no WireError")
        with pytest.raises(WireError):  # and stays: the stream is over
            reader.messages()
    # the header alone is enough to reject a length over the limit or under 6 (no waiting for a
    # body that will never come)
    early = 0
    for name in [n for n in cases if n.startswith("total")]:
        reader = FrameReader(LIMIT)
        reader.feed(cases[name][:4])
        with pytest.raises(WireError):
            reader.messages()
        early += 1
    # the limit itself is accepted
    n = LIMIT - 2 - 4
    reader = FrameReader(LIMIT)
    reader.feed(_raw(LIMIT, 1, (n,), bytes(n)))
    assert reader.messages() == [[bytes(n)]]
    print(f"\nframing errors ({'after a good message' if prefix else 'alone'}): {len(cases)} cases raised WireError, "
          f"{early} of them from the 4-byte length alone; a message of exactly the limit was accepted")


@_cases(300)
@given(frames_st, st.integers(1, 0xFFFFFFFF), st.integers(0, 0xFFFF), st.data())
def _header_lie(frames, total, nframes, data):
    wire = bytearray(_wire(frames))
    field = data.draw(st.sampled_from(["total", "nframes", "length"]))
    if field == "total":
        struct.pack_into("<I", wire, 0, total)
    elif field == "nframes":
        struct.pack_into("<H", wire, 4, nframes)
    else:
        i = data.draw(st.integers(0, len(frames) - 1))
        struct.pack_into("<I", wire, 6 + 4 * i, data.draw(st.integers(0, 0xFFFFFFFF)))
    reader = FrameReader(LIMIT)
    reader.feed(bytes(wire) + bytes(8))  # padding: a stream continues after a lying header
    try:
        got = reader.messages()
    except WireError:
        STATS["lies_rejected"] += 1
        return
    if bytes(wire) == _wire(frames):  # the "lie" was the truth
        assert got[0] == frames
        STATS["lies_true"] += 1
        return
    stream = bytes(wire) + bytes(8)
    if not got:  # the stated total runs past what arrived: it waits for the rest
        assert struct.unpack_from("<I", stream, 0)[0] + 4 > len(stream)
        STATS["lies_waiting"] += 1
        return
    # the header happened to agree with itself: what came out is exactly what it says
    assert stream.startswith(_wire(got[0])), (got, stream[:32])
    STATS["lies_consistent"] += 1


def test_random_lies_in_a_header_raise_wire_error_wait_or_read_as_stated():
    """Any header whose fields disagree raises (or waits for a total not yet arrived); one that
    happens to agree with itself reads exactly as it says."""
    STATS.clear()
    _header_lie()
    print(f"\nheader lies: {STATS['lies_rejected']} rejected with WireError, {STATS['lies_true']} unchanged, "
          f"{STATS['lies_waiting']} waiting for more bytes, {STATS['lies_consistent']} self-consistent and read as stated")
    assert STATS["lies_rejected"] > 50
