"""The topic catalog file (``<data_dir>/topics.json``): which topics exist and where they live.

Concurrency contract: the router is the only writer; workers and the flusher read it (and re-read
it when they meet a slot or topic they do not know). It is replaced atomically: write a temp
file, fsync it, rename it over the old one, fsync the directory. A reader therefore sees the old
or the new catalog, never a mix, and a topic the router acknowledged survives a host crash.

Every partition has a *slot*: a broker-wide number that names its ring, its control-table row,
its index file and lock file; its batches in the journal carry the topic id and partition. A
deleted topic's slots are *retired*: the flusher clears what is left of them (persistence/
retire.py), and a retired slot whose index file and ring are gone is free for a new partition.
Topic ids are never reused: a journal batch of a topic id below ``next_topic_id`` that the
catalog no longer lists belongs to a deleted topic.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import numpy as np

from tailrace.client.protocol import MAX_TOPIC_BYTES

from .datadir import CATALOG_FILE, WORKERS_FILE, file_signature, write_atomic


class TopicEntry(msgspec.Struct):
    name: str
    topic_id: int
    partitions: int
    ring_bytes: int
    slots: list[int]
    config: dict[str, int | str] = {}  # the topic's own settings (retention.ms, compression.type...); defaults fill the rest
    cluster_id: int = 0  # a cluster's topic: its id there (the etcd key's create revision); 0: this broker's own


class CatalogData(msgspec.Struct):
    version: int = 1
    next_topic_id: int = 1
    next_slot: int = 0
    topics: dict[str, TopicEntry] = {}
    retired: list[int] = []  # slots of deleted topics, cleared or not yet (never in a topic's slots)


def stored_worker_count(data_dir) -> int | None:
    """The worker count last set (``tailrace serve --workers`` or ``tailrace workers set``)."""
    try:
        n = int(msgspec.json.decode((Path(data_dir) / WORKERS_FILE).read_bytes())["workers"])
    except (FileNotFoundError, msgspec.DecodeError, KeyError, TypeError, ValueError):
        return None
    return n if n >= 1 else None


def store_worker_count(data_dir, n: int) -> None:
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(data_dir) / WORKERS_FILE, msgspec.json.encode({"workers": n}))


# The broker's own topics (Kafka's internal topics): made by the broker, refused to topic admin
# (create, alter, delete: INTERNAL_TOPIC) and left out of LIST_TOPICS unless asked for. Deleting
# __consumer_offsets would take every group's committed offsets with it.
OFFSETS_TOPIC = "__consumer_offsets"  # committed group offsets (router/groups.py)
SHARE_STATE_TOPIC = "__share_group_state"  # share groups' in-flight state (router/share.py)
DELAY_TOPIC = "__delayed_records"  # records with a delivery time, until then (router/timer.py)
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, SHARE_STATE_TOPIC, DELAY_TOPIC})


def internal_topic_refusal(name: str, action: str) -> str | None:
    """Why topic admin may not ``action`` topic ``name`` (None: not internal, it may)."""
    if name not in INTERNAL_TOPICS:
        return None
    held = {OFFSETS_TOPIC: "the consumer groups' committed offsets", SHARE_STATE_TOPIC: "the share groups' state",
            DELAY_TOPIC: "the records waiting for their delivery time"}[name]
    return (f"topic {name!r} is internal to the broker (it holds {held}): "
            f"it cannot be {action} (Kafka's rule for internal topics)")


def valid_topic_name(name: str) -> bool:
    """1..MAX_TOPIC_BYTES UTF-8 bytes of letters, digits (``str.isalnum``), '.', '_' and '-', and
    not '.' or '..' (a tool that names a directory or file after a topic would read those as this or
    the parent directory)."""
    b = name.encode("utf-8", "replace")
    return 0 < len(b) <= MAX_TOPIC_BYTES and name not in (".", "..") and all(c.isalnum() or c in "._-" for c in name)


class Catalog:
    def __init__(self, data_dir: str | os.PathLike):
        self.path = Path(data_dir) / CATALOG_FILE
        self.data = CatalogData()
        self._seen = None  # the file's signature when last read (datadir.file_signature)
        self.by_slot: dict[int, tuple[TopicEntry, int]] = {}
        self.reload()

    def reload(self, force: bool = False) -> bool:
        """Re-read the file if it changed (``force``: whatever its signature says); return True
        if it was read."""
        sig = file_signature(self.path)  # mtime, size and inode (datadir.file_signature)
        if sig is None or (sig == self._seen and not force):
            return False
        self.data = msgspec.json.decode(self.path.read_bytes(), type=CatalogData)
        self._seen = sig
        self.by_slot = {slot: (t, p) for t in self.data.topics.values() for p, slot in enumerate(t.slots)}
        return True

    def get(self, name: str) -> TopicEntry | None:
        return self.data.topics.get(name)

    def slot_of(self, name: str, partition: int) -> int | None:
        """Slot of a topic partition, re-reading the file once on a miss."""
        for attempt in (0, 1):
            t = self.data.topics.get(name)
            if t is not None and 0 <= partition < t.partitions:
                return t.slots[partition]
            if attempt == 0 and not self.reload():
                return None
        return None

    def topic_of_slot(self, slot: int) -> tuple[TopicEntry, int] | None:
        if slot not in self.by_slot:
            self.reload()
        return self.by_slot.get(slot)

    def _take_slots(self, n: int, free: list[int]) -> tuple[list[int], list[int], int]:
        """``n`` slots: free retired ones first (lowest first), then new ones. Returns (the
        slots, the retired list without them, the next new slot)."""
        d = self.data
        reuse = sorted(set(free) & set(d.retired))[:n]
        fresh = list(range(d.next_slot, d.next_slot + n - len(reuse)))
        return reuse + fresh, [s for s in d.retired if s not in reuse], d.next_slot + len(fresh)

    def slots_available(self, max_slots: int, free: list[int]) -> int:
        """Slots a new partition can take now: free retired ones and never-used ones."""
        return len(set(free) & set(self.data.retired)) + max(0, max_slots - self.data.next_slot)

    def add_topic(self, name: str, partitions: int, ring_bytes: int, config: dict[str, int | str] | None = None,
                  free: list[int] = (), cluster_id: int = 0) -> TopicEntry:
        """Add a topic and write the catalog durably (router only). ``free``: retired slots that
        are known clear (the router checks; persistence/retire.py clears them)."""
        d = self.data
        slots, retired, next_slot = self._take_slots(partitions, list(free))
        entry = TopicEntry(name=name, topic_id=d.next_topic_id, partitions=partitions, ring_bytes=ring_bytes,
                           slots=slots, config=dict(config or {}), cluster_id=cluster_id)
        self._write(CatalogData(version=d.version, next_topic_id=d.next_topic_id + 1, next_slot=next_slot,
                                topics={**d.topics, name: entry}, retired=retired))
        return entry

    def add_partitions(self, name: str, total: int, free: list[int] = ()) -> TopicEntry:
        """Grow topic ``name`` to ``total`` partitions on other slots, written durably (router only).
        Partitions keep their numbers and slots; the new ones are numbered after them."""
        d = self.data
        old = d.topics[name]
        extra = total - old.partitions
        assert extra > 0, (name, total)
        slots, retired, next_slot = self._take_slots(extra, list(free))
        entry = msgspec.structs.replace(old, partitions=total, slots=[*old.slots, *slots], config=dict(old.config))
        self._write(CatalogData(version=d.version, next_topic_id=d.next_topic_id, next_slot=next_slot,
                                topics={**d.topics, name: entry}, retired=retired))
        return entry

    def delete_topic(self, name: str) -> TopicEntry:
        """Remove topic ``name``, its slots retired, written durably (router only): from here on
        the topic does not exist for anyone who reads the catalog."""
        d = self.data
        old = d.topics[name]
        self._write(CatalogData(version=d.version, next_topic_id=d.next_topic_id, next_slot=d.next_slot,
                                topics={k: v for k, v in d.topics.items() if k != name},
                                retired=sorted({*d.retired, *old.slots})))
        return old

    def deleted_topic_ids(self, topic_ids):
        """Which of ``topic_ids`` (a numpy array) name deleted topics: allotted once, listed no more."""
        live = np.asarray([t.topic_id for t in self.data.topics.values()] or [-1], dtype=np.int64)
        ids = np.asarray(topic_ids, dtype=np.int64)
        return (ids >= 1) & (ids < self.data.next_topic_id) & ~np.isin(ids, live)

    def set_config(self, name: str, changes: dict[str, int | str | None]) -> TopicEntry:
        """Set (or, for None, remove) settings of topic ``name``, written durably (router only)."""
        d = self.data
        old = d.topics[name]
        config = {**old.config, **{k: v for k, v in changes.items() if v is not None}}
        for k, v in changes.items():
            if v is None:
                config.pop(k, None)
        entry = msgspec.structs.replace(old, slots=list(old.slots), config=config)
        self._write(CatalogData(version=d.version, next_topic_id=d.next_topic_id, next_slot=d.next_slot,
                                topics={**d.topics, name: entry}, retired=list(d.retired)))
        return entry

    def set_cluster_id(self, name: str, cluster_id: int) -> TopicEntry:
        """Record topic ``name``'s id in its cluster (a topic the controller made here before its
        watch brought the id), written durably (router only)."""
        d = self.data
        entry = msgspec.structs.replace(d.topics[name], cluster_id=cluster_id)
        self._write(CatalogData(version=d.version, next_topic_id=d.next_topic_id, next_slot=d.next_slot,
                                topics={**d.topics, name: entry}, retired=list(d.retired)))
        return entry

    def _write(self, new: CatalogData) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, msgspec.json.format(msgspec.json.encode(new)))
        self.data = new
        self._seen = file_signature(self.path)
        self.by_slot = {slot: (t, p) for t in new.topics.values() for p, slot in enumerate(t.slots)}

    def shm_bytes(self, region_bytes) -> int:
        """Total shared memory the catalog's rings need, with ``region_bytes(ring_bytes)``."""
        return sum(region_bytes(t.ring_bytes) * t.partitions for t in self.data.topics.values())
