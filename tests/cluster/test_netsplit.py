"""Network cuts (issue 34's fault test, its network half): three brokers, each in a network
namespace this test makes, on a bridge with etcd; the test cuts one broker off from the other
brokers but not from etcd, and off from etcd but not from the others, under an idempotent
acks=all producer and a consumer, then heals the cut and checks what tests/cluster/
test_failover.py checks (``check``: nothing acknowledged lost or doubled, replicas identical, no
consumer saw a record the final log lacks).

The namespaces: ``ip netns add``, a veth pair each, a bridge in the test's own namespace holding
etcd's address and the clients' route (all of it on this machine, gone at teardown). A cut is a
blackhole route in the namespaces on both sides (iproute2 only: no iptables needed): packets to
the other side are dropped, TCP connections stall, as a switch that fails. Needs root and
``ip``; skipped with the reason otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailrace.bench.launcher import Broker, free_port
from tailrace.broker import settings as settings_mod
from tailrace.client.admin import Admin
from tailrace.cluster.etcd import Etcd
from tailrace.cluster.etcd_server import EtcdServer
from tailrace.cluster.metadata import Keys, read_controller

from .conftest import TTL_S, wait_until
from .test_failover import TOPIC, Load, assignment, check


def _ip(*args: str, ns: str | None = None, check_: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=check_, timeout=30)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.231-10.240.x.0 no route of this machine covers."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    used = [ipaddress.ip_network(w, strict=False) for line in routes.splitlines() for w in line.split()[:2]
            if "/" in w or w.count(".") == 3]
    for a in range(231, 241):
        for b in range(0, 250, 7):
            net = ipaddress.ip_network(f"10.{a}.{b}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return net
    raise RuntimeError("no free 10.x subnet")


class Hosts:
    """``n`` network namespaces on one bridge: host i at ``ips[i]``, the bridge (etcd, the test's
    clients) at ``gateway``."""

    def __init__(self, n: int):
        tag = f"{os.getpid() % 100000}"
        net = _free_subnet()
        hosts = list(net.hosts())
        self.gateway = str(hosts[0])
        self.ips = [str(hosts[10 + i]) for i in range(n)]
        self.prefix = net.prefixlen
        self.bridge = f"trbr{tag}"
        self.ns = [f"tr{tag}h{i}" for i in range(n)]
        self.made: list[str] = []

    def up(self) -> "Hosts":
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append("bridge")
        _ip("addr", "add", f"{self.gateway}/{self.prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, ip) in enumerate(zip(self.ns, self.ips)):
            _ip("netns", "add", ns)
            self.made.append(ns)
            outer, inner = f"{self.bridge}v{i}", f"{self.bridge}p{i}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            _ip("addr", "add", f"{ip}/{self.prefix}", "dev", inner, ns=ns)
            _ip("link", "set", inner, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        return self

    def block(self, i: int, address: str) -> None:
        _ip("route", "add", "blackhole", f"{address}/32", ns=self.ns[i])

    def unblock(self, i: int, address: str) -> None:
        _ip("route", "del", "blackhole", f"{address}/32", ns=self.ns[i], check_=False)

    def cut(self, i: int, j: int) -> None:
        self.block(i, self.ips[j])
        self.block(j, self.ips[i])

    def heal(self, i: int, j: int) -> None:
        self.unblock(i, self.ips[j])
        self.unblock(j, self.ips[i])

    def down(self) -> None:
        for ns in self.ns:
            if ns in self.made:
                _ip("netns", "del", ns, check_=False)  # its veth end goes with it
        if "bridge" in self.made:
            _ip("link", "del", self.bridge, check_=False)


class NsBroker(Broker):
    """A broker (bench/launcher.py's) run inside a network namespace, bound to its address
    (``--insecure``: a bind off loopback without auth, here a namespace only this test reaches)."""

    def __init__(self, data_dir: Path, ns: str, ip: str, **settings):
        self.data_dir = Path(data_dir)
        self.ns = ns
        self.port = free_port()
        self.bootstrap = f"tcp://{ip}:{self.port}"
        settings.setdefault("metrics_bind", f"{ip}:{free_port()}")
        self.settings = settings_mod.from_env(env={}, data_dir=str(self.data_dir.resolve()), bind=self.bootstrap,
                                              workers=1, insecure=1, **settings)
        self.proc = None
        self.client = {}

    def spawn(self, *extra: str, stdout=None) -> subprocess.Popen:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "serve.out", "ab") as log:  # `ip netns exec` execs the broker: one pid
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-m", "tailrace", "serve",
                                          "--data-dir", str(self.data_dir), *extra],
                                         env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        return self.proc


class NsCluster:
    """tests/cluster/harness.py's ``Cluster`` over namespaced brokers (what ``check`` uses)."""

    def __init__(self, root: Path, hosts: Hosts, etcd: EtcdServer, **settings):
        self.hosts = hosts
        self.keys = Keys(f"ns{os.getpid()}")
        self.etcd = Etcd(etcd.endpoint, timeout_s=2.0)
        self.brokers = [NsBroker(root / f"broker{i}", ns, ip, cluster=etcd.endpoint, broker_id=i,
                                 cluster_ttl_s=TTL_S, cluster_name=self.keys.cluster, segment_bytes=8 << 20,
                                 shm_budget_bytes=512 << 20, **settings)
                        for i, (ns, ip) in enumerate(zip(hosts.ns, hosts.ips))]

    def start(self) -> "NsCluster":
        for b in self.brokers:
            b.spawn()
        for b in self.brokers:
            b.wait_ready(90)
        assert wait_until(lambda: self.controller() is not None, 20), "no controller"
        return self

    def bootstrap(self, i: int) -> str:
        return self.brokers[i].bootstrap

    def status(self, i: int) -> dict:
        with Admin(self.brokers[i].bootstrap, timeout_ms=3000) as a:
            return a.status()

    def controller(self):
        return read_controller(self.etcd, self.keys)

    def stop(self) -> None:
        for b in self.brokers:
            try:
                b.stop(60)
            finally:
                b.cleanup_shm()


@pytest.fixture
def netsplit_cluster(tmp_path):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    hosts = Hosts(3)
    try:
        hosts.up()
    except (subprocess.CalledProcessError, OSError) as exc:
        hosts.down()
        pytest.skip(f"cannot make network namespaces here: {getattr(exc, 'stderr', exc)}")
    etcd = EtcdServer(tmp_path / "etcd", fsync=False, host=hosts.gateway)
    made = []
    try:
        etcd.start()

        def make(**settings) -> NsCluster:
            c = NsCluster(tmp_path, hosts, etcd, **settings)
            made.append(c)
            return c.start()
        yield make
    finally:
        for c in made:
            c.stop()
        etcd.stop()
        hosts.down()


def start_load(c: NsCluster):
    with Admin(c.bootstrap(0)) as adm:
        adm.create_topic(TOPIC, 1, replication_factor=3)
    leader = assignment(c).leader
    ctl = c.controller()[0]
    stays = ctl if ctl != leader else next(b for b in range(3) if b != leader)
    return leader, Load(c.bootstrap(stays)).start()


def test_a_leader_cut_from_its_followers_then_from_etcd_stops_acknowledging_is_replaced_and_loses_nothing(
        netsplit_cluster):
    """Two cuts in a row on one cluster: the leader off from its followers but not from etcd (it
    stays leader, its ISR shrinks to itself, acks=all stops), healed; then the same broker off from
    etcd (and the clients' bridge) but not from its peers (its lease ends: replaced, fenced), healed."""
    c = netsplit_cluster(replica_lag_time_max_ms=1500)
    leader, load = start_load(c)
    others = [b for b in range(3) if b != leader]
    try:
        assert wait_until(lambda: load.acked() >= 1000, 60), (load.acked(), load.errors)
        for o in others:
            c.hosts.cut(leader, o)
        try:
            # still registered: no election; its followers cannot copy, so the ISR shrinks to the
            # leader alone and acks=all stops (min.insync.replicas 2): retried, never acknowledged
            assert wait_until(lambda: assignment(c).isr == [leader], 20), assignment(c)
            assert assignment(c).leader == leader and assignment(c).leader_epoch == 0
            time.sleep(0.5)  # replies already on their way
            before = load.acked()
            time.sleep(1.5)
            assert load.acked() == before, "acknowledged with acks=all while the ISR was the leader alone"
        finally:
            for o in others:
                c.hosts.heal(leader, o)
        assert wait_until(lambda: sorted(assignment(c).isr) == [0, 1, 2], 30), assignment(c)
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 300, 30), "acks did not resume after the heal"

        c.hosts.block(leader, c.hosts.gateway)  # etcd (and the clients' side) unreachable from it
        cut_at = time.monotonic()
        try:
            assert wait_until(lambda: assignment(c).leader not in (leader, -1), TTL_S + 15), assignment(c)
            acked = load.acked()
            assert wait_until(lambda: load.acked() >= acked + 300, 30), "no acknowledgements from the new leader"
            took = time.monotonic() - cut_at
        finally:
            c.hosts.unblock(leader, c.hosts.gateway)
        assert wait_until(lambda: sorted(assignment(c).isr) == [0, 1, 2], 40), assignment(c)
        acked = load.acked()
        assert wait_until(lambda: load.acked() >= acked + 300, 30)
    finally:
        load.finish()
    figures = check(c, load)
    print(f"leader cut from etcd: replaced and 300 acks on within {took:.1f} s; {figures}")
