"""A cluster with --auth curve: one allow-list, one set of ACL rules and quotas for all its brokers,
kept in etcd and written with the same commands as on a single host (``--cluster``), and brokers
that let each other in (group commits copied between them under ACLs that name no broker).

Three real brokers on a real etcd, on loopback; every process stopped by pid at teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tailrace.broker import settings as settings_mod
from tailrace.broker.acl import read_rules
from tailrace.broker.auth import generate_keys
from tailrace.broker.quota import read_quotas
from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer
from tailrace.client import protocol as P
from tailrace.client import share_protocol as S
from tailrace.client.errors import AuthenticationFailedError, BrokerUnavailableError, NotAuthorizedError, NotReadyError
from tailrace.client.producer import Producer
from tailrace.client.share import ShareConsumer
from tailrace.cluster.errors import ClusterKeyMismatch

from .conftest import wait_until
from .harness import cluster_fixture


@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


def tailrace(c, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "tailrace", *args, "--cluster", c.etcd_endpoint, "--cluster-name", c.name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def test_one_allow_list_acls_and_quotas_for_every_broker_from_etcd(make_cluster, etcd_server, tmp_path):
    c = make_cluster(etcd_server.endpoint, auth="curve")
    admin = c.brokers[0].client
    generate_keys(str(tmp_path / "alice"), "alice")
    generate_keys(str(tmp_path / "mallory"), "mallory")
    alice = {"key_file": str(tmp_path / "alice" / "alice.key_secret"), "server_key": c.server_key}
    mallory = {**alice, "key_file": str(tmp_path / "mallory" / "mallory.key_secret")}
    assert "allowed: alice" in tailrace(c, "keys", "allow", "alice", str(tmp_path / "alice" / "alice.key"))
    tailrace(c, "acl", "add", "admin", "--topic", "*", "--ops", "create,describe,admin,alter,delete,produce,consume,group")
    tailrace(c, "acl", "add", "alice", "--prefix", "a", "--ops", "produce,consume")
    tailrace(c, "acl", "add", "alice", "--topic", "g1", "--ops", "group")
    tailrace(c, "acl", "add", "alice", "--topic", "s1", "--ops", "share")
    for b in c.brokers:  # each broker mirrored the cluster's rules into its own data directory
        assert wait_until(lambda: len(read_rules(str(b.data_dir))) == 4, 10), b.data_dir
    time.sleep(1.0)  # and its router and workers re-read them within a heartbeat (0.5 s)
    with Admin(c.bootstrap(1), **admin) as a:
        a.create_topic("a1", 6)
        a.create_topic("b1", 3)
    assert sorted(set(c.leaders("a1").values())) == [0, 1, 2]

    # alice, through broker 0, produces to every partition of a1: the two brokers it did not
    # bootstrap from let her in (the cluster's allow-list) and let her write (its ACLs)
    with Producer(c.bootstrap(0), acks="durable", **alice) as p:
        for i in range(600):
            p.send("a1", b"a%d" % i, partition=i % 6)
        assert p.flush(30_000) == 600 and not p.errors
        p.send("b1", b"nope", partition=0)
        with pytest.raises(NotAuthorizedError):
            p.flush(10_000)
    # a group across brokers: its coordinator copies each commit to the other two, who take it
    # from "broker/<id>" though no rule names a broker
    with Consumer(c.bootstrap(2), group="g1", auto_offset_reset="earliest", max_wait_ms=100, **alice) as cons:
        cons.subscribe(["a1"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 600 and time.monotonic() < deadline:
            got += cons.poll(300)
        assert len(got) == 600
        cons.commit()
    with Admin(c.bootstrap(0), **admin) as a:
        assert sum(a.committed("g1").values()) == 600
    time.sleep(0.5)
    logs = [(b.data_dir / "logs" / "router.log").read_text() for b in c.brokers]
    assert not any("was not stored by" in t or "copy not confirmed" in t for t in logs), "a group copy was refused"

    # a share group across brokers: alice's member, given broker 1, takes records from all three
    # leaders; each leader copies its share state to the other two, who take it from "broker/<id>"
    def altered():
        with Admin(c.bootstrap(1), **alice) as a:
            try:
                return a.alter_share_group("s1", {"share.auto.offset.reset": "earliest"})
            except NotReadyError:  # a moment after a start: each broker pulls the others' share state first
                return None
    assert wait_until(altered, 10, 0.2)
    with ShareConsumer(c.bootstrap(1), group="s1", topics="a1", timeout_ms=5000, **alice) as sc:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 600 and time.monotonic() < deadline:
            records = sc.poll(300)
            sc.acknowledge(records)
            got += records
        assert len({r.value for r in got}) == 600 and {r.partition for r in got} == set(range(6))
        assert not sc.commit_sync() and not sc.failed
    logs = [(b.data_dir / "logs" / "router.log").read_text() for b in c.brokers]
    assert not any("share state copy was not stored" in t or "share state copy not confirmed" in t for t in logs), \
        "a share state copy was refused"

    # rules in etcd that cannot be read leave the last mirrored ones in force (fail static)
    good = c.etcd.get(c.keys.acls).value
    c.etcd.put(c.keys.acls, b"{not json")
    assert wait_until(lambda: all("cannot be read" in (b.data_dir / "logs" / "router.log").read_text() for b in c.brokers), 10)
    assert all(len(read_rules(str(b.data_dir))) == 4 for b in c.brokers)
    c.etcd.put(c.keys.acls, good)

    # a key the cluster does not know gets into no broker
    for i in range(3):
        with Admin(c.bootstrap(i), **mallory) as a, pytest.raises((AuthenticationFailedError, BrokerUnavailableError)):
            a.list_topics()

    # a quota set once holds on the partitions of every broker
    tailrace(c, "quota", "set", "alice", "--producer-byte-rate", "100000")
    for b in c.brokers:
        assert wait_until(lambda: [q.producer_byte_rate for q in read_quotas(str(b.data_dir))] == [100000], 10)
    time.sleep(1.0)  # the workers re-read quotas.json every half second
    with Producer(c.bootstrap(0), acks="memory", linger_ms=1, **alice) as p:
        for i in range(600):
            p.send("a1", b"q" * 1000, partition=i % 6)
        assert p.flush(30_000) == 600 and not p.errors
        assert p.throttle_ms > 0

    # revoked once: refused by every broker from its next request
    with Producer(c.bootstrap(0), acks="memory", linger_ms=0, **alice) as p:
        for part in range(6):
            p.send("a1", b"before", partition=part)
        assert p.flush(10_000) == 6
        assert "revoked: alice" in tailrace(c, "keys", "revoke", "alice")
        assert "0 allowed keys" not in tailrace(c, "keys", "list")  # admin stays
        time.sleep(2.0)  # mirrored, then re-read by the routers and workers within a heartbeat
        for part in range(6):
            p.send("a1", b"after", partition=part)
        with pytest.raises(NotAuthorizedError):
            p.flush(10_000)

    # the brokers' own forms of the group ops are refused to a client: a forged copy with a high
    # version would shadow the real ones, and the copies of every group are not a client's to read
    # (nor the share state: SHARE_STATE_COPY, even for a key that may administer)
    from tailrace.client.connection import Connection
    from tailrace.client.security import curve_keys
    conn = Connection(c.bootstrap(0), keys=curve_keys(**admin))
    try:
        forged = P.encode(P.OffsetCommitRequest([("a1", 0, 0)], replica=10**9))
        with pytest.raises(NotAuthorizedError, match="brokers"):
            conn.request(P.Op.OFFSET_COMMIT, "g1", header=forged)
        with pytest.raises(NotAuthorizedError, match="brokers"):
            conn.request(P.Op.LIST_GROUPS, "", header=P.encode(P.ListGroupsRequest(replicas=True)))
        with pytest.raises(NotAuthorizedError, match="brokers"):
            conn.request(P.Op.SHARE_STATE_COPY, "", header=P.encode(S.ShareStateCopy(pull=True)))
    finally:
        conn.close()
    with Admin(c.bootstrap(1), **admin) as a:
        assert sum(a.committed("g1").values()) == 600

    # the local commands refuse a cluster broker's data directory: its files are the mirror
    r = subprocess.run([sys.executable, "-m", "tailrace", "acl", "list", "--data-dir", str(c.brokers[0].data_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cluster" in r.stderr, r.stderr

    # a broker with another server key (or none) does not join
    from tailrace.router.cluster_agent import ClusterAgent
    for auth in ("curve", "none"):
        s = settings_mod.from_env(env={}, data_dir=str(tmp_path / f"stranger-{auth}"), bind="tcp://127.0.0.1:1",
                                  cluster=c.etcd_endpoint, broker_id=7, cluster_name=c.name, cluster_ttl_s=3, auth=auth)
        os.makedirs(s.data_dir, exist_ok=True)
        with pytest.raises(ClusterKeyMismatch, match="server key|auth"):
            ClusterAgent(s).start()
    assert sorted(c.status(0)["cluster"]["brokers"]) == ["0", "1", "2"]
    # a member's data directory is its cluster's for good: another cluster name is refused before
    # it registers (joining would delete the topics that cluster does not know)
    from tailrace.cluster.errors import ClusterIdentityMismatch
    s = settings_mod.from_env(env={}, data_dir=str(c.brokers[2].data_dir), bind="tcp://127.0.0.1:1", cluster=c.etcd_endpoint,
                              broker_id=2, cluster_name=c.name + "-typo", cluster_ttl_s=3, auth="curve")
    with pytest.raises(ClusterIdentityMismatch, match="belongs to cluster"):
        ClusterAgent(s).start()
