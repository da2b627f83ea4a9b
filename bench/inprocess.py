"""In-process storage stack for unit tests: real shared memory, real files, no sockets.

Builds a catalog, boots a real Flusher (control table, recovery, journal) and real
PartitionActors on a temporary data directory. Everything is unlinked at close.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailrace.actors.partition import PartitionActor
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.persistence.flusher import Flusher
from tailrace.persistence.journal import JournalReader
from tailrace.client.records import encode_batch
from tailrace.shm import region

RING_BYTES = 256 * 1024


@dataclass
class Storage:
    s: settings_mod.Settings
    flusher: Flusher
    journal: JournalReader
    actors: list = field(default_factory=list)

    def close(self) -> None:
        for a in self.actors:
            a.close()
        self.journal.close()
        self.flusher.journal.close()
        for idx in self.flusher.indexes.values():
            idx.close()
        for r in self.flusher.rings.values():
            r.close()
        self.flusher.table.close()
        for name in region.list_instance_regions(self.s.instance):
            region.unlink(name)


def make_storage(data_dir, partitions: int = 2, ring_bytes: int = RING_BYTES, **overrides) -> Storage:
    opts = dict(segment_bytes=1 << 20, max_batch_bytes=64 * 1024, write_buffer_bytes=256 * 1024, ring_bytes=ring_bytes)
    opts.update(overrides)
    s = settings_mod.from_env(env={}, data_dir=str(data_dir), **opts)
    cat = Catalog(s.data_dir)
    if cat.get("t") is None:
        cat.add_topic("t", partitions, ring_bytes)
    for name in region.list_instance_regions(s.instance):
        region.unlink(name)
    fl = Flusher(s)
    fl.boot()
    journal = JournalReader(s.data_dir, s.segment_bytes)
    st = Storage(s, fl, journal)
    topic = cat.get("t")
    for p, slot in enumerate(topic.slots):
        st.actors.append(PartitionActor(fl.table, s.instance, slot, topic.topic_id, p, ring_bytes, 1, s.data_dir, journal, str(data_dir)))
    fl.rescan()  # what a worker's kick b"N" makes the flusher process do
    return st


def append_numbered(st: Storage, actor, n: int) -> None:
    """Append one batch of ``n`` records whose values are their own offsets (b"17"); when the
    ring is full, let the flusher drain it instead (the batch is then not appended)."""
    base = actor.high_watermark
    if actor.append(encode_batch([b"%d" % (base + i) for i in range(n)]), 1 << 14)[0] != 0:
        st.flusher.do_work()
