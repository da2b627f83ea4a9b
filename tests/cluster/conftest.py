"""A real etcd for the cluster tests: one per session (each test in a cluster of its own name),
or one of its own for a test that stops, pauses or restarts it. Every etcd started here is stopped
by its pid at teardown, and dies with the test process if that is killed (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import itertools
import time

import pytest

from tailrace.cluster.etcd import Etcd
from tailrace.cluster.etcd_server import EtcdServer
from tailrace.cluster.membership import Membership
from tailrace.cluster.metadata import BrokerInfo

from .harness import wait_until  # noqa: F401 - the cluster tests take it from here

TTL_S = 2  # etcd's smallest lease TTL at its default election timeout (1.5 x 1 s, rounded up)

_names = itertools.count()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data", fsync=False).start()
    yield server
    server.stop()
    assert server.proc.poll() is not None


@pytest.fixture
def own_etcd_server(tmp_path):
    """An etcd this test alone uses (it may stop, pause or restart it)."""
    server = EtcdServer(tmp_path / "etcd", fsync=False).start()
    yield server
    server.stop()
    assert server.proc.poll() is not None


@pytest.fixture
def etcd(etcd_server):
    return Etcd(etcd_server.endpoint, timeout_s=2.0)


@pytest.fixture
def new_client(etcd_server):
    """Factory: a client of its own (what another broker process would have)."""
    return lambda: Etcd(etcd_server.endpoint, timeout_s=2.0)


@pytest.fixture
def cluster_name():
    return f"t{next(_names)}-{time.monotonic_ns()}"


@pytest.fixture
def make_member(etcd, cluster_name):
    """Factory: make_member(broker_id, **kw) -> registered Membership (TTL 2 s); all closed at
    teardown."""
    made: list[Membership] = []

    def make(broker_id: int, rack: str | None = None, register: bool = True, client: Etcd | None = None,
             **kw) -> Membership:
        info = BrokerInfo(id=broker_id, endpoints=[f"tcp://127.0.0.1:{9000 + broker_id}"], rack=rack)
        m = Membership(client or etcd, cluster_name, info, ttl_s=kw.pop("ttl_s", TTL_S), **kw)
        made.append(m)
        if register:
            m.register()
        return m

    yield make
    for m in made:
        m.close(revoke=True)
