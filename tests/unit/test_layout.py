"""Golden byte offsets of every shared-memory and record layout, against docs/FORMAT.md.

A client in another language is written from FORMAT.md alone: if a dtype moves a field, this
fails before any reader does."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tailrace.client import records
from tailrace.persistence import index
from tailrace.shm import layout

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"


def _offsets(dtype) -> dict[str, int]:
    return {name: dtype.fields[name][1] for name in dtype.names}


def test_the_record_batch_headers_have_the_documented_offsets():
    assert _offsets(records.HEADER_V2_DTYPE) == {
        "length": 0, "magic": 4, "version": 6, "flags": 7, "base_offset": 8, "append_time_us": 16,
        "partition": 24, "topic_id": 28, "crc": 32, "record_count": 36, "producer_id": 40,
        "base_sequence": 48, "producer_epoch": 52, "attributes": 54, "base_time_us": 56, "records_bytes": 64,
        "leader_epoch": 68, "max_time_us": 72,
    }
    assert _offsets(records.HEADER_DTYPE) == {  # version 1: still read, and its first 52 bytes are every version's
        "length": 0, "magic": 4, "version": 6, "attributes": 7, "base_offset": 8, "append_time_us": 16,
        "partition": 24, "topic_id": 28, "crc": 32, "record_count": 36, "producer_id": 40,
        "base_sequence": 48, "reserved": 52, "create_time_us": 56,
    }
    assert records.HEADER_BYTES == records.HEADER_V2_BYTES == 80 and records.PREFIX_BYTES == 64
    assert records.CRC_START == 36 and records.CRC_GAP == (68, 80)
    assert (records.STAMP_AT, records.STAMP.size) == (8, 24)  # base_offset .. topic_id, outside the CRC
    assert (records.STAMP_V2_AT, records.STAMP_V2.size, records.FLAGS_AT) == (68, 12, 7)  # leader_epoch, max_time_us
    assert (records.COUNT_AT, records.IDEMPOTENCE_AT, records.LENGTH_AT) == (36, 40, 0)
    assert records.MAGIC == 0x5452 and records.VERSION == 2


def test_frames_are_padded_to_8_bytes_by_one_rule():
    assert [records.align8(n) for n in (0, 1, 7, 8, 9, 64, 65)] == [0, 8, 8, 8, 16, 64, 72]
    assert records.align8_array(np.array([1, 8, 9], dtype=np.int32)).tolist() == [8, 8, 16]
    assert records.FRAME_ALIGN == layout.FRAME_ALIGN == 8


def test_the_control_table_header_is_two_cache_lines_with_the_wake_word_at_64():
    assert _offsets(layout.TABLE_HEADER_DTYPE) == {
        "magic": 0, "version": 8, "state": 16, "max_slots": 24, "boot_id": 32, "flusher_pid": 40,
        "flusher_heartbeat_ns": 48, "data_id": 56, "wake": 64, "storage_full": 72, "reserved": 80,
    }
    assert layout.TABLE_HEADER_BYTES == 128 and layout.WAKE_AT == 64
    assert layout.CONTROL_MAGIC == 0x545243544C000002 and layout.LAYOUT_VERSION == 2
    assert layout.control_table_bytes(4096) == 128 + 4096 * 192


def test_a_control_row_is_three_cache_lines_one_per_writer():
    off = _offsets(layout.ROW_DTYPE)
    assert layout.ROW_BYTES == 192
    identity = ["slot", "topic_id", "partition", "active", "ring_bytes", "desc_capacity", "log_start_offset"]
    owner = ["owner_epoch", "write_position", "next_offset", "desc_head", "desc_tail", "ring_start_offset"]
    flusher = ["flushed_desc", "flushed_position", "flushed_offset", "durable_offset", "io_error"]
    assert [off[n] for n in identity] == [0, 8, 16, 24, 32, 40, 48]
    assert [off[n] for n in owner] == [64, 72, 80, 88, 96, 104]
    assert [off[n] for n in flusher] == [128, 136, 144, 152, 160]
    for names, line in ((identity, layout.IDENTITY_COLUMNS), (owner, layout.OWNER_COLUMNS), (flusher, layout.FLUSHER_COLUMNS)):
        assert all(layout.COL[n] in line for n in names)
    assert (layout.C_WRITE_POSITION, layout.C_DESC_HEAD, layout.C_FLUSHED_DESC, layout.C_DURABLE_OFFSET) == (9, 11, 16, 19)


def test_a_ring_is_a_header_line_descriptors_and_page_aligned_data():
    assert _offsets(layout.RING_HEADER_DTYPE) == {
        "magic": 0, "version": 8, "slot": 16, "ring_bytes": 24, "desc_capacity": 32, "reserved": 40}
    assert _offsets(layout.DESCRIPTOR_DTYPE) == {"position": 0, "base_offset": 8, "length": 16, "count": 20}
    assert layout.RING_MAGIC == 0x54524E4700000002
    eight_mib = 8 << 20  # FORMAT.md's worked example: 65,536 descriptors, data at 1,576,960
    assert layout.desc_capacity_for(eight_mib) == 65536
    assert layout.ring_data_start(eight_mib) == 1576960
    assert layout.ring_region_bytes(eight_mib) == 9965568
    assert layout.desc_capacity_for(4096) == 64  # the floor


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def _table(text: str, pattern: str) -> dict[str, int]:
    """``name -> byte offset`` from the rows of a FORMAT.md table (``pattern`` captures both)."""
    return {m["name"]: int(m["at"]) for m in re.finditer(pattern, text, re.MULTILINE)}


def test_every_offset_the_format_document_states_is_the_one_the_code_declares():
    doc = FORMAT_MD.read_text()
    header = _table(_section(doc, "### 1.1", "### 1.2"), r"^\| (?P<at>\d+) \| \d+ \| \w+ \| `(?P<name>\w+)` \|")
    assert header == _offsets(records.HEADER_V2_DTYPE)
    header_v1 = _table(_section(doc, "### 1.8", "## 2."), r"^\| (?P<at>\d+) \| \d+ \| \w+ \| `(?P<name>\w+)` \|")
    assert header_v1 == _offsets(records.HEADER_DTYPE)
    entry = _table(_section(doc, "## 3. Partition index", "## 4."), r"^\| (?P<at>\d+) \| \d+ \| \w+ \| `(?P<name>\w+)` \|")
    assert entry == _offsets(index.ENTRY_DTYPE)
    table = _table(_section(doc, "Table header:", "Row: "), r"^\| (?P<at>\d+) \| `(?P<name>\w+)`")
    assert table == {n: at for n, at in _offsets(layout.TABLE_HEADER_DTYPE).items() if n != "reserved"}
    row = _table(_section(doc, "Row: ", "### 7.2"), r"^\| \d \| (?P<at>\d+) \| `(?P<name>\w+)`")
    assert row == {n: at for n, at in _offsets(layout.ROW_DTYPE).items() if not n.startswith("_")}
    # the old durable_wanted word (never used, always zero) is the truncation request now: same place
    assert _offsets(layout.ROW_DTYPE)["truncate_request"] == 112 and _offsets(layout.ROW_DTYPE)["truncated_to"] == 168
