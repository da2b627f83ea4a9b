"""LIST_OFFSETS: every partition's log start, watermarks and unflushed bytes, and with a
``timestamp_ms`` the first offset appended at or after it (seek by time, Kafka's
``ListOffsets`` with a timestamp). Served by any worker for any topic: the offsets come from the
control table, the time lookup from each partition's ``PartitionLog`` (persistence/log.py).
"""

from __future__ import annotations

from tailrace.broker.catalog import Catalog
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.client.ring_reader import SharedRings
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.log import PartitionLog
from tailrace.shm.layout import COL
from tailrace.shm.ring import ControlTable

_list_offsets_dec = ops.DECODERS[P.Op.LIST_OFFSETS]
_WRITE, _FLUSHED_POS = COL["write_position"], COL["flushed_position"]
_REPLICATED_HW = COL["replicated_hw"]


class OffsetsContext:
    """What LIST_OFFSETS reads: the catalog, the control table, the data directory and the
    worker's journal reader (index and journal for the time lookup), and read-only ring views
    (opened on the first time lookup that reaches past the index)."""

    def __init__(self, catalog: Catalog, table: ControlTable, data_dir: str, journal: JournalReader, instance: str):
        self.catalog, self.table, self.data_dir, self.journal, self.instance = catalog, table, data_dir, journal, instance
        self.rings: SharedRings | None = None

    def ring_tail(self, slot: int, topic_id: int, partition: int):
        if self.rings is None:
            self.rings = SharedRings(self.instance, 0)
        return self.rings.partition(slot, topic_id, partition)

    def close(self) -> None:
        if self.rings is not None:
            self.rings.close()


def list_offsets(ctx: OffsetsContext, ident, assign, topic, partition, rest, who, reply) -> None:
    ts_ms = _list_offsets_dec.decode(rest[1]).timestamp_ms
    name = topic.decode("utf-8", "replace")
    ctx.catalog.reload()  # one stat: a topic grown since (topic alter) lists its new partitions
    entry = ctx.catalog.get(name)
    if entry is None:
        return reply(P.ErrorCode.UNKNOWN_TOPIC, P.ErrorReply(f"unknown topic {name!r}"))
    rows = ctx.table.rows
    parts = []
    for p, slot in enumerate(entry.slots):
        plog = PartitionLog(rows[slot], ctx.data_dir, slot, ctx.journal)
        try:
            row = plog.row
            replicated = int(row[_REPLICATED_HW])  # a replicated partition led here: its high watermark + 1
            po = P.PartitionOffsets(p, plog.log_start_offset, replicated - 1 if replicated else plog.high_watermark,
                                    plog.durable_watermark,
                                    int(row[_WRITE] - row[_FLUSHED_POS]), int(row[_WRITE]))
            if ts_ms >= 0:
                tail = lambda slot=slot, p=p: ctx.ring_tail(slot, entry.topic_id, p)  # noqa: E731
                found = plog.offset_for_time(ts_ms * 1000, tail)
                if found is not None:
                    po.time_offset, po.time_timestamp_ms = found[0], found[1] // 1000
        finally:
            plog.close()
        parts.append(po)
    reply(P.ErrorCode.OK, P.ListOffsetsReply(name, parts))
