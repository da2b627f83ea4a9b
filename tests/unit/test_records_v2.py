"""Record format v2 (docs/FORMAT.md 1): property tests of the encoder and decoder over every codec,
keys, headers and per-record times; the byte-exact worked examples of FORMAT.md; and hostile
batches (zip bombs, wrong codec ids, truncated sections, header counts that overflow, reserved
attribute bits) refused as BatchError with the reason the broker turns into an error code."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tailrace.client import codecs, columns, records
from tailrace.client.records import BatchError, batches_to_columns, check_batch, encode_batch, iter_batches, rewrite_batch
from tailrace.client.sections import A_HEADERS, headers_from_lists

CODECS = sorted(codecs.NAMES)
header_lists = st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=12))), max_size=4)


def _stamped(frame: bytes, base: int, append_us: int = 7, flags: int = 0) -> bytes:
    buf = bytearray(frame)
    records.STAMP.pack_into(buf, records.STAMP_AT, base, append_us, 0, 1)
    if buf[records.VERSION_AT] == 2:
        buf[records.FLAGS_AT] = flags
    return bytes(buf)


def _recrc(buf: bytearray) -> bytearray:
    length = struct.unpack_from("<i", buf)[0]
    struct.pack_into("<I", buf, records.CRC_AT, records.batch_crc(buf, 0, length, buf[records.VERSION_AT]))
    return buf


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(CODECS), st.data())
def test_every_batch_decodes_to_what_was_encoded(values, keyed, with_headers, with_times, codec, data):
    n = len(values)
    keys = data.draw(st.lists(st.binary(max_size=8), min_size=n, max_size=n)) if keyed else None
    headers = data.draw(st.lists(st.one_of(st.none(), header_lists), min_size=n, max_size=n)) if with_headers else None
    times = data.draw(st.lists(st.integers(0, 1 << 50), min_size=n, max_size=n)) if with_times else None
    frame = encode_batch(values, keys, headers=headers, timestamps_us=times, create_time_us=123, compression=codec,
                         producer_id=5, base_sequence=9, producer_epoch=2)
    c = check_batch(frame, 0, len(frame), 1 << 20)
    assert (c.size, c.count, c.version, c.codec) == (len(frame), n, 2, codec)
    assert (c.min_time_us, c.max_time_us) == ((min(times), max(times)) if times else (123, 123))
    (v,) = iter_batches(_stamped(frame, 100))
    assert [v.value(i) for i in range(n)] == values
    assert [v.key(i) for i in range(n)] == (keys if keyed else [None] * n)
    assert [v.timestamp_us(i) for i in range(n)] == (times or [123] * n)
    want = [tuple((k, val) for k, val in (h or ())) for h in headers] if headers else [()] * n
    got = v.headers.lists() if v.headers is not None else [()] * n
    assert got == want
    cols = batches_to_columns([v, v], 100)  # the columnar path: two copies of the batch
    assert len(cols) == 2 * n and cols.timestamps_us.tolist() == 2 * (times or [123] * n)
    if cols.headers is not None:
        assert cols.headers.lists() == 2 * want
    lo = data.draw(st.integers(0, n - 1))  # a tailing read's slice of one batch: the shortcut gives the general path's columns
    hi = data.draw(st.integers(lo + 1, n))
    one, many = batches_to_columns([v], 100 + lo, 100 + hi), columns._many_batch_columns([(v, lo, hi)])
    for field in ("offsets", "timestamps_us", "value_offsets", "values", "key_offsets", "keys", "key_valid"):
        assert getattr(one, field).tolist() == getattr(many, field).tolist(), field
    assert (one.headers is None) == (many.headers is None)
    if one.headers is not None:
        assert one.headers.lists() == many.headers.lists() == want[lo:hi]
    h = records.read_header(frame)
    assert (h["producer_id"], h["base_sequence"], h["producer_epoch"], h["attributes"] & 7) == (5, 9, 2, codec)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8), st.sampled_from(CODECS), st.sampled_from(CODECS),
       st.booleans())
def test_a_broker_rewrite_keeps_every_record_and_the_producer_fields(values, codec, target, v1):
    frame = encode_batch(values, version=1, producer_id=3, base_sequence=4) if v1 else encode_batch(
        values, headers=[[("k", b"v")]] * len(values), compression=codec, producer_id=3, base_sequence=4)
    c = check_batch(frame, 0, len(frame), 1 << 20)
    out = rewrite_batch(frame, c, target)
    c2 = check_batch(out, 0, len(out), 1 << 20)
    assert (c2.version, c2.codec, c2.count) == (2, target, len(values))
    (v,) = iter_batches(_stamped(out, 0))
    assert [v.value(i) for i in range(len(values))] == values
    assert records.IDEMPOTENCE.unpack_from(out, records.IDEMPOTENCE_AT) == (3, 4)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(CODECS), st.integers(0, 400), st.integers(0, 255), st.booleans())
def test_a_flipped_byte_is_refused_or_reads_whole(codec, at, value, fix_crc):
    """Any byte changed in a v2 batch (its CRC made right again or not): BatchError, or a batch
    that reads back whole; never another exception, never part of a batch."""
    good = encode_batch([b"v%d" % i * 9 for i in range(6)], [b"k"] * 6, headers=[[("h", b"x"), ("n", None)]] * 6,
                        timestamps_us=list(range(6)), compression=codec)
    buf = bytearray(good)
    buf[at % len(buf)] = value
    if fix_crc and struct.unpack_from("<i", buf)[0] <= len(buf):
        try:
            _recrc(buf)
        except (struct.error, ValueError):
            pass
    try:
        c = check_batch(bytes(buf), 0, len(buf), 1 << 20)
    except BatchError as exc:
        assert exc.reason in ("malformed", "crc", "too_large")
        return
    (v,) = iter_batches(_stamped(bytes(buf), 0))
    assert v.record_count == c.count and len(batches_to_columns([v])) == c.count


def _v2(codec=codecs.ZSTD, attrs_or=0, records_bytes=None, body=None) -> bytearray:
    """A v2 batch of three records, then changed and its CRC made right (so only the change is wrong)."""
    buf = bytearray(encode_batch([b"a" * 50, b"b" * 50, b"c"], headers=[[("h", b"1")]] * 3, compression=codec))
    if body is not None:
        buf = buf[: records.HEADER_V2_BYTES] + bytearray(body)
        buf += bytes(records.align8(len(buf)) - len(buf))
        struct.pack_into("<i", buf, 0, records.HEADER_V2_BYTES + len(body))
    if records_bytes is not None:
        struct.pack_into("<i", buf, 64, records_bytes)
    struct.pack_into("<H", buf, 54, struct.unpack_from("<H", buf, 54)[0] | attrs_or)
    return _recrc(buf)


def _refused(buf, reason: str, match: str, limit: int = 1 << 20) -> None:
    with pytest.raises(BatchError, match=match) as e:
        check_batch(bytes(buf), 0, len(buf), limit)
    assert e.value.reason == reason


def test_hostile_batches_are_refused_with_a_reason():
    bomb = codecs.compress(codecs.ZSTD, bytes(8 << 20))  # 8 MiB of zeros in a few hundred bytes
    _refused(_v2(records_bytes=1000, body=bomb), "malformed", "inflate")  # more than it declares: stops at 1000
    _refused(_v2(records_bytes=8 << 20, body=bomb), "too_large", "inflated")  # declares more than the limit
    for cid in (5, 6, 7):
        _refused(_v2(codec=codecs.NONE, attrs_or=cid), "malformed", "codec id")
    good = _v2()
    _refused(_recrc(good[: len(good) - 16] + bytearray(16)), "malformed", "inflate|section")  # truncated section
    for bit in (0x0010, 0x0020):  # transactional, control: reserved, refused
        _refused(_v2(attrs_or=bit), "malformed", "reserved")
    _refused(_v2(attrs_or=0x8000), "malformed", "not supported")
    # header counts that overflow: header_starts' last entry (2^31 - 1) runs past the section
    plain = bytearray(encode_batch([b"x", b"y"], headers=[[("a", b"1")], [("b", b"2")]]))
    at = records.HEADER_V2_BYTES + 4 * 3  # value_offsets int32[3], then header_starts int32[3]
    struct.pack_into("<i", plain, at + 8, 0x7FFFFFFF)
    _refused(_recrc(plain), "malformed", "runs past")
    struct.pack_into("<i", plain, at + 8, -5)
    _refused(_recrc(plain), "malformed", "")
    # a header key that is not UTF-8
    bad = bytearray(encode_batch([b"x"], headers=[[("ab", b"1")]]))
    bad[bad.index(b"ab1")] = 0xFF
    _refused(_recrc(bad), "malformed", "UTF-8")
    # a null header value with bytes in its range
    bad = bytearray(encode_batch([b"x"], headers=[[("k", b"vv")]]))
    bad[bad.index(b"xkvv") - 1] = 1  # hvalue_null[0], just before the bytes (value, header key, header value)
    _refused(_recrc(bad), "malformed", "null")


def test_headers_columns_from_python_lists_need_no_loop_per_record_and_check_types():
    h = headers_from_lists([None, [("a", b"1"), ("a", None)], {"é": b""}], 3)
    assert h.starts.tolist() == [0, 0, 2, 3] and h.valid.tolist() == [True, False, True]
    assert h.lists() == [(), (("a", b"1"), ("a", None)), (("é", b""),)]
    assert headers_from_lists([None, []], 2) is None
    with pytest.raises(ValueError, match="str"):
        headers_from_lists([[(b"k", b"v")]], 1)
    with pytest.raises(ValueError, match="bytes or None"):
        headers_from_lists([[("k", "v")]], 1)
    frame = encode_batch([b"x"] * 10_000, headers=[[("trace", b"abc")]] * 10_000)
    assert struct.unpack_from("<H", frame, 54)[0] & A_HEADERS


def test_a_batch_without_headers_or_own_times_costs_what_v1_did_plus_the_header():
    values = [b"x" * 100] * 100
    v1, v2 = encode_batch(values, version=1), encode_batch(values)
    assert len(v2) - len(v1) == records.HEADER_V2_BYTES - records.HEADER_V1_BYTES
    same_time = encode_batch(values, timestamps_us=[5] * 100)  # one time for all: no per-record array
    assert len(same_time) == len(v2)


def test_the_worked_examples_of_the_format_document():
    """FORMAT.md 1.5's bytes are what the encoder writes."""
    plain = encode_batch([b"hi", b"tailrace"], create_time_us=0)
    assert plain.hex() == (
        "6600000052540200ffffffffffffffff0000000000000000ffffffff00000000"
        "98972d1702000000ffffffffffffffffffffffffffff00000000000000000000"
        "1600000000000000000000000000000000000000020000000a00000068697461"
        "696c726163650000")
    headed = encode_batch([b"v1", b"v2"], headers=[[("k", b"x")], [("k", None)]], create_time_us=0)
    assert headed.hex() == EXAMPLE_HEADERS
    # A zstd library may pick other bytes for the same input: the example must decode as documented.
    zstd = bytes.fromhex(EXAMPLE_ZSTD)
    for frame in (plain, headed, zstd):
        check_batch(frame, 0, len(frame), 1 << 20)
    (v,) = iter_batches(zstd)
    assert [v.value(i) for i in range(4)] == [b"hello"] * 4 and v.codec == codecs.ZSTD


EXAMPLE_HEADERS = (  # FORMAT.md 1.5: two records, one header each, the second's value null
    "8900000052540200ffffffffffffffff0000000000000000ffffffff00000000"
    "e113ea3d02000000ffffffffffffffffffffffffffff00020000000000000000"
    "3900000000000000000000000000000000000000020000000400000000000000"
    "0100000002000000000000000100000002000000000000000100000001000000"
    "0001763176326b6b7800000000000000")
EXAMPLE_ZSTD = (  # FORMAT.md 1.5: four records "hello", the section compressed with zstd
    "7800000052540200ffffffffffffffff0000000000000000ffffffff00000000"
    "29b0b3cf04000000ffffffffffffffffffffffffffff04000000000000000000"
    "2800000000000000000000000000000028b52ffd2028fd0000c8000000000500"
    "00000a0000000f0000001400000068656c6c6f0100a12b63")
