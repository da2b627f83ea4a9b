"""A broker's registration in the cluster: its key under a lease, kept alive, and its fence.

A broker registers ``/tailrace/<c>/brokers/<id>`` (metadata.BrokerInfo) by a create-if-absent
transaction under a lease of its own, so two live brokers never share an id, and a broker that
dies (or stops renewing) disappears from the cluster when the lease expires: the controller sees
the DELETE and moves or fences its partitions.

The fence. A broker whose lease is gone must stop acting on what it led (REPLICATION.md 2.2.8):
another controller or leader may be acting already. It cannot learn of the expiry from etcd when
etcd is what it cannot reach, so it fences itself on its own clock: ``fenced`` is true once a
keep-alive said the lease is gone, or once the *renewal deadline* passed, the time the lease
would expire counted from the moment before the last successful keep-alive was sent (etcd
counts its TTL from when it received it, later). Both are one-way until ``reregister()``, which
takes a new lease and a new registration; the caller then reads its assignments again. One-way
includes a renewal sent before the deadline and answered after it: once anyone has seen ``fenced``
true it stays true (whoever saw it may have let go of what we led).

Thread-safety: one keep-alive thread per registration writes the deadline and the fence; any
thread may read ``fenced``. ``on_fenced(reason)`` is called once, on the keep-alive thread.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from .errors import BrokerIdInUse, ClusterError
from .etcd import Etcd, absent, get_op, put_op
from .metadata import BrokerInfo, Keys, encode

DEFAULT_TTL_S = 10  # REPLICATION.md 2.2.1: about 10 s, renewed every TTL/3


class Membership:
    def __init__(self, etcd: Etcd, cluster: str, info: BrokerInfo, ttl_s: int = DEFAULT_TTL_S,
                 on_fenced: Callable[[str], None] | None = None):
        self.etcd = etcd
        self.keys = Keys(cluster)
        self.info = info
        self.ttl_s = int(ttl_s)
        self.on_fenced = on_fenced
        self.lease = 0  # the lease our key lives under (0: not registered)
        self.fence_reason: str | None = None
        self._deadline = 0.0  # monotonic time our lease expires at the latest, by our own clock
        self._expired = False  # a reader saw the deadline pass: latched, as the fence is
        self._lock = threading.Lock()  # a renewal answered late never moves a deadline already passed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return self.keys.broker(self.info.id)

    @property
    def fenced(self) -> bool:
        if self.fence_reason is not None or self._expired:
            return True
        if time.monotonic() < self._deadline:
            return False
        with self._lock:  # the deadline passed: latch it unless a renewal moved it meanwhile
            if time.monotonic() >= self._deadline:
                self._expired = True
            return self._expired

    def register(self, wait_s: float = 0.0) -> int:
        """Take a lease and create our key under it, waiting up to ``wait_s`` for a previous
        registration of the same id to expire (a restarted broker's old lease); start the
        keep-alives. Returns the lease id; raises BrokerIdInUse."""
        assert self._thread is None, f"broker={self.info.id} is registered already (close or reregister)"
        self.info.started = time.time()
        sent = time.monotonic()
        lease = self.etcd.grant(self.ttl_s)
        deadline = sent + wait_s
        while True:
            r = self.etcd.txn([absent(self.key)], [put_op(self.key, encode(self.info), lease=lease)],
                              [get_op(self.key)])
            if r.succeeded:
                break
            if time.monotonic() >= deadline:
                self.etcd.revoke(lease)
                holder = r.kvs(0)[0].lease if r.kvs(0) else "?"
                raise BrokerIdInUse(f"broker id={self.info.id} is registered under another live lease={holder} "
                                    f"(key={self.key}); waited {wait_s} s")
            time.sleep(0.2)
            sent = time.monotonic()  # our lease must outlive the wait for the other one
            if self.etcd.keepalive(lease) <= 0:
                lease = self.etcd.grant(self.ttl_s)
        self.lease = lease
        self.fence_reason = None
        self._expired = False
        self._deadline = sent + self.ttl_s
        self._stop.clear()
        self._thread = threading.Thread(target=self._keepalive, name=f"lease broker {self.info.id}", daemon=True)
        self._thread.start()
        return lease

    def reregister(self, wait_s: float = 0.0) -> int:
        """After a fence: a new lease and registration (the old lease revoked if it still lives)."""
        self.close(revoke=True)
        return self.register(wait_s)

    def close(self, revoke: bool = True) -> None:
        """Stop the keep-alives; with ``revoke`` also end the lease (our key goes at once),
        without it the key stays until the lease expires (what a crash looks like)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.etcd.timeout_s + 1)
            self._thread = None
        if revoke and self.lease:
            try:
                self.etcd.revoke(self.lease)
            except ClusterError:
                pass  # unreachable etcd: the lease expires by itself
        self._fence("closed")

    def _fence(self, reason: str) -> None:
        if self.fence_reason is not None:
            return
        self.fence_reason = reason
        if self.on_fenced is not None and reason != "closed":
            self.on_fenced(reason)

    def _keepalive(self) -> None:
        interval = max(self.ttl_s / 3, 0.1)
        while not self._stop.wait(min(interval, max(0.0, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                self._fence(f"no keep-alive of lease={self.lease} succeeded within its ttl={self.ttl_s} s")
                return
            sent = time.monotonic()
            try:
                ttl = self.etcd.keepalive(self.lease)
            except ClusterError:
                continue  # etcd unreachable: try again until the deadline
            if ttl <= 0:
                self._fence(f"lease={self.lease} is gone (expired or revoked): our registration was deleted")
                return
            with self._lock:
                # sent in time but answered after the deadline: whoever looked meanwhile saw us
                # fenced and may have let go of what we led, so the fence stays
                late = self._expired or time.monotonic() >= self._deadline
                if not late:
                    self._deadline = sent + ttl
            if late:
                self._fence(f"no keep-alive of lease={self.lease} succeeded within its ttl={self.ttl_s} s")
                return
