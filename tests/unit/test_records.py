"""The record-batch format: round trips, CRC, hostile bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tailrace.client.records import (
    CRC_START, HEADER_BYTES, BatchError, align8, batches_to_columns, encode_batch, encode_batch_buffers,
    iter_batches, read_header, validate_frame,
)
from tailrace.client import columns, records


def test_round_trip_without_keys():
    frame = encode_batch([b"hi", b"", b"tailrace"], create_time_us=123)
    assert len(frame) % 8 == 0
    size, count = validate_frame(frame, 0, len(frame), 1 << 20)
    assert (size, count) == (len(frame), 3)
    (v,) = iter_batches(frame)
    assert [v.value(i) for i in range(3)] == [b"hi", b"", b"tailrace"]
    assert v.key(0) is None and v.create_time_us == 123
    assert v.value_offsets.tolist() == [0, 2, 2, 10]


def test_round_trip_with_keys_and_buffers_path_is_identical():
    values, keys = [b"a", b"bb", b"ccc"], [b"k1", b"", b"k3"]
    a = encode_batch(values, keys, create_time_us=5)
    offs = np.array([0, 1, 3, 6], dtype=np.int32)
    koffs = np.array([0, 2, 2, 4], dtype=np.int32)
    b = encode_batch_buffers(b"abbccc", offs, b"k1k3", koffs, create_time_us=5)
    assert a == b
    (v,) = iter_batches(a)
    assert [v.key(i) for i in range(3)] == keys


@given(st.binary(max_size=300), st.integers(0, 1 << 60), st.integers(-1, 1 << 40), st.integers(-1, (1 << 31) - 1))
def test_a_one_record_batch_is_the_same_bytes_without_numpy(value, t, producer_id, seq):
    """encode_batch([value]) takes a plain-Python path (the single-message send); it must give
    the bytes the numpy path gives, and pass the broker's validation."""
    one = encode_batch([value], create_time_us=t, producer_id=producer_id, base_sequence=seq)
    general = encode_batch_buffers(value, np.array([0, len(value)], dtype=np.int32), create_time_us=t,
                                   producer_id=producer_id, base_sequence=seq)
    assert one == general
    assert validate_frame(one, 0, len(one), 1 << 20) == (len(one), 1)
    (v,) = iter_batches(one)
    assert v.value(0) == value and v.create_time_us == t and v.base_offset == -1


def test_broker_stamped_fields_are_outside_the_crc():
    frame = bytearray(encode_batch([b"x"] * 5))
    struct.pack_into("<qqiI", frame, 8, 1000, 2000, 3, 4)  # what the broker stamps
    validate_frame(frame, 0, len(frame), 1 << 20)
    h = read_header(frame)
    assert (h["base_offset"], h["append_time_us"], h["partition"], h["topic_id"]) == (1000, 2000, 3, 4)
    assert h["crc"] == struct.unpack_from("<I", frame, 32)[0] and CRC_START == 36


@pytest.mark.parametrize("flip", [CRC_START, 40, 64, -9])
def test_any_flipped_byte_in_the_crc_range_is_detected(flip):
    frame = bytearray(encode_batch([b"hello", b"world"]))
    end = read_header(frame)["length"]
    pos = flip if flip >= 0 else end + flip
    frame[pos] ^= 0x40
    with pytest.raises(BatchError) as exc:
        validate_frame(frame, 0, len(frame), 1 << 20)
    assert exc.value.reason in ("crc", "malformed")


def test_lying_length_and_count_are_malformed_not_crashes():
    frame = bytearray(encode_batch([b"abc"] * 4))
    bad = bytearray(frame)
    struct.pack_into("<i", bad, 0, 1 << 30)
    with pytest.raises(BatchError, match="too_large|over the limit") as e:
        validate_frame(bad, 0, len(bad), 1 << 20)
    assert e.value.reason == "too_large"
    for version in (1, 2):  # a count the body cannot hold, its CRC made right: malformed, in either version
        bad = bytearray(encode_batch([b"abc"] * 4, version=version))
        struct.pack_into("<i", bad, 36, 1 << 20)
        struct.pack_into("<I", bad, 32, records.batch_crc(bad, 0, struct.unpack_from("<i", bad)[0], version))
        with pytest.raises(BatchError) as e:
            validate_frame(bad, 0, len(bad), 1 << 20)
        assert e.value.reason == "malformed"


def test_columns_trim_to_the_requested_range_across_batches():
    a = bytearray(encode_batch([b"a0", b"a1", b"a2"]))
    b = bytearray(encode_batch([b"b0", b"b1"], [b"k0", b"k1"]))
    struct.pack_into("<q", a, 8, 10)
    struct.pack_into("<q", b, 8, 13)
    cols = batches_to_columns(iter_batches(bytes(a + b)), start_offset=11, end_offset=14)
    assert cols.offsets.tolist() == [11, 12, 13]
    vals = cols.values.tobytes()
    assert [vals[cols.value_offsets[i] : cols.value_offsets[i + 1]] for i in range(3)] == [b"a1", b"a2", b"b0"]
    assert cols.key_valid.tolist() == [False, False, True]
    keys = cols.keys.tobytes()
    assert keys[cols.key_offsets[2] : cols.key_offsets[3]] == b"k0"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.binary(max_size=12), min_size=1, max_size=6), st.booleans()), min_size=1, max_size=6),
       st.integers(0, 1000), st.data())
def test_columns_hold_exactly_the_records_in_range_whatever_the_batches(batches, base, data):
    """Any run of batches (keyed or not, any sizes), any [start, end): the columns hold exactly
    those records, in order, with their offsets, batch times, values and keys (None: no key)."""
    frames, expect, off = [], [], base
    for i, (values, keyed) in enumerate(batches):
        keys = [b"k" + v for v in values] if keyed else None
        frame = bytearray(encode_batch(values, keys, create_time_us=1000 + i))
        struct.pack_into("<q", frame, 8, off)
        frames.append(bytes(frame))
        expect += [(off + j, 1000 + i, v, keys[j] if keyed else None) for j, v in enumerate(values)]
        off += len(values)
    start = data.draw(st.integers(base, off - 1))
    end = data.draw(st.one_of(st.none(), st.integers(start + 1, off)))
    cols = batches_to_columns(iter_batches(b"".join(frames)), start, end)
    vals, keys, vo, ko = cols.values.tobytes(), cols.keys.tobytes(), cols.value_offsets.tolist(), cols.key_offsets.tolist()
    got = [(o, t, vals[vo[i] : vo[i + 1]], keys[ko[i] : ko[i + 1]] if kv else None)
           for i, (o, t, kv) in enumerate(zip(cols.offsets.tolist(), cols.timestamps_us.tolist(), cols.key_valid.tolist()))]
    assert got == [r for r in expect if start <= r[0] and (end is None or r[0] < end)]
    assert cols.value_offsets.dtype == cols.key_offsets.dtype == np.int32 and cols.offsets.dtype == np.int64


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=20)), st.data())
def test_a_one_record_batch_with_lying_offsets_is_malformed(value, key, data):
    """One-record batches are checked with struct reads, not numpy: any offsets that do not
    start at 0 and add up to the body are refused, the honest ones accepted."""
    frame = bytearray(encode_batch([value], None if key is None else [key]))
    n_words = 4 if key is not None else 2
    words = list(struct.unpack_from(f"<{n_words}i", frame, HEADER_BYTES))
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, n_words - 1))
        words[i] = data.draw(st.sampled_from([-1, 0, 1, len(value), len(value) + 1, 1 << 30, -(1 << 31)]))
    struct.pack_into(f"<{n_words}i", frame, HEADER_BYTES, *words)
    struct.pack_into("<I", frame, 32, records.batch_crc(frame, 0, struct.unpack_from("<i", frame)[0], frame[6]))
    body = len(value) + (len(key) if key is not None else 0)
    honest = words[0] == 0 and words[1] >= 0 and (key is None or (words[2] == 0 and words[3] >= 0))
    honest = honest and words[1] + (words[3] if key is not None else 0) == body
    if honest:
        assert validate_frame(bytes(frame), 0, len(frame), 1 << 20) == (len(frame), 1)
    else:
        with pytest.raises(BatchError) as e:
            validate_frame(bytes(frame), 0, len(frame), 1 << 20)
        assert e.value.reason == "malformed"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=30), min_size=1, max_size=12), st.booleans(), st.integers(0, 40), st.data())
def test_one_batch_columns_equal_the_general_path(values, keyed, base, data):
    """A single batch takes a shortcut (a tailing read); it must give the very columns the
    general path gives, for any slice of the batch, with or without keys."""
    frame = bytearray(encode_batch(values, [b"k%d" % i for i in range(len(values))] if keyed else None, create_time_us=77))
    struct.pack_into("<q", frame, 8, base)
    (view,) = iter_batches(bytes(frame))
    lo = data.draw(st.integers(0, len(values) - 1))
    hi = data.draw(st.integers(lo + 1, len(values)))
    one = batches_to_columns([view], base + lo, base + hi)
    many = columns._many_batch_columns([(view, lo, hi)])
    for field in records.Columns.__dataclass_fields__:
        a, b = getattr(one, field), getattr(many, field)
        if a is None or b is None:  # timestamp_types, headers: None when all CreateTime / none
            assert a is None and b is None, field
            continue
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), field
    assert one.values.base is None or one.values.base is not view.values  # a copy, not a view of the buffer


@settings(max_examples=2000, deadline=None)
@given(st.binary(min_size=0, max_size=400), st.integers(min_value=0, max_value=64))
def test_random_bytes_never_escape_as_anything_but_batch_error(data, cut):
    good = encode_batch([b"v" * 10] * 3)
    for candidate in (data, good[:cut] + data, good + data):
        buf = bytes(candidate) + bytes(align8(len(candidate)) - len(candidate))
        try:
            size, count = validate_frame(buf, 0, len(buf), 1 << 20)
        except BatchError:
            continue
        assert HEADER_BYTES <= size <= len(buf) and count >= 1


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20), st.integers(0, 2**62), st.integers(0, 2**31 - 1))
@settings(max_examples=50, deadline=None)
def test_a_restamped_batch_is_the_batch_encoded_with_the_new_ids(values, producer_id, seq):
    """records.restamp (the producer past a sequence gap) gives the same bytes as encoding the
    records with the new producer id and base sequence: a valid CRC, nothing else changed."""
    t = 1_700_000_000_000_000
    old = records.encode_batch(values, create_time_us=t, producer_id=7, base_sequence=3)
    new = records.restamp(old, producer_id, seq)
    assert new == records.encode_batch(values, create_time_us=t, producer_id=producer_id, base_sequence=seq)
    assert records.validate_frame(new, 0, len(new), 1 << 20)[1] == len(values)
