"""cluster/etcd.py against a real etcd: ranges, transactions, leases, watches that resume."""

from __future__ import annotations

import time

import pytest

from tailrace.cluster.errors import EtcdUnavailable
from tailrace.cluster.etcd import (Etcd, absent, create_revision_is, delete_op, get_op, mod_revision_is, put_op,
                                   value_is)

from .conftest import wait_until


def drain(watch, want: int, timeout_s: float = 5.0) -> list:
    """Events from ``watch`` until ``want`` arrived or ``timeout_s`` passed."""
    events, deadline = [], time.monotonic() + timeout_s
    while len(events) < want and time.monotonic() < deadline:
        batch = watch.get(0.1)
        if batch is not None:
            assert not batch.compacted
            events.extend(batch.events)
    return events


def test_put_get_and_a_prefix_range_read_at_one_revision(etcd, cluster_name):
    root = f"/test/{cluster_name}/"
    revs = [etcd.put(root + k, f"v{k}") for k in ("b", "a", "c")]
    etcd.put(f"/test/{cluster_name}x", "outside the prefix")
    kvs, revision = etcd.get_prefix(root)
    assert [kv.key for kv in kvs] == [root + "a", root + "b", root + "c"]
    assert [kv.value for kv in kvs] == [b"va", b"vb", b"vc"]
    assert revision >= max(revs) and revs == sorted(revs)
    assert etcd.get(root + "a").create_revision == revs[1]
    assert etcd.get(root + "nothing") is None
    assert etcd.delete(root, prefix=True) == 3
    assert etcd.get_prefix(root)[0] == []


def test_a_create_if_absent_transaction_succeeds_once_and_the_loser_reads_the_winner(etcd, cluster_name):
    key = f"/test/{cluster_name}/only"
    first = etcd.txn([absent(key)], [put_op(key, "first")], [get_op(key)])
    second = etcd.txn([absent(key)], [put_op(key, "second")], [get_op(key)])
    assert first.succeeded and not second.succeeded
    (held,) = second.kvs(0)
    assert held.value == b"first" and held.create_revision == first.revision


def test_compares_on_create_revision_mod_revision_and_value_guard_the_success_branch(etcd, cluster_name):
    key = f"/test/{cluster_name}/k"
    created = etcd.put(key, "1")
    changed = etcd.put(key, "2")
    assert not etcd.txn([create_revision_is(key, changed)], [put_op(key, "no")]).succeeded
    assert not etcd.txn([mod_revision_is(key, created)], [put_op(key, "no")]).succeeded
    assert not etcd.txn([value_is(key, "1")], [put_op(key, "no")]).succeeded
    assert etcd.get(key).value == b"2"
    ok = etcd.txn([create_revision_is(key, created), mod_revision_is(key, changed), value_is(key, "2")],
                  [put_op(key, "3"), delete_op(key + "/none")])
    assert ok.succeeded and etcd.get(key).value == b"3"


def test_keys_under_a_lease_go_when_it_is_revoked_and_a_dead_lease_cannot_be_kept_alive(etcd, cluster_name):
    key = f"/test/{cluster_name}/leased"
    lease = etcd.grant(5)
    etcd.put(key, "x", lease=lease)
    assert etcd.get(key).lease == lease and 0 < etcd.time_to_live(lease) <= 5
    assert etcd.keepalive(lease) == 5
    assert etcd.revoke(lease) is True
    assert etcd.get(key) is None
    assert etcd.keepalive(lease) <= 0 and etcd.time_to_live(lease) <= 0
    assert etcd.revoke(lease) is False


def test_keys_under_a_lease_that_is_not_kept_alive_expire(etcd, cluster_name):
    key = f"/test/{cluster_name}/expiring"
    etcd.put(key, "x", lease=etcd.grant(2))
    assert etcd.get(key) is not None
    assert wait_until(lambda: etcd.get(key) is None, 6.0)


def test_a_watch_from_an_old_revision_replays_every_change_since(etcd, cluster_name):
    root = f"/test/{cluster_name}/"
    first = etcd.put(root + "a", "1")
    etcd.put(root + "b", "2")
    etcd.delete(root + "a")
    watch = etcd.watch_prefix(root, first)
    try:
        events = drain(watch, 3)
        assert [(e.type, e.kv.key, e.kv.value) for e in events] == [
            ("PUT", root + "a", b"1"), ("PUT", root + "b", b"2"), ("DELETE", root + "a", b"")]
    finally:
        watch.stop()


def test_a_watch_resumes_after_a_dropped_connection_with_nothing_lost_or_repeated(etcd, cluster_name):
    root = f"/test/{cluster_name}/"
    _, revision = etcd.get_prefix(root)
    watch = etcd.watch_prefix(root, revision + 1, retry_s=1.0)
    try:
        assert watch.connected.wait(5)
        etcd.put(root + "0", "before")
        assert [e.kv.key for e in drain(watch, 1)] == [root + "0"]
        watch.drop_connection()
        assert wait_until(lambda: not watch.connected.is_set(), 2.0)
        # written while no stream is open (the watch waits retry_s before it opens one again)
        for i in range(1, 6):
            etcd.put(root + str(i), "while away")
        events = drain(watch, 5)
        time.sleep(0.3)
        assert watch.get(0.2) is None  # and nothing twice
        assert [e.kv.key for e in events] == [root + str(i) for i in range(1, 6)]
        assert watch.reconnects == 1
    finally:
        watch.stop()


def test_a_watch_resumes_across_an_etcd_restart(own_etcd_server):
    etcd = Etcd(own_etcd_server.endpoint, timeout_s=1.0)
    root = "/test/restart/"
    etcd.put(root + "a", "1")
    _, revision = etcd.get_prefix(root)
    # the watch opens its next stream retry_s after the last one ended: after the restart and the puts
    watch = etcd.watch_prefix(root, revision + 1, retry_s=3.0)
    try:
        assert watch.connected.wait(5)
        own_etcd_server.kill()
        with pytest.raises(EtcdUnavailable):
            etcd.put(root + "b", "down")
        own_etcd_server.start()
        written = [etcd.put(root + k, k) for k in "cde"]
        # written while the watch was away (else this run proves nothing: etcd took retry_s to restart)
        assert not watch.connected.is_set(), "the watch came back before the puts"
        events = drain(watch, 3, timeout_s=8.0)
        assert [(e.kv.key, e.kv.mod_revision) for e in events] == list(zip([root + k for k in "cde"], written))
        assert watch.reconnects >= 1
    finally:
        watch.stop()


def test_a_watch_from_a_compacted_revision_is_told_to_read_afresh(etcd, cluster_name):
    root = f"/test/{cluster_name}/"
    old = etcd.put(root + "a", "1")
    now = etcd.put(root + "a", "2")
    etcd.compact(now)
    watch = etcd.watch_prefix(root, old)
    try:
        batch = watch.get(5.0)
        assert batch is not None and batch.compacted == now and not batch.events
    finally:
        watch.stop()
