"""The one module that talks to etcd: ranges, puts, deletes, leases, transactions and watches.

Nothing else in tailrace imports the etcd client (an import-linter contract in pyproject.toml
says so, and tests/unit/test_layers.py runs it). The client is etcd3gw: it speaks etcd v3's
HTTP/JSON gateway (``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/lease/*``, ``/v3/watch``) over
``requests``, synchronously, and is maintained; ``etcd3`` is not, and breaks on protobuf >= 4.

Some facts about etcd's v3 API that this module depends on:

- Every change bumps one cluster-wide *revision*. A key carries ``create_revision`` (the revision
  that created it; 0 in a compare means "absent"), ``mod_revision`` (its last change) and
  ``version`` (changes since creation). A range answers with the store's revision in its header.
- A transaction is ``if all(compares) then success ops else failure ops``, atomically, at one
  revision. It does not say which compare failed: a failure op that reads the key in question
  is how a caller finds out (the controller does that for its own key).
- A lease is granted with a TTL (etcd raises TTLs below its minimum, 1.5 x the election timeout:
  2 s at the defaults) and kept alive by refreshes; when it expires or is revoked, every key put
  under it is deleted, each with a DELETE event. A keep-alive answers TTL <= 0 for a lease that
  is gone.
- The gateway encodes keys and values in base64 and 64-bit integers as strings, and leaves out
  fields at their default (``succeeded: false``, an event's ``type: PUT``, a zero revision).
- A watch starting at revision R delivers every change from R on, unless R was compacted away:
  then the watch is cancelled with ``compact_revision`` and the watcher must read afresh.

What this means for us: every value here is JSON text under a ``/tailrace/<cluster>/`` key
(cluster/keys.py); a reader that lists then watches starts the watch at the list's revision + 1;
a watch that loses its connection resumes at the revision after the last one it delivered, so no
event is lost or given twice (etcd3gw's own watcher drops the headers and compaction notices that
this needs, and never says its stream ended: ``Watch`` below reads the gateway's stream itself,
on etcd3gw's session).

Thread-safety: an ``Etcd`` may be shared by threads (one lock around each request, short
timeouts); each ``Watch`` has its own connection and thread.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import etcd3gw
import requests
from etcd3gw import exceptions as gw_errors
from etcd3gw.lease import Lease

from .errors import EtcdError, EtcdUnavailable

API_PATH = "/v3/"  # etcd >= 3.4's gateway path (no discovery round trip per client)
DEFAULT_TIMEOUT_S = 2.0


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else bytes(data)).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range end that makes ``[prefix, end)`` every key starting with ``prefix``."""
    b = prefix.encode()
    assert b and b[-1] < 0xFF, f"prefix={prefix!r} must end in a byte below 0xff"
    return (b[:-1] + bytes([b[-1] + 1])).decode()


def parse_endpoints(spec: str | Sequence[str]) -> list[tuple[str, int]]:
    """``etcd://h1:2379,h2:2379`` (``tailrace serve --cluster``), ``http://h:p`` or a list of
    ``host:port`` -> [(host, port)]."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        item = item.strip()
        for scheme in ("etcd://", "http://"):
            item = item.removeprefix(scheme)
        host, sep, port = item.rstrip("/").rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"etcd endpoint={item!r} is not host:port (spec={spec!r})")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError(f"no etcd endpoint in spec={spec!r}")
    return out


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_gateway(cls, kv: dict) -> "KeyValue":
        return cls(key=_unb64(kv.get("key")).decode(), value=_unb64(kv.get("value")),
                   create_revision=int(kv.get("create_revision", 0)), mod_revision=int(kv.get("mod_revision", 0)),
                   version=int(kv.get("version", 0)), lease=int(kv.get("lease", 0)))

    def json(self) -> Any:
        return json.loads(self.value)


# --- transaction parts: plain gateway dicts, built here so no caller spells the wire form ---

def create_revision_is(key: str, revision: int) -> dict:
    """Compare: the key's create revision is ``revision`` (0: the key is absent)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": int(revision)}


def absent(key: str) -> dict:
    return create_revision_is(key, 0)


def mod_revision_is(key: str, revision: int) -> dict:
    """Compare: the key was last changed at ``revision`` (compare-and-swap on what was read)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": int(revision)}


def value_is(key: str, value: str | bytes) -> dict:
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict:
    req: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        req["lease"] = int(lease)
    return {"request_put": req}


def delete_op(key: str, prefix: bool = False) -> dict:
    req = {"key": _b64(key)}
    if prefix:
        req["range_end"] = _b64(prefix_end(key))
    return {"request_delete_range": req}


def get_op(key: str, prefix: bool = False) -> dict:
    req = {"key": _b64(key)}
    if prefix:
        req["range_end"] = _b64(prefix_end(key))
    return {"request_range": req}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction (its own, if it wrote)
    responses: list  # one per op of the branch taken: list[KeyValue] for a get, else the raw dict

    def kvs(self, i: int) -> list[KeyValue]:
        return self.responses[i]


class Etcd:
    """A client of one etcd cluster (any of ``endpoints`` answers; the next is tried when one
    cannot be reached)."""

    def __init__(self, endpoints: str | Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S):
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self._clients = [etcd3gw.client(host=h, port=p, timeout=timeout_s, api_path=API_PATH)
                         for h, p in self.endpoints]
        self._current = 0
        self._lock = threading.Lock()

    @property
    def client(self) -> etcd3gw.Etcd3Client:
        return self._clients[self._current]

    def _call(self, fn: Callable[[etcd3gw.Etcd3Client], Any], idempotent: bool) -> Any:
        """``fn(client)``; on a connection failure the next endpoint, for ``idempotent`` calls
        only (a write whose request may have arrived is not sent twice: the caller reads and
        decides)."""
        with self._lock:
            for _ in range(len(self._clients)):
                try:
                    return fn(self.client)
                except (gw_errors.ConnectionFailedError, gw_errors.ConnectionTimeoutError) as e:
                    self._current = (self._current + 1) % len(self._clients)
                    last = e
                    if not idempotent:
                        break
                except gw_errors.Etcd3Exception as e:
                    raise EtcdError(f"etcd refused the request: {e.detail_text or e}") from e
            raise EtcdUnavailable(f"etcd did not answer (endpoints={self.endpoints}): {last}") from last

    def _post(self, path: str, body: dict, idempotent: bool) -> dict:
        return self._call(lambda c: c.post(c.get_url(path), json=body), idempotent)

    # --- keys ---

    def get(self, key: str) -> KeyValue | None:
        kvs, _ = self._range({"key": _b64(key)})
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the revision they were read at: a
        watch from that revision + 1 misses nothing."""
        return self._range({"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)), "sort_order": "ASCEND",
                            "sort_target": "KEY"})

    def cluster_id(self) -> str:
        """etcd's own cluster id (every response header carries it): a new or rebuilt etcd has another."""
        r = self._post("/kv/range", {"key": _b64("\0"), "limit": 1}, idempotent=True)
        return str(r["header"]["cluster_id"])

    def _range(self, body: dict) -> tuple[list[KeyValue], int]:
        r = self._post("/kv/range", body, idempotent=True)
        return [KeyValue.from_gateway(kv) for kv in r.get("kvs", [])], int(r["header"]["revision"])

    def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Put ``key``; the revision it was written at."""
        r = self._post("/kv/put", put_op(key, value, lease)["request_put"], idempotent=False)
        return int(r["header"]["revision"])

    def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (every key under it with ``prefix``); how many were deleted."""
        r = self._post("/kv/deleterange", delete_op(key, prefix)["request_delete_range"], idempotent=False)
        return int(r.get("deleted", 0))

    def txn(self, compare: Sequence[dict], success: Sequence[dict], failure: Sequence[dict] = ()) -> TxnResult:
        """One transaction: if every ``compare`` holds, ``success``'s ops, else ``failure``'s."""
        body = {"compare": list(compare), "success": list(success), "failure": list(failure)}
        r = self._call(lambda c: c.transaction(body), idempotent=False)
        responses = []
        for item in r.get("responses", []):
            if "response_range" in item:
                responses.append([KeyValue.from_gateway(kv) for kv in item["response_range"].get("kvs", [])])
            else:
                responses.append(item)
        return TxnResult(succeeded=bool(r.get("succeeded", False)), revision=int(r["header"]["revision"]),
                         responses=responses)

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (a watch from an older one is cancelled)."""
        self._post("/kv/compaction", {"revision": int(revision), "physical": True}, idempotent=True)

    # --- leases ---

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        return self._call(lambda c: c.lease(int(ttl_s)).id, idempotent=False)

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; the TTL it now has in seconds, <= 0 if it is gone (expired or
        revoked: every key under it has been deleted)."""
        return self._call(lambda c: Lease(lease, c).refresh(), idempotent=True)

    def time_to_live(self, lease: int) -> int:
        """Seconds ``lease`` has left; <= 0 if it is gone."""
        return self._call(lambda c: Lease(lease, c).ttl(), idempotent=True)

    def revoke(self, lease: int) -> bool:
        """Revoke ``lease`` (its keys are deleted at once); False if it was gone already."""
        try:
            return self._call(lambda c: Lease(lease, c).revoke(), idempotent=True)
        except EtcdError as e:
            if "not found" in str(e):
                return False
            raise

    # --- watches ---

    def watch_prefix(self, prefix: str, start_revision: int, retry_s: float = 0.5) -> "Watch":
        """Every change under ``prefix`` from ``start_revision`` on (list with ``get_prefix``,
        then watch from its revision + 1)."""
        return Watch(self.endpoints, prefix, start_revision, timeout_s=self.timeout_s, retry_s=retry_s)


@dataclass(frozen=True)
class Event:
    type: str  # "PUT" or "DELETE"
    kv: KeyValue  # for a DELETE: the key and the deleting revision (mod_revision), no value


@dataclass
class WatchBatch:
    events: list[Event] = field(default_factory=list)
    compacted: int = 0  # > 0: the watch was cancelled because its next revision was compacted; read afresh


class Watch:
    """A watch of a key prefix on its own thread and connection, resumed after a lost connection
    at the revision after the last one delivered.

    ``get(timeout_s)`` returns the next ``WatchBatch`` (events in revision order, each delivered
    once) or None. After a batch with ``compacted`` the watch has stopped. ``next_revision`` is
    where it would resume; ``reconnects`` counts streams opened after the first (for tests).
    """

    def __init__(self, endpoints, prefix: str, start_revision: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retry_s: float = 0.5):
        assert start_revision >= 1, f"start_revision={start_revision} (list first, watch from its revision + 1)"
        self.prefix = prefix
        self.next_revision = int(start_revision)
        self.reconnects = 0
        self.connected = threading.Event()  # set while a stream is open and etcd said "created"
        self._endpoints = list(endpoints)
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._batches: queue.Queue[WatchBatch] = queue.Queue()
        self._stop = threading.Event()
        self._sock_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch {prefix}", daemon=True)
        self._thread.start()

    def get(self, timeout_s: float | None = None) -> WatchBatch | None:
        try:
            return self._batches.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def stop(self) -> None:
        self._stop.set()
        self._shutdown_stream()
        self._thread.join(timeout=5)

    def drop_connection(self) -> None:
        """Close the current stream as a network failure would (the watch resumes by itself)."""
        self._shutdown_stream()

    def _shutdown_stream(self) -> None:
        with self._sock_lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked in recv
                except OSError:
                    pass

    def _run(self) -> None:
        endpoint = 0
        first = True
        while not self._stop.is_set():
            host, port = self._endpoints[endpoint % len(self._endpoints)]
            if not first:
                self.reconnects += 1
            first = False
            try:
                if self._stream(host, port):
                    return  # compacted: the watcher must read afresh
            except (requests.RequestException, OSError, ValueError, KeyError):
                pass
            self.connected.clear()
            endpoint += 1
            self._stop.wait(self._retry_s)

    def _stream(self, host: str, port: int) -> bool:
        """One stream from ``next_revision``, until it ends; True if it ended in compaction."""
        client = etcd3gw.client(host=host, port=port, timeout=self._timeout_s, api_path=API_PATH)
        body = {"create_request": {"key": _b64(self.prefix), "range_end": _b64(prefix_end(self.prefix)),
                                   "start_revision": self.next_revision, "progress_notify": True}}
        # connect timeout only: an idle watch is silent for as long as nothing changes
        resp = client.session.post(client.get_url("/watch"), json=body, stream=True,
                                   timeout=(self._timeout_s, None))
        try:
            with self._sock_lock:
                self._sock = socket.socket(fileno=_dup_fd(resp))
            if self._stop.is_set():
                return False
            for line in resp.iter_lines(chunk_size=None):
                if not line.strip():
                    continue
                result = json.loads(line).get("result") or {}
                if result.get("created"):
                    self.connected.set()
                if int(result.get("compact_revision", 0)) > 0:
                    self._batches.put(WatchBatch(compacted=int(result["compact_revision"])))
                    return True
                if result.get("canceled"):
                    raise ValueError(f"etcd cancelled the watch: {result.get('cancel_reason', '')}")
                events = [Event(e.get("type", "PUT"), KeyValue.from_gateway(e["kv"])) for e in result.get("events", [])]
                if events:
                    self.next_revision = events[-1].kv.mod_revision + 1
                    self._batches.put(WatchBatch(events=events))
                elif not result.get("created") and "header" in result:
                    # a progress notification: every change up to the header's revision was sent
                    self.next_revision = max(self.next_revision, int(result["header"]["revision"]) + 1)
            return False
        finally:
            with self._sock_lock:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
            resp.close()
            client.session.close()


def _dup_fd(resp: requests.Response) -> int:
    """A duplicate of the stream's socket descriptor: shutting it down ends the read on the
    original too (shutdown acts on the socket, not the descriptor)."""
    return os.dup(resp.raw.fileno())

