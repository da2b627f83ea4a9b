"""Quotas: produce and fetch bytes per second per principal (``tailrace quota``), with ``--auth curve``.

Kafka's user quotas, on tailrace's processes. Rules live in ``<data-dir>/auth/quotas.json``,
written atomically by ``tailrace quota set|remove`` on the broker's host and re-read by the
workers when the file changes (as ``acls.json``, broker/acl.py). A rule gives one principal (or
``*``: every principal without a rule of its own, each on its own budget) a
``producer_byte_rate`` and a ``consumer_byte_rate`` (Kafka's names; 0 = unlimited).

Where it is enforced: every produce and fetch is served by exactly one worker, whichever way it
came (through the router, which passes the principal it authenticated along with the request,
straight to the owner, or over a same-host Unix socket). Each worker counts a principal's bytes
in its own block of the shared tally (shm/tally.py) and reads the principal's total over every
worker, so a client spread over partitions on several workers is held to one budget.

How a client is slowed (never disconnected, nothing dropped): the bytes of a request are stored
or read as usual, and its reply is held back. Each worker keeps, per principal, a theoretical
arrival time (GCRA, the token bucket as a clock) moved on by the principal's *global* new bytes
divided by its rate; a worker that first meets a principal starts from the latest time any
worker stored for it in the tally, so a burst spread over several workers is paid once. The
reply waits until that time (at most ``MAX_HOLD_MS``), and says how long it was held in
``throttle_ms`` (Kafka's throttle time). Unused credit is kept for at most
``BURST_S``. A produce with ``acks=0`` has no reply to hold: it is counted, not slowed.
"""

from __future__ import annotations

import json
import os
import pwd

import msgspec

from tailrace.shm.tally import TableFull, Tally, key_of

from . import datadir
from .auth import BROKER_PREFIX, ROUTER_PRINCIPAL

QUOTA_FILE = datadir.QUOTA_FILE
DEFAULT = "*"
PRODUCE, FETCH = 0, 1  # tally counters
BURST_S = 1.0  # credit an idle principal may save up, in seconds of its rate
MAX_HOLD_MS = 2_000  # below the clients' request timeouts: debt beyond it waits for the next request


class Quota(msgspec.Struct, frozen=True):
    principal: str
    producer_byte_rate: int = 0  # bytes/s; 0 = unlimited
    consumer_byte_rate: int = 0


class QuotaFile(msgspec.Struct):
    quotas: list[Quota] = []


def quota_path(data_dir: str) -> str:
    return os.path.join(data_dir, datadir.AUTH_DIR, QUOTA_FILE)


def read_quotas(data_dir: str) -> list[Quota]:
    try:
        with open(quota_path(data_dir), "rb") as f:
            return decode_quotas(f.read())
    except FileNotFoundError:
        return []


def _write(data_dir: str, quotas: list[Quota]) -> None:
    os.makedirs(os.path.dirname(quota_path(data_dir)), mode=0o700, exist_ok=True)
    body = encode_quotas(quotas)
    path = quota_path(data_dir)  # private as its directory (0600 in a 0700 one), whatever the operator's umask
    datadir.write_atomic(path, body, mode=datadir.file_mode_in(os.path.dirname(path)))


def with_quota(quotas: list[Quota], quota: Quota) -> list[Quota]:
    """``quotas`` with ``quota.principal``'s rule replaced by ``quota`` (raises ValueError for a bad
    one). The file here and a cluster's etcd key (cluster/access.py) share it."""
    if not quota.principal:
        raise ValueError("a quota needs a principal (or * for the default)")
    if quota.producer_byte_rate < 0 or quota.consumer_byte_rate < 0:
        raise ValueError("byte rates are bytes per second, >= 0 (0 = unlimited)")
    return [*(q for q in quotas if q.principal != quota.principal), quota]


def without_quota(quotas: list[Quota], principal: str) -> list[Quota] | None:
    """``quotas`` without ``principal``'s rule; None if it has none."""
    return [q for q in quotas if q.principal != principal] if any(q.principal == principal for q in quotas) else None


def encode_quotas(quotas: list[Quota]) -> bytes:
    return json.dumps({"quotas": [msgspec.to_builtins(q) for q in quotas]}, indent=1).encode()


def decode_quotas(body: bytes) -> list[Quota]:
    return msgspec.json.decode(body, type=QuotaFile).quotas


def write_quotas(data_dir: str, quotas: list[Quota]) -> None:
    _write(data_dir, quotas)


def set_quota(data_dir: str, quota: Quota) -> Quota:
    """Set ``quota.principal``'s rates (replacing its rule). Returns what was there before."""
    quotas = read_quotas(data_dir)
    new = with_quota(quotas, quota)
    old = next((q for q in quotas if q.principal == quota.principal), Quota(quota.principal))
    _write(data_dir, new)
    return old


def remove_quota(data_dir: str, principal: str) -> bool:
    quotas = without_quota(read_quotas(data_dir), principal)
    if quotas is not None:
        _write(data_dir, quotas)
    return quotas is not None


def local_principal(uid: int) -> str:
    """The principal of a same-host Unix-socket client: ``unix:`` and its user's name (or uid)."""
    try:
        return f"unix:{pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"unix:{uid}"


class Throttle:
    """One worker's side of the quotas: ``charge`` counts a request's bytes and says how long
    to hold its reply. Costs nothing for a principal without a quota (one dict lookup)."""

    def __init__(self, data_dir: str, instance: str, writer: int):
        self.path = quota_path(data_dir)
        self.data_dir = data_dir
        self.instance, self.writer = instance, writer
        self.rates: dict[str, tuple[int, int]] = {}
        self._seen = None
        self.tally: Tally | None = None  # made at the first quota (no region for brokers without)
        self.clock: dict[tuple[int, int], list] = {}  # (key, counter) -> [theoretical arrival s, total seen]
        self.throttled = 0  # replies held back
        self.refresh()

    def refresh(self) -> None:
        sig = datadir.file_signature(self.path)
        if sig == self._seen:
            return
        try:
            quotas = read_quotas(self.data_dir)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            quotas = []  # an unreadable file limits no one (authorization is acls.json's)
        self.rates = {q.principal: (q.producer_byte_rate, q.consumer_byte_rate) for q in quotas}
        self._seen = sig

    def rate(self, principal: str | None, which: int) -> int:
        if not self.rates or principal is None or principal == ROUTER_PRINCIPAL or principal.startswith(BROKER_PREFIX):
            return 0
        r = self.rates.get(principal) or self.rates.get(DEFAULT)
        return r[which] if r else 0

    def charge(self, principal: str | None, which: int, nbytes: int, now: float) -> int:
        """Count ``nbytes`` of ``principal`` (``PRODUCE`` or ``FETCH``) at time ``now``
        (monotonic s); return the ms its reply should be held (0: none)."""
        q = self.rate(principal, which)
        if q <= 0:
            return 0
        tally = self._tally()
        key = key_of(principal)
        try:
            tally.add(key, which, nbytes)
        except TableFull:
            return 0  # more principals with quotas than cells: counted nowhere, held never (documented)
        total = tally.total(key, which)
        clock = self.clock.get((key, which))
        if clock is None:
            # first sight here: the bytes counted before now are in the clock other workers have
            # moved on (their latest mark), ours from now on are counted from the total
            clock = self.clock[(key, which)] = [max(now, tally.latest(key, which) / 1e6), total - nbytes]
        tat = max(clock[0], now - BURST_S) + (total - clock[1]) / q
        clock[0], clock[1] = tat, total
        tally.mark(key, which, int(tat * 1e6))
        hold_ms = int((tat - now) * 1000)
        if hold_ms <= 0:
            return 0
        self.throttled += 1
        return min(hold_ms, MAX_HOLD_MS)

    def allowance(self, principal: str | None, which: int, now: float) -> int | None:
        """Bytes ``principal`` may take now without a hold over ``MAX_HOLD_MS`` (None: no
        quota). A fetch reads at most this much (at least one batch), so its reply is never
        held longer than the cap and the debt is always paid."""
        q = self.rate(principal, which)
        if q <= 0:
            return None
        key = key_of(principal)
        clock = self.clock.get((key, which))
        if clock is not None:
            tat = clock[0]
        else:
            tat = max(now, self._tally().latest(key, which) / 1e6)
        return max(0, int((now + MAX_HOLD_MS / 1000 - tat) * q))

    def _tally(self) -> Tally:
        if self.tally is None:  # made at the first quota: no region for brokers without
            self.tally = Tally(self.instance, self.writer)
        return self.tally

    def close(self) -> None:
        if self.tally is not None:
            self.tally.close()
            self.tally = None
