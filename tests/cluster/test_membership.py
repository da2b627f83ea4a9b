"""cluster/membership.py against a real etcd: registration under a lease, expiry, the fence."""

from __future__ import annotations

import json
import time

import pytest

from tailrace.cluster.errors import BrokerIdInUse
from tailrace.cluster.etcd import Etcd
from tailrace.cluster.membership import Membership
from tailrace.cluster.metadata import BrokerInfo, Keys, read_brokers

from .conftest import TTL_S, wait_until


def test_a_registration_is_json_under_the_brokers_lease_and_is_kept_past_its_ttl(etcd, cluster_name, make_member):
    m = make_member(1, rack="r1")
    kv = etcd.get(f"/tailrace/{cluster_name}/brokers/1")
    assert kv is not None and kv.lease == m.lease
    body = json.loads(kv.value)
    assert body["id"] == 1 and body["endpoints"] == ["tcp://127.0.0.1:9001"] and body["rack"] == "r1"
    assert abs(body["started"] - time.time()) < 10
    time.sleep(TTL_S * 2)  # the keep-alives hold it past two TTLs
    assert etcd.get(m.key) is not None and not m.fenced
    assert read_brokers(etcd, Keys(cluster_name)) == {1: BrokerInfo(**body)}


def test_a_registration_whose_keepalives_stop_expires_with_its_lease(etcd, make_member):
    m = make_member(2)
    m.close(revoke=False)  # what a crashed broker leaves: a key and a lease nobody renews
    assert etcd.get(m.key) is not None
    assert wait_until(lambda: etcd.get(m.key) is None, TTL_S + 4)


def test_a_second_broker_with_a_live_id_is_refused_and_takes_it_once_the_first_is_gone(etcd, make_member):
    first = make_member(3)
    second = make_member(3, register=False)
    with pytest.raises(BrokerIdInUse, match="id=3"):
        second.register()
    first.close(revoke=False)
    second.register(wait_s=TTL_S + 4)  # waits for the first one's lease to expire
    assert etcd.get(second.key).lease == second.lease != first.lease


def test_a_revoked_lease_fences_the_broker_and_calls_back_once(etcd, make_member):
    called = []
    m = make_member(4, on_fenced=called.append)
    assert not m.fenced
    etcd.revoke(m.lease)  # an operator, or etcd expiring it while we were paused
    assert wait_until(lambda: m.fenced, TTL_S + 1)
    assert wait_until(lambda: called, 1.0)
    assert len(called) == 1 and "gone" in called[0]
    assert etcd.get(m.key) is None
    lease = m.reregister()
    assert not m.fenced and etcd.get(m.key).lease == lease


def test_a_broker_that_cannot_reach_etcd_fences_itself_at_its_renewal_deadline(own_etcd_server, cluster_name):
    # a request timeout longer than the TTL: the keep-alive thread is stuck in a request that etcd
    # never answers when the deadline passes, and the fence must not wait for it
    etcd = Etcd(own_etcd_server.endpoint, timeout_s=TTL_S + 1.0)
    fenced_at = []
    m = Membership(etcd, cluster_name, BrokerInfo(id=5, endpoints=["tcp://127.0.0.1:9005"]), ttl_s=TTL_S,
                   on_fenced=lambda reason: fenced_at.append((time.monotonic(), reason)))
    m.register()
    try:
        time.sleep(1.0)  # at least one keep-alive went through
        own_etcd_server.pause()  # etcd hangs: nobody tells the broker anything
        paused = time.monotonic()
        assert wait_until(lambda: m.fenced, TTL_S + 1.0, interval_s=0.01)
        # fenced no later than TTL after the pause (the last renewal was before it)
        assert time.monotonic() - paused <= TTL_S + 0.1
        assert wait_until(lambda: fenced_at, TTL_S + 2.0)  # the callback: once the stuck request gives up
        assert "within its ttl" in fenced_at[0][1]
    finally:
        own_etcd_server.resume()
        m.close(revoke=True)


def test_fenced_stays_true_until_reregistered_even_when_etcd_answers_again(own_etcd_server, cluster_name):
    etcd = Etcd(own_etcd_server.endpoint, timeout_s=0.5)
    m = Membership(etcd, cluster_name, BrokerInfo(id=6, endpoints=[]), ttl_s=TTL_S)
    m.register()
    try:
        own_etcd_server.pause()
        assert wait_until(lambda: m.fenced, TTL_S + 1.0)
        own_etcd_server.resume()
        time.sleep(1.0)
        assert m.fenced
        m.reregister(wait_s=TTL_S + 4)
        assert not m.fenced and etcd.get(m.key).lease == m.lease
    finally:
        m.close(revoke=True)


def test_a_renewal_answered_after_the_deadline_does_not_lift_the_fence(etcd, cluster_name):
    # the keep-alive is sent before the deadline and etcd renews the lease, but the answer comes
    # back after the deadline (a slow link, a loaded host): whoever looked at `fenced` meanwhile
    # saw True and may have let go of what we led, so it stays True until reregister()
    real = etcd.keepalive
    slow, answered = [], []

    def keepalive(lease):
        deadline = m._deadline  # our own clock's deadline when this renewal is sent
        ttl = real(lease)
        if slow:
            time.sleep(max(0.0, deadline + 0.2 - time.monotonic()))  # answered just after it
            answered.append(ttl)
        return ttl

    etcd.keepalive = keepalive
    reasons = []
    m = Membership(etcd, cluster_name, BrokerInfo(id=7, endpoints=[]), ttl_s=TTL_S, on_fenced=reasons.append)
    m.register()
    try:
        slow.append(True)
        assert wait_until(lambda: m.fenced, TTL_S + 1.0, interval_s=0.01)
        assert wait_until(lambda: answered, TTL_S + 2.0)
        assert answered[0] > 0  # etcd did renew it, until after now by the sender's clock
        assert m.fenced and wait_until(lambda: reasons, 1.0) and "within its ttl" in reasons[0]
        time.sleep(0.5)
        assert m.fenced
    finally:
        m.close(revoke=True)
