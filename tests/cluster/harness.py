"""Real clusters for tests: brokers (each ``tailrace serve`` with its own data directory, ports
and supervisord) on one etcd, all on loopback, stopped by pid."""

from __future__ import annotations

import os
import shutil
import signal
import time

import zmq.auth

from tailrace.bench.launcher import Broker
from tailrace.client.admin import Admin
from tailrace.cluster.etcd import Etcd
from tailrace.cluster.metadata import Keys, read_assignments, read_controller


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05):
    """Poll ``predicate`` until it returns something true (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


TTL_S = 3  # the brokers' lease: short, so the faults a test makes are seen in seconds


class Cluster:
    def __init__(self, root, etcd_endpoint: str, name: str, n: int, **settings):
        self.etcd_endpoint, self.name = etcd_endpoint, name
        self.brokers = [Broker(root / f"broker{i}", workers=1, cluster=etcd_endpoint, broker_id=i, cluster_ttl_s=TTL_S,
                               cluster_name=name, segment_bytes=8 << 20, shm_budget_bytes=512 << 20, **settings)
                        for i in range(n)]
        self.etcd = Etcd(etcd_endpoint, timeout_s=2.0)
        self.keys = Keys(name)
        if settings.get("auth") == "curve":
            self._share_keys(root)

    def _share_keys(self, root) -> None:
        """--auth curve: one server key pair for every broker (copied, as an operator would), and
        an ``admin`` client allowed in the cluster's allow-list in etcd: every broker's ``client``."""
        from tailrace.broker.auth import auth_dir, generate_keys, server_keys
        from tailrace.cluster.access import ClusterAccess

        first = auth_dir(str(self.brokers[0].data_dir))
        server_keys(str(self.brokers[0].data_dir))
        for b in self.brokers[1:]:
            os.makedirs(auth_dir(str(b.data_dir)), mode=0o700, exist_ok=True)
            for name in ("server.key", "server.key_secret"):
                shutil.copy2(os.path.join(first, name), auth_dir(str(b.data_dir)))
        public, secret = generate_keys(str(root / "admin-keys"), "admin")
        ClusterAccess(self.etcd, self.name).allow("admin", zmq.auth.load_certificate(public)[0])
        self.server_key = os.path.join(first, "server.key")
        for b in self.brokers:
            b.client = {"key_file": secret, "server_key": self.server_key}

    def start(self) -> "Cluster":
        for b in self.brokers:
            b.spawn()
        for b in self.brokers:
            b.wait_ready(90)
        assert wait_until(lambda: self.status(0).get("cluster", {}).get("controller", -1) >= 0, 20), "no controller"
        return self

    def status(self, i: int) -> dict:
        with Admin(self.brokers[i].bootstrap, timeout_ms=3000, **self.brokers[i].client) as a:
            return a.status()

    def bootstrap(self, i: int) -> str:
        return self.brokers[i].bootstrap

    def controller(self) -> tuple[int, int] | None:
        return read_controller(self.etcd, self.keys)

    def leaders(self, topic: str) -> dict[int, int]:
        current, _ = read_assignments(self.etcd, self.keys, topic)
        return {p: a.leader for (_t, p), (a, _rev) in current.items()}

    def stop(self) -> None:
        for b in self.brokers:  # all told at once, then each waited for (by pid)
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGTERM)
        for b in self.brokers:
            if b.proc is not None:
                b.stop()
        for b in self.brokers:
            b.cleanup_shm()


def cluster_fixture(tmp_path, request):
    made: list[Cluster] = []

    def make(etcd_endpoint: str, n: int = 3, **settings) -> Cluster:
        name = f"t{os.getpid()}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
        c = Cluster(tmp_path, etcd_endpoint, name, n, **settings)
        made.append(c)
        return c.start()

    try:
        yield make
    finally:
        for c in made:
            c.stop()


