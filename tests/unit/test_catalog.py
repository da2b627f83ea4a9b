"""broker/catalog.py: the topic catalog file, its atomic replacement and its readers."""

from __future__ import annotations

import os

import msgspec

from tailrace.broker.catalog import Catalog, CatalogData, store_worker_count, stored_worker_count, valid_topic_name
from tailrace.broker.datadir import CATALOG_FILE, WORKERS_FILE


def test_topics_get_dense_ids_and_slots_that_are_never_reused(tmp_path):
    c = Catalog(tmp_path)
    a = c.add_topic("a", 3, 1 << 20)
    b = c.add_topic("b", 2, 2 << 20)
    assert (a.topic_id, a.slots) == (1, [0, 1, 2])
    assert (b.topic_id, b.slots) == (2, [3, 4])
    assert c.slot_of("b", 1) == 4 and c.slot_of("b", 2) is None and c.slot_of("nope", 0) is None
    assert c.topic_of_slot(3) == (b, 0)
    assert c.shm_bytes(lambda ring: ring) == 3 * (1 << 20) + 2 * (2 << 20)


def test_the_file_is_replaced_atomically_and_a_reader_sees_the_new_catalog_on_reload(tmp_path):
    writer, reader = Catalog(tmp_path), Catalog(tmp_path)
    assert reader.get("t") is None
    writer.add_topic("t", 1, 1 << 20)
    assert not list(tmp_path.glob("*.tmp"))  # the temp file was renamed over
    data = msgspec.json.decode((tmp_path / CATALOG_FILE).read_bytes(), type=CatalogData)
    assert list(data.topics) == ["t"] and data.next_slot == 1
    assert reader.slot_of("t", 0) == 0  # a miss re-reads the file once
    assert reader.reload() is False  # unchanged since
    st = os.stat(tmp_path / CATALOG_FILE)
    assert st.st_size > 0


def test_a_catalog_survives_a_reopen_with_its_counters(tmp_path):
    Catalog(tmp_path).add_topic("x", 2, 1 << 20)
    again = Catalog(tmp_path)
    assert again.add_topic("y", 1, 1 << 20).slots == [2]
    assert again.get("y").topic_id == 2


def test_topic_names_are_1_to_200_bytes_of_letters_digits_dot_underscore_dash():
    assert valid_topic_name("orders.eu-1_v2")
    assert valid_topic_name("n" * 200)
    for bad in ("", "n" * 201, "a b", "a/b", "a\x00", "ä" * 101):
        assert not valid_topic_name(bad), bad


def test_dot_and_dot_dot_are_not_topic_names_but_other_dotted_names_are():
    assert not valid_topic_name(".")
    assert not valid_topic_name("..")
    for ok in ("...", ".a", "a.", "..a", "a..b", "_", "-"):
        assert valid_topic_name(ok), ok


def test_the_worker_count_is_stored_and_a_damaged_file_reads_as_unset(tmp_path):
    assert stored_worker_count(tmp_path) is None
    store_worker_count(tmp_path, 4)
    assert stored_worker_count(tmp_path) == 4
    (tmp_path / WORKERS_FILE).write_text("{not json")
    assert stored_worker_count(tmp_path) is None
    (tmp_path / WORKERS_FILE).write_text('{"workers": 0}')
    assert stored_worker_count(tmp_path) is None


def test_a_reader_sees_every_rewrite_however_quick_and_whatever_inode_it_gets(tmp_path):
    """Three rewrites in one tick of the file system's clock: the third one's temp file may get
    the first one's inode number back (ext4 does), with the same size. A reader that saw the
    first must still see the third as a change (a retirer or worker that did not would act on a
    deleted topic's slots that a new topic has since taken)."""
    from tailrace.broker.datadir import file_signature, write_atomic

    path = tmp_path / "rules.json"
    seen, mtimes, inodes = set(), [], set()
    for i in range(300):
        write_atomic(path, b"x" * (100 + i % 2), sync=False)
        sig = file_signature(path)
        assert sig not in seen, f"version {i} looks like an earlier one: {sig}"
        seen.add(sig)
        mtimes.append(sig[0])
        inodes.add(sig[2])
    assert all(b > a for a, b in zip(mtimes, mtimes[1:]))  # one clock tick holds many of these writes
    reader_sig = file_signature(path)
    writer, reader = Catalog(tmp_path), Catalog(tmp_path)
    writer.add_topic("a", 1, 1 << 20)
    assert reader.reload() and reader.get("a") is not None
    writer.delete_topic("a")
    writer.add_topic("b", 1, 1 << 20, free=[0])  # a's slot, cleared, taken again
    assert reader.reload() and reader.get("b").slots == [0] and reader.data.retired == []
    assert reader_sig == file_signature(path)
