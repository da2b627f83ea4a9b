"""Every shared-memory layout of tailrace, declared once.

Two kinds of POSIX shared-memory region exist per broker instance (one instance = one data dir):

``/tailrace-<id>-ctl``: the control table, one row per partition slot::

    +----------------------+--------------------------------+---------------- ... ---+
    | table header (128 B) | row 0 (192 B = 3 cache lines)  | row 1 ...   row N-1    |
    +----------------------+--------------------------------+---------------- ... ---+

    table header: line 0 identity and state (the flusher; data_id at 56), line 1 the ``wake``
    futex word at 64 (every worker and the flusher store to it: shm/futex.py), ``storage_full``
    at 72 (the flusher alone stores it, when its disk check changes its mind; every worker loads
    it once per produce request: shm/rows.py ``HeaderView``), then reserved

    row, one int64 per field; each cache line has exactly one writer:
    line 0  (set when the slot is recovered or created; flusher at boot, actor at attach; after
            that only the flusher's named exceptions in shm/rows.py FlusherColumns: the log
            start moved by retention, the row cleared by the retirer)
        slot | topic_id | partition | active | ring_bytes | desc_capacity | log_start_offset | -
    line 1  (written only by the actor that owns the partition)
        owner_epoch | write_position | next_offset | desc_head | desc_tail | ring_start_offset
        | truncate_request (a cut of the log asked of the flusher: offset + 1, else 0)
        | replicated_hw (a replicated partition led here: its high watermark + 1, else 0)
    line 2  (written only by the flusher)
        flushed_desc | flushed_position | flushed_offset | durable_offset | io_error
        | truncated_to (the cut done, acknowledging truncate_request: offset + 1, else 0) | - | -

The two truncation words are a four-phase handshake (actors/truncate.py, persistence/
truncation.py): the actor stores a request only while the acknowledgement is 0, the flusher
acknowledges a request once its cut is durable, the actor clears its request once it has reset
its ring, and the flusher clears its acknowledgement once the request is gone.

``/tailrace-<id>-r<slot>``: one partition's ring::

    +--------------------+-------------------------------------+------------------------------+
    | ring header (64 B) | descriptors: desc_capacity x 24 B   | data: ring_bytes (a byte ring)|
    +--------------------+-------------------------------------+------------------------------+

    descriptor (one per appended batch, in append order, slot = seq % desc_capacity):
        position (int64, absolute data position) | base_offset (int64) | length (int32, the batch's
        own length; its frame takes align8(length) bytes) | count (int32)

Positions in a ring are absolute and only grow; the byte index is ``position % ring_bytes``. A
batch never straddles the end of the data area: when it would, the writer skips to the next lap
(the skipped bytes are a gap no descriptor points into), so every batch is one contiguous slice.

Publication order (x86-64 TSO keeps plain stores in program order; CPython issues them in
source order): the actor writes batch bytes, then the descriptor, then ``desc_head``,
``write_position`` and ``next_offset``. A reader that loads ``desc_head`` first sees complete
descriptors and bytes below it. On a weakly ordered CPU this needs fences CPython cannot emit:
tailrace supports x86-64 only for multi-process shared memory.
"""

from __future__ import annotations

import numpy as np

CACHE_LINE = 64
CONTROL_MAGIC = 0x54524354_4C000002  # "TRCTL" + layout version in the low byte
RING_MAGIC = 0x54524E47_00000002  # "TRNG" + layout version
LAYOUT_VERSION = 2

# --- control table header ------------------------------------------------------------------
TABLE_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<i8"),
        ("state", "<i8"),  # STATE_* below, written by the flusher (boot owner)
        ("max_slots", "<i8"),
        ("boot_id", "<i8"),  # changes at every full recovery
        ("flusher_pid", "<i8"),
        ("flusher_heartbeat_ns", "<i8"),
        ("data_id", "<i8"),  # the data directory's random id (data_dir/instance.json)
        # futex word (low 4 bytes) that same-host ring readers sleep on: workers store a new value
        # when a loop turn appends (shm/futex.py), the flusher after a sync
        ("wake", "<i8"),
        # 1 while the journal's filesystem is fuller than disk_max_used_ratio: produce is answered
        # STORAGE_FULL (persistence/retention.py, DiskGuard). Written by the flusher only; it was a
        # reserved word, zero ("not full") in a table made by an older flusher.
        ("storage_full", "<i8"),
        ("reserved", "<i8", (6,)),
    ]
)
TABLE_HEADER_BYTES = TABLE_HEADER_DTYPE.itemsize
WAKE_AT = TABLE_HEADER_DTYPE.fields["wake"][1]
STORAGE_FULL_AT = TABLE_HEADER_DTYPE.fields["storage_full"][1]
WAKE_FLUSHER = 0xFF  # the flusher's writer id in wake values (workers use their id)
assert TABLE_HEADER_BYTES == 2 * CACHE_LINE
assert CACHE_LINE <= STORAGE_FULL_AT < 2 * CACHE_LINE  # read per produce: off the heartbeat's line 0

STATE_INITIALIZING = 1
STATE_READY = 2
STATE_STOPPING = 3

# --- control row -----------------------------------------------------------------------------
ROW_FIELDS = [
    # line 0: slot identity (boot / attach)
    "slot", "topic_id", "partition", "active", "ring_bytes", "desc_capacity", "log_start_offset", "_r0",
    # line 1: the owning actor
    "owner_epoch", "write_position", "next_offset", "desc_head", "desc_tail", "ring_start_offset",
    # a cut of the log to this offset (+ 1; 0: none) asked of the flusher (actors/truncate.py); byte
    # 112 was once named durable_wanted, never used, and always zero: an older table reads as no cut
    "truncate_request",
    "replicated_hw",  # a replicated partition's high watermark + 1 (0: not replicated, the log end is it)
    # line 2: the flusher
    "flushed_desc", "flushed_position", "flushed_offset", "durable_offset", "io_error",
    "truncated_to",  # the cut the flusher made for truncate_request (+ 1; 0: none), durable when stored
    "_r3", "_r4",
]
ROW_DTYPE = np.dtype([(name, "<i8") for name in ROW_FIELDS])
ROW_BYTES = ROW_DTYPE.itemsize
ROW_WORDS = ROW_BYTES // 8
# Column index of every field in the int64[max_slots, ROW_WORDS] view (derived, never retyped).
COL = {name: ROW_DTYPE.fields[name][1] // 8 for name in ROW_FIELDS}
# Named columns, for the code that indexes rows (row[C_WRITE_POSITION]) without a dict lookup.
(C_SLOT, C_TOPIC_ID, C_PARTITION, C_ACTIVE, C_RING_BYTES, C_DESC_CAPACITY, C_LOG_START_OFFSET) = (
    COL[n] for n in ("slot", "topic_id", "partition", "active", "ring_bytes", "desc_capacity", "log_start_offset"))
(C_OWNER_EPOCH, C_WRITE_POSITION, C_NEXT_OFFSET, C_DESC_HEAD, C_DESC_TAIL, C_RING_START_OFFSET) = (
    COL[n] for n in ("owner_epoch", "write_position", "next_offset", "desc_head", "desc_tail", "ring_start_offset"))
(C_FLUSHED_DESC, C_FLUSHED_POSITION, C_FLUSHED_OFFSET, C_DURABLE_OFFSET, C_IO_ERROR) = (
    COL[n] for n in ("flushed_desc", "flushed_position", "flushed_offset", "durable_offset", "io_error"))
C_TRUNCATE_REQUEST, C_TRUNCATED_TO = COL["truncate_request"], COL["truncated_to"]
# Which cache line (and so which single writer) each column belongs to; shm/rows.py turns this
# into types (OwnerRow stores OWNER_COLUMNS only, FlusherRow FLUSHER_COLUMNS only).
IDENTITY_COLUMNS = range(0, 8)  # boot / attach
OWNER_COLUMNS = range(8, 16)  # the owning actor
FLUSHER_COLUMNS = range(16, 24)  # the flusher
assert C_OWNER_EPOCH in OWNER_COLUMNS and C_RING_START_OFFSET in OWNER_COLUMNS
assert C_FLUSHED_DESC in FLUSHER_COLUMNS and C_IO_ERROR in FLUSHER_COLUMNS
assert C_TRUNCATE_REQUEST in OWNER_COLUMNS and C_TRUNCATED_TO in FLUSHER_COLUMNS
assert ROW_BYTES == 3 * CACHE_LINE
assert ROW_DTYPE.fields["owner_epoch"][1] == CACHE_LINE
assert ROW_DTYPE.fields["flushed_desc"][1] == 2 * CACHE_LINE


def control_table_bytes(max_slots: int) -> int:
    return TABLE_HEADER_BYTES + max_slots * ROW_BYTES


# --- ring ------------------------------------------------------------------------------------
RING_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<i8"),
        ("slot", "<i8"),
        ("ring_bytes", "<i8"),
        ("desc_capacity", "<i8"),
        ("reserved", "<i8", (3,)),
    ]
)
RING_HEADER_BYTES = RING_HEADER_DTYPE.itemsize
assert RING_HEADER_BYTES == CACHE_LINE

DESCRIPTOR_DTYPE = np.dtype(
    [("position", "<i8"), ("base_offset", "<i8"), ("length", "<i4"), ("count", "<i4")]
)
DESCRIPTOR_BYTES = DESCRIPTOR_DTYPE.itemsize
assert DESCRIPTOR_BYTES == 24

# Frames in a ring (and in the journal, which copies them) start at multiples of FRAME_ALIGN:
# a batch of ``length`` bytes takes ``align_frame(length)``. The ring knows this much of a frame
# and nothing more; client/records.py re-exports it as the format's padding (align8).
FRAME_ALIGN = 8


def align_frame(length: int) -> int:
    return (length + FRAME_ALIGN - 1) & ~(FRAME_ALIGN - 1)


def align_frames(lengths: np.ndarray) -> np.ndarray:
    """``align_frame`` of every element, as int64 (no Python step per element)."""
    return (lengths.astype(np.int64) + (FRAME_ALIGN - 1)) & ~(FRAME_ALIGN - 1)


# One descriptor per this many ring bytes: batches smaller than this on average fill the
# descriptor ring before the data ring (the writer then reports backpressure just the same).
RING_BYTES_PER_DESCRIPTOR = 128
RING_ALIGN = 4096


def desc_capacity_for(ring_bytes: int) -> int:
    return max(ring_bytes // RING_BYTES_PER_DESCRIPTOR, 64)


def ring_region_bytes(ring_bytes: int) -> int:
    """Total shared bytes one partition costs: header + descriptors + data (page aligned)."""
    desc = desc_capacity_for(ring_bytes) * DESCRIPTOR_BYTES
    head = RING_HEADER_BYTES + desc
    head = (head + RING_ALIGN - 1) // RING_ALIGN * RING_ALIGN
    return head + ring_bytes


def ring_data_start(ring_bytes: int) -> int:
    return ring_region_bytes(ring_bytes) - ring_bytes
