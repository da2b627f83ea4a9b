"""The system under test, behind one small interface that workloads.py drives.

A system starts a server configured for a workload (or uses one already running), creates
topics, names the pids whose CPU is measured, and stops what it started. ``gen`` names the
module whose load-generator functions (produce, single, consume, e2e_produce, e2e_consume)
speak its protocol. The peers (Redis, NATS) implement the same interface in peers.py.

Broker settings chosen here (tailrace): rings are sized per topic by the workload (create_topic
``ring_bytes``), so one broker configuration serves every workload: a 4 GiB shared-memory budget
(rings are only mapped for topics that exist; 8 x 128 MiB hot rings or 1,000 x 1 MiB rings fit)
and the default 4,096 partition slots. On a broker given by ``--bootstrap`` (someone's own) every
topic a workload made is deleted when the workload ends, as a started broker is removed: a full
run makes rings of 32-128 MiB each, and left behind they held the budget of that broker. ``max_batch_bytes`` is 512 KiB (default 1 MiB) because a
ring must hold two of the largest batch and the partitions workload uses 1 MiB rings; every
batch the workloads send is below 420 KB.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tailrace.client.admin import Admin
from tailrace.client.producer import Producer

GiB = 1 << 30
MiB = 1 << 20
BROKER_SETTINGS = {"shm_budget_bytes": 4 * GiB, "max_batch_bytes": 512 * 1024}


CLIENTS = {"blocking": "tailrace.bench.gen_tailrace", "async": "tailrace.bench.gen_aio"}


class TailraceSystem:
    name = "tailrace"
    gen = "tailrace.bench.gen_tailrace"
    same_host = True  # latency workloads also run over the same-host transport (Unix sockets, rings)

    def __init__(self, bootstrap: str | None = None, workers: int = 2, data_root: str | None = None,
                 settings: dict | None = None, client: str = "blocking"):
        self.bootstrap = bootstrap  # a running broker: nothing is started or stopped
        # client="async": the single-message and e2e generators use the asyncio client
        # (gen_aio.py; its other workloads are gen_tailrace's), and their cases end in /async
        if client not in CLIENTS:
            raise ValueError(f"client {client!r}: one of {', '.join(CLIENTS)}")
        self.gen = CLIENTS[client]
        self.case_suffix = "" if client == "blocking" else f"/{client}"
        self.workers = workers
        self.data_root = data_root
        self.settings = {**BROKER_SETTINGS, **(settings or {})}
        self.broker = None
        self.data_dir: str | None = None
        self.made: list[str] = []  # topics made on a --bootstrap broker, deleted at stop()

    @property
    def endpoint(self) -> str:
        return self.bootstrap or self.broker.bootstrap

    @property
    def metrics_url(self) -> str | None:
        """The broker's Prometheus endpoint (None for a broker given by --bootstrap)."""
        return self.broker.metrics_url if self.broker is not None else None

    def start(self, workload: str) -> None:
        if self.bootstrap:
            return
        from tailrace.bench.launcher import Broker  # the test harness runs the broker exactly as `tailrace serve`

        self.data_dir = tempfile.mkdtemp(prefix=f"tailrace-bench-{workload}-", dir=self.data_root)
        self.broker = Broker(Path(self.data_dir), workers=self.workers, **self.settings)
        try:
            self.broker.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.made:
            self._delete_made()
        if self.broker is not None:
            try:
                self.broker.stop()
            finally:
                self.broker.cleanup_shm()
                self.broker = None
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def pids(self) -> dict[str, int]:
        return self.broker.pids() if self.broker is not None else {}

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0) -> None:
        with Admin(self.endpoint, timeout_ms=60_000) as admin:
            admin.create_topic(name, partitions, ring_bytes)
        if self.bootstrap:
            self.made.append(name)

    def _delete_made(self) -> None:
        """Delete the topics this run made on a --bootstrap broker (one that is gone already: fine)."""
        from tailrace.client.errors import UnknownTopicError

        with Admin(self.endpoint, timeout_ms=60_000) as admin:
            while self.made:
                try:
                    admin.delete_topic(self.made[-1])
                except UnknownTopicError:
                    pass
                self.made.pop()

    def warm(self, topic: str, partitions: int) -> int:
        """One record into every partition (workers adopt partitions on first use); returns count."""
        with Producer(self.endpoint, acks="memory") as prod:
            for p in range(partitions):
                prod.send(topic, b"warm", partition=p)
            prod.flush()
        return partitions

    def describe(self) -> dict:
        return {"workers": self.workers, "settings": dict(self.settings), "external": bool(self.bootstrap)}
