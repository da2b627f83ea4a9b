"""The worker process: hosts partition actors, serves produce, fetch and list-offsets.

Socket: a ROUTER bound at ``ipc://<ipc_dir>/worker-<id>.ipc``. Two kinds of peer send to it:

- the router, identity ``b"router"``: ``[b"router", client_id, assign, routing, header, body?]``
  where ``assign`` is 12 bytes (slot u32, owner epoch u64) telling which partition this worker
  owns for this request; the reply goes back as ``[b"router", client_id, routing, header, body?]``;
- a client addressing the worker directly: ``[client_id, routing, header, body?]``; served only
  for partitions this worker already owns, otherwise NOT_OWNER.

With ``--auth curve`` the router appends the principal it authenticated to ``assign`` (12 bytes,
then the name), so quotas (broker/quota.py) count a client's bytes here whichever way they came;
a reply over its principal's quota is held back (``held``) and says so in ``throttle_ms``.

Durable acks wait for the flusher: the worker kicks it (rings its doorbell with ``KICK_DURABLE``,
shm/doorbell.py) and releases the waiters when the flusher rings this worker's bell after a sync
and the row's ``durable_offset`` covers them.

Modules: ``Worker`` here holds the envelope check and the dispatch, ``WorkerProcess`` the sockets
and the loop. The handlers live in their own modules, each over a narrow context built here:
produce.py, fetch.py (long polls, the disk-reader hand-off), offsets.py (list offsets, seek by
time), watch.py, adopt.py (hosting partitions; ADOPT), ping.py; their shared pieces (replies,
traffic counters, the turn's state) in context.py; the disk-reader thread in diskreader.py; one
partition's offsets, index and journal reads in persistence/log.py (``PartitionLog``).
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time

import posix_ipc
import zmq

from tailrace.broker import acl, auth, datadir, quota
from tailrace.broker.heap import HeapTrim
from tailrace.broker.envelope import Envelope, refusal
from tailrace.broker.reply_port import ReplyPort
from tailrace.broker.stats import Histogram, StatsFile, label_key
from tailrace.client import ops
from tailrace.client import protocol as P
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.client import unixwire
from tailrace.shm import layout
from tailrace.shm.doorbell import KICK_ADOPTED, KICK_DATA, KICK_DURABLE, Doorbell, Ringer
from tailrace.shm.ring import ControlTable, LayoutMismatch
from tailrace.shm.rows import HeaderView
from tailrace.persistence import log as log_mod
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.recovery import data_dir_id

from . import adopt, fetch, fetch_multi, offsets, ping, produce, replication, watch
from .context import Outbox, Traffic, Turn
from .diskreader import READS_ENDPOINT, UNLINKED_SWEEP_S, DiskReader
from .produce import KICK_MIN_BYTES
from .unix_server import PortMux, UnixServer

log = logging.getLogger("tailrace.worker")

EXIT_OK = 0
EXIT_NO_BROKER = 4
DRAIN_MAX = 512
KICK_INTERVAL_S = 0.002
CATALOG_CHECK_S = 0.25  # how often the catalog is checked for deleted topics (one stat)
# the routing-header checks of every request (broker/envelope.py, over client/ops.py's SPEC): the
# router's ops are UNKNOWN_OP here, and so are PING and ADOPT unless the router sent them
ENVELOPE = Envelope("worker")
# op -> handler, one per SPEC row a worker serves; each takes (its context, ident, assign, topic,
# partition, frames from the routing header on, principal, reply)
HANDLERS = {P.Op.PRODUCE: produce.produce, P.Op.PRODUCE_MULTI: produce.produce_multi, P.Op.FETCH: fetch.fetch,
            P.Op.FETCH_MULTI: fetch_multi.fetch_multi, P.Op.LIST_OFFSETS: offsets.list_offsets,
            P.Op.WATCH: watch.watch, P.Op.PING: ping.ping, P.Op.ADOPT: adopt.adopt,
            P.Op.REPLICA_APPEND: produce.replica_append, P.Op.LEADER_AND_ISR: replication.leader_and_isr}
_SERVED = {row.op for row in ops.SPEC if row.served in ops.AT_WORKER}
MANY = frozenset(row.op for row in ops.SPEC if row.many)  # the assign frame: a count, then an entry per partition
assert set(HANDLERS) == _SERVED, f"worker handlers {sorted(HANDLERS)} != ops a worker serves {sorted(_SERVED)} (client/ops.py)"


def _op_name(op: int) -> str:
    try:
        return P.Op(op).name
    except ValueError:
        return "UNKNOWN"


def _code_name(code: int) -> str:
    try:
        return P.ErrorCode(code).name
    except ValueError:
        return str(code)


class Worker:
    """Envelope and dispatch over the handlers' contexts. ``port``, ``ringer``, ``reader`` and
    ``throttle`` are the process's (``WorkerProcess``); a probe may leave them out."""

    def __init__(self, s: settings_mod.Settings, worker_id: int, table: ControlTable, port=None,
                 ringer: Ringer | None = None, reader: DiskReader | None = None, throttle: quota.Throttle | None = None):
        self.s, self.worker_id, self.table = s, worker_id, table
        self.catalog = Catalog(s.data_dir)
        self.journal = JournalReader(s.data_dir, s.segment_bytes)
        self.out = Outbox(port)
        self.traffic = Traffic()
        self.turn = Turn()
        self.owned = owned = adopt.Owned(s, worker_id, table, self.catalog, self.journal, self.out, self.turn, self.traffic)
        self.watchers = watch.Watchers(ringer, len(table.rows))
        self.reader = reader  # cold reads off the loop (None: read inline)
        self.throttle = throttle
        parked = fetch_multi.Parked()  # FETCH_MULTI's waits: read by the fetches, refused in part when leadership ends
        self.produce_ctx = produce.ProduceContext(owned, HeaderView(table.header_words), s.max_batch_bytes, self.out,
                                                  self.traffic, self.turn, table, worker_id % layout.WAKE_FLUSHER,
                                                  self.watchers, throttle, parked)
        self.fetch_ctx = fetch.FetchContext(owned, self.out, self.traffic, self.turn, throttle, reader, parked)
        self.offsets_ctx = offsets.OffsetsContext(self.catalog, table, s.data_dir, self.journal, s.instance)
        contexts = {P.Op.PRODUCE: self.produce_ctx, P.Op.PRODUCE_MULTI: self.produce_ctx, P.Op.FETCH: self.fetch_ctx,
                    P.Op.FETCH_MULTI: self.fetch_ctx, P.Op.LIST_OFFSETS: self.offsets_ctx,
                    P.Op.REPLICA_APPEND: self.produce_ctx,
                    P.Op.LEADER_AND_ISR: replication.ReplicationContext(owned, self.turn),
                    P.Op.WATCH: self.watchers, P.Op.ADOPT: owned,
                    P.Op.PING: ping.PingContext(worker_id, time.time_ns(), owned, table, self.traffic)}
        self.handlers = {op: (fn, contexts[op]) for op, fn in HANDLERS.items()}  # op -> (handler, its context)
        # for the metrics exporter (broker/stats.py): a dict add per request, never per record
        self.stats = StatsFile(s.ipc_path(), datadir.worker_role(worker_id))
        self.durations: dict[int, Histogram] = {}  # op -> service time of its requests
        self.current_op = -1  # the op of the request being handled, for its duration
        self.principal: str | None = None  # with --auth curve: who sent the request being handled

    @property
    def port(self):
        return self.out.port

    @port.setter
    def port(self, port) -> None:
        self.out.port = port

    @property
    def actors(self) -> dict:
        return self.owned.actors

    def stats_parts(self) -> tuple[dict, dict, dict]:
        """Counters, gauges and histograms for this worker's snapshot (broker/stats.py)."""
        w, fetched = self.worker_id, self.traffic.fetched
        requests = {label_key(w, _op_name(op), _code_name(code)): n for (op, code), n in self.out.replies.items()}
        durations = {label_key(w, _op_name(op)): h.snapshot() for op, h in self.durations.items()}
        return ({"worker_requests": requests,
                 "partition_records_fetched": {str(slot): v[0] for slot, v in fetched.items()},
                 "partition_bytes_fetched": {str(slot): v[1] for slot, v in fetched.items()},
                 "ring_pages_given_back_bytes": {str(w): self.owned.keeper.released_bytes}},
                {"ring_held_bytes": {str(w): self.owned.keeper.total}}, {"worker_request_duration_seconds": durations})

    # --- envelope and dispatch -------------------------------------------------------------
    def handle(self, frames: list[bytes]) -> None:
        t0 = time.perf_counter_ns()
        self.current_op = -1
        try:
            self._handle(frames)
        finally:
            self.principal = None
            op = self.current_op
            if op != P.Op.PING:
                h = self.durations.get(op)
                if h is None:
                    h = self.durations[op] = Histogram()
                h.observe_ns(time.perf_counter_ns() - t0)

    def _handle(self, frames: list[bytes]) -> None:
        if frames[0] == P.ROUTER_IDENTITY and len(frames) >= 4:
            ident, assign, rest = frames[:2], frames[2], frames[3:]
        else:
            ident, assign, rest = frames[:1], None, frames[1:]
        try:
            version, op, _code, partition, request_id, topic = P.unpack_routing(rest[0] if rest else b"")
        except struct.error:
            self.out.count(-1, P.ErrorCode.MALFORMED)
            self.out.port.send([*ident, P.pack_routing(0, -1, 0, b"", P.ErrorCode.MALFORMED), P.encode(
                P.ErrorReply(f"first frame must be a {P.ROUTING_BYTES}-byte routing header"))])
            return
        self.current_op = op
        if assign is not None:  # one 12-byte entry (a many-partition op: a count, then one per partition), then who the client is
            start, size = 0, P.ASSIGN.size
            if op in MANY and len(assign) >= P.ASSIGN_COUNT.size:
                start = P.ASSIGN_COUNT.size
                size = start + P.ASSIGN.size * P.ASSIGN_COUNT.unpack_from(assign)[0]
            if len(assign) > size:  # the router's word for who the client is (see the top)
                self.principal = bytes(assign[size:]).decode("utf-8", "replace")
            assign = assign[start:size]

        def reply(code, body=None, extra=()):
            if op != P.Op.PING:  # the router's heartbeats are not counted
                self.out.count(op, code)
            head = P.encode(body) if body is not None else P.EMPTY_MAP
            self.out.port.send([*ident, P.pack_routing(op, partition, request_id, P.echo_topic(topic), code), head, *extra])
        try:
            why = ENVELOPE.check(version, op, topic, len(rest), assign is not None)
            if why is not None:
                return reply(why[0], P.ErrorReply(why[1]))
            fn, ctx = self.handlers[op]  # the envelope let through only ops served here
            fn(ctx, ident, assign, topic, partition, rest, self.principal, reply)
        except P.DECODE_ERRORS as exc:
            reply(P.ErrorCode.MALFORMED, P.ErrorReply(f"undecodable header: {type(exc).__name__}: {exc}"))
        except Exception as exc:  # a bug must not take the worker down with it
            log.exception("request op=%s failed", op)
            reply(P.ErrorCode.INTERNAL, P.ErrorReply(f"internal error: {type(exc).__name__}: {exc}"))

    # --- after each turn -------------------------------------------------------------------
    def wake_late(self, synced: bool) -> None:
        """End of a loop turn: wake the ring readers for what was appended after the turn's
        first append. That one woke them at once, ahead of its ack and of anything else the
        turn does (the ack can wake the producer onto this CPU first, and the reader would
        wait behind both); a reader woken then may have looked before the rest was published,
        so it is woken again for the rest."""
        late = self.turn.late
        if late:
            self.table.wake_readers(self.worker_id % layout.WAKE_FLUSHER)
        if self.watchers.bells and (late or synced):
            self.watchers.ring(late, synced)
        late.clear()

    def release_durable(self) -> None:
        produce.release_durable(self.produce_ctx)

    def service_parked(self, now_ns: int, synced: bool = False) -> int:
        one = fetch.service_parked(self.fetch_ctx, now_ns, synced)
        many = fetch_multi.service_parked(self.fetch_ctx, now_ns, synced)  # after FETCH's: it keeps its slots parked
        return many if one < 0 else one if many < 0 else min(one, many)

    def release_held(self, now_ns: int) -> int:
        return self.out.release_held(now_ns)

    def unwatch(self, ident: bytes) -> None:
        self.watchers.unwatch(ident)

    def close(self) -> None:
        self.owned.close()
        self.journal.close()
        self.offsets_ctx.close()


def _ignore(_frames) -> None:
    pass


class KickPolicy:
    """When a worker rings the flusher's doorbell, after each loop turn.

    - ``KICK_ADOPTED`` first, when an actor was made here: the flusher looks at active rows only.
    - ``KICK_DURABLE`` at once for a durable waiter: its latency is the ack's latency.
    - ``KICK_DATA`` for plain data only once KICK_MIN_BYTES wait (or a ring was full), and at most
      every KICK_INTERVAL_S: the flusher stages a trickle on its own timer, and a kick per loop
      turn woke it once per message at low rates.
    A bell that cannot be rung (the flusher is restarting) is tried again next turn."""

    def __init__(self, ringer: Ringer, flusher_bell: str):
        self.ringer, self.flusher_bell = ringer, flusher_bell
        self.last_kick = 0.0  # monotonic seconds of the last data or durable kick

    def after_turn(self, owned: adopt.Owned, turn: Turn, now: float) -> None:
        if owned.adopted_new and self.ringer.ring(self.flusher_bell, KICK_ADOPTED):
            owned.adopted_new = False
        if turn.durable_added or (turn.unkicked_bytes >= KICK_MIN_BYTES and now - self.last_kick > KICK_INTERVAL_S):
            if self.ringer.ring(self.flusher_bell, KICK_DURABLE if turn.durable_added else KICK_DATA):
                self.last_kick = now
                turn.unkicked_bytes = 0


def wait_for_table(s: settings_mod.Settings, timeout_s: float, stop: list) -> ControlTable | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop:
        try:
            table = ControlTable.attach(s.instance)
            # READY, and made for this data directory (not left over from one wiped at this path)
            if table.state == layout.STATE_READY and int(table.header["data_id"]) == data_dir_id(s.data_dir):
                return table
            table.close()
        except (posix_ipc.ExistentialError, LayoutMismatch):
            pass
        time.sleep(0.05)
    return None


class WorkerProcess:
    """The worker's sockets and its loop: ``do_work`` is one turn (returns the events served),
    ``stop`` answers what is parked, gives durable waiters a last chance and closes in reverse.

    Waiting on ZeroMQ sockets. Some facts about ZMQ_FD (libzmq's socket_base, zmq_getsockopt(3)):
    the fd is the socket's command mailbox, readable while commands wait, such as "a pipe that was
    empty has messages again"; any recv, send or ZMQ_EVENTS call on the socket processes those
    commands and so clears the fd. A pipe that still holds unread messages sends no new command.
    So the fd signals edges: after it fires, receive until EAGAIN, and after any send on the socket,
    ask ZMQ_EVENTS, or an arrival whose command the send took in is never seen. ``zmq_poll`` does
    those checks for every socket on every call: two passes of poll plus a getpid and a poll per
    socket, about ten system calls per wait, in a loop that waits once per message at low rates.

    What this means for us: one epoll over the ZMQ_FDs, the doorbell and the Unix server's
    listener and connections, one system call per wait. A ZeroMQ socket is drained to EAGAIN
    when its fd fires (``*_due`` keeps one that stopped at DRAIN_MAX ready for the next turn),
    and the reply socket is asked ZMQ_EVENTS at the start of a turn only if something was sent
    on it since the last look (``ReplyPort.touched``): a same-host turn makes no ZeroMQ call."""

    def __init__(self, s: settings_mod.Settings, worker_id: int, table: ControlTable):
        self.s, self.worker_id, self.table = s, worker_id, table
        self.ctx = ctx = zmq.Context()
        self.guard = None
        self.acls = None
        throttle = None
        if s.auth == "curve":  # broker/auth.py: CURVE clients only, router commands from the router's key only
            self.guard = auth.Guard(ctx, s.data_dir, auth.allow_dir_of(s), with_router=True)
            self.acls = acl.Acls(s.data_dir)  # broker/acl.py: direct clients' requests
            throttle = quota.Throttle(s.data_dir, s.instance, worker_id)  # broker/quota.py
        self.sock = sock = ctx.socket(zmq.ROUTER)
        if self.guard is not None:
            auth.make_server(sock, s.data_dir)
        ReplyPort.configure(sock)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.MAXMSGSIZE, s.max_frame_bytes)  # a larger part drops the peer, unread
        sock.bind(s.worker_endpoint(worker_id))
        self.bell = Doorbell(s.worker_bell_path(worker_id))  # the flusher rings it after every sync
        self.ringer, self.flusher_bell = Ringer(), s.flusher_bell_path()  # ... and we ring its bell to kick it
        self.reads = ctx.socket(zmq.PULL)
        self.reads.bind(READS_ENDPOINT)
        log_mod.READ_DELAY_S = s.debug_read_delay_ms / 1000
        reader = DiskReader(ctx, table.rows, s.data_dir, s.segment_bytes)
        reader.start()
        # One epoll over everything the loop waits on (see "Waiting on ZeroMQ sockets" in the
        # class docstring): the ZeroMQ sockets by their ZMQ_FD, the doorbell, and the Unix
        # server's listener and connections, which it registers here itself.
        self.ep = select.epoll()
        try:  # the same-host socket is an extra: a worker serves ZeroMQ without it
            self.unix = UnixServer(unixwire.path_of(s.worker_unix_endpoint(worker_id)), log, f"worker {worker_id}",
                                   max_message=s.max_frame_bytes, allowed_uids=s.allowed_uids(), ep=self.ep)
        except OSError as exc:
            log.warning("no Unix socket for same-host clients (%s); ZeroMQ only", exc)
            self.unix = None
        port = PortMux(ReplyPort(sock, log, f"worker {worker_id}"), self.unix)
        self.worker = worker = Worker(s, worker_id, table, port, self.ringer, reader, throttle)
        if self.unix is not None:
            self.unix.on_close = worker.unwatch
        self.sock_fd = sock.getsockopt(zmq.FD)
        self.reads_fd = self.reads.getsockopt(zmq.FD)
        self.bell_fd = self.bell.fileno()
        self.zap_fd = self.guard.zap.zap_socket.getsockopt(zmq.FD) if self.guard is not None else -1
        self.own_fds = frozenset(fd for fd in (self.sock_fd, self.reads_fd, self.bell_fd, self.zap_fd) if fd >= 0)
        for fd in self.own_fds:
            self.ep.register(fd, select.EPOLLIN)
        # ZeroMQ sockets to look at next turn without a signal from their FD (a drain that
        # stopped at DRAIN_MAX, or messages found waiting after a send): the wait does not block
        self.sock_due = self.reads_due = True
        self.zap_due = self.guard is not None
        self.last_allow_check = 0.0
        self.kicks = KickPolicy(self.ringer, self.flusher_bell)
        self.timeout_ms = 100
        self.last_fence_check = 0.0
        self.last_catalog_check = time.monotonic()
        self.heap = HeapTrim()  # freed heap given back once the worker goes quiet (broker/heap.py)
        self.heap_mark = 0  # fetched bytes at the last turn
        self.last_sweep = time.monotonic()

    def do_work(self) -> int:
        """One turn: serve requests, wake ring readers, kick the flusher, release and answer."""
        worker = self.worker
        zport = worker.port.zmq
        if zport.touched:  # a send since the last look may have taken in an arrival's signal: ask the socket
            zport.touched = False
            self.sock_due = self.sock_due or bool(P.socket_events(self.sock) & zmq.POLLIN)
        due = self.sock_due or self.reads_due or self.zap_due
        ready = self.ep.poll(0 if due else self.timeout_ms / 1000)
        fds = [fd for fd, _ev in ready]
        guard = self.guard
        if guard is not None and (self.zap_due or self.zap_fd in fds):
            guard.zap.service()  # it replies on the same socket: look again after
            self.zap_due = bool(P.socket_events(guard.zap.zap_socket) & zmq.POLLIN)
        if self.sock_due or self.sock_fd in fds:
            if guard is None:
                n = P.drain(self.sock, worker.handle, DRAIN_MAX)
            else:
                n = guard.drain(self.sock, self.handle_as, self.refuse, DRAIN_MAX)
            self.sock_due = n == DRAIN_MAX  # else it stopped at EAGAIN: the next arrival signals
        if self.unix is not None and ready:  # the Unix server's fds, after ZeroMQ's requests
            own, handle = self.own_fds, worker.handle if guard is None else self.handle_local
            for fd, ev in ready:
                if fd not in own:
                    self.unix.on_event(fd, ev, handle)
        if self.reads_due or self.reads_fd in fds:
            self.reads_due = P.drain(self.reads, _ignore, DRAIN_MAX) == DRAIN_MAX
            worker.reader.finish()
        synced = self.bell_fd in fds
        if synced:
            self.bell.drain()
        worker.wake_late(synced)
        now = time.monotonic()
        turn = worker.turn
        self.kicks.after_turn(worker.owned, turn, now)
        if turn.waiting_slots:
            worker.release_durable()
        parked = turn.parked_slots or worker.fetch_ctx.parked.waits
        next_ms = worker.service_parked(time.monotonic_ns(), synced) if parked else -1
        if worker.out.held:
            due_ms = worker.release_held(time.monotonic_ns())
            next_ms = due_ms if next_ms < 0 else min(next_ms, due_ms) if due_ms >= 0 else next_ms
        keeper = worker.owned.keeper
        moved = turn.appended or worker.traffic.totals[3] != self.heap_mark  # appended, or fetched bytes served
        self.heap_mark = worker.traffic.totals[3]
        if turn.appended:
            keeper.appended(worker.owned.actors, turn.appended, now)
        keeper.tick(worker.owned.actors, now)
        turn.appended.clear()
        self.heap.maybe(now, bool(moved))
        turn.durable_added = False
        if now - self.last_fence_check > 0.05:
            worker.owned.check_fences()
            self.last_fence_check = now
        if now - self.last_catalog_check > CATALOG_CHECK_S:
            worker.owned.check_catalog()
            self.last_catalog_check = now
        if now - self.last_sweep > UNLINKED_SWEEP_S:
            worker.journal.drop_unlinked()  # segments retention deleted: close them so their blocks go
            self.last_sweep = now
        if guard is not None and now - self.last_allow_check > 0.5:
            guard.allow.refresh()
            self.acls.refresh()
            worker.throttle.refresh()
            self.last_allow_check = now
        if worker.port.backlog:
            worker.port.flush()
        worker.stats.maybe_write(worker.stats_parts)
        timeout = 20 if turn.waiting_slots else 100  # a lost sync notice must not strand a waiter
        if worker.port.backlog:
            timeout = 2  # replies wait for room in a peer's queue
        if next_ms >= 0:
            timeout = min(timeout, max(next_ms, 1))
        self.timeout_ms = timeout
        return len(fds)

    def handle_as(self, frames: list[bytes], principal: str) -> None:
        """A message from an authenticated connection: only the router's key may speak as the
        router (assignments, ADOPT, PING), whatever identity a peer declares."""
        if frames[0] == P.ROUTER_IDENTITY:
            if principal != auth.ROUTER_PRINCIPAL:
                self.refuse(frames)
                return
        elif not self.permitted(frames, principal):  # a direct client: its rules, as the router checks them
            return
        self.worker.principal = principal
        self.worker.handle(frames)

    def handle_local(self, frames: list[bytes]) -> None:
        """A request on the same-host Unix socket (--auth curve): its principal is its user's
        (``unix:NAME``, from SO_PEERCRED at accept), under the same ACLs and quotas."""
        uid = self.unix.uid_of(frames[0])
        principal = quota.local_principal(uid) if uid is not None else "unix:?"
        if self.permitted(frames, principal):
            self.worker.principal = principal
            self.worker.handle(frames)

    def permitted(self, frames: list[bytes], principal: str) -> bool:
        """Whether ``principal``'s ACL rules allow this client request (else NOT_AUTHORIZED sent)."""
        refused = refusal(self.acls, principal, frames[:1], frames)  # broker/envelope.py, as the router checks it
        if refused is None:
            return True
        self.worker.port.send(refused)
        return False

    def refuse(self, frames: list[bytes]) -> None:
        if frames[0] == P.ROUTER_IDENTITY and len(frames) >= 4:  # [router, client, assign, routing, ...]
            self.worker.port.send(auth.refusal(frames[:2], frames[3], "router commands are taken from the router's key only"))
        else:
            self.worker.port.send(auth.refusal(frames[:1], frames[1] if len(frames) > 1 else b"",
                                               "this client's key is not in the broker's allow-list"))

    def stop(self) -> None:
        """Answer what is parked, give durable waiters a last chance, finish disk reads, close."""
        worker = self.worker
        worker.service_parked(1 << 62)
        worker.release_held(1 << 62)  # throttled replies go now: the stop must not lose them
        deadline = time.monotonic() + 2.0
        while worker.turn.waiting_slots and time.monotonic() < deadline:
            self.ringer.ring(self.flusher_bell, KICK_DURABLE)
            if self.bell.wait(0.05):
                self.bell.drain()
            worker.release_durable()
        worker.release_held(1 << 62)
        deadline = time.monotonic() + 2.0
        while worker.reader.pending and time.monotonic() < deadline:
            if self.reads.poll(50):
                P.drain(self.reads, _ignore, DRAIN_MAX)
            worker.reader.finish()
        worker.reader.stop()
        worker.release_held(1 << 62)
        worker.close()
        if worker.throttle is not None:
            worker.throttle.close()
        if self.unix is not None:
            self.unix.close()
        for sock in (self.sock, self.reads):
            sock.close(0)
        self.ep.close()
        self.bell.close()
        self.ringer.close()
        if self.guard is not None:
            self.guard.close()
        self.ctx.term()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="tailrace.actors.worker")
    ap.add_argument("--id", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s worker-{args.id} %(levelname)s %(message)s")
    s = settings_mod.from_env()
    claim = datadir.enter_program(s, datadir.worker_role(args.id), log)
    if claim is None:
        return datadir.EXIT_REFUSED
    stop: list = []
    datadir.stop_on_signals(stop)
    pid_file = s.worker_pid_path(args.id)
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    table = wait_for_table(s, 120.0, stop)
    if table is None:
        log.error("control table not ready (is the flusher running?)")
        datadir.leave_program(claim, (pid_file,))
        return EXIT_NO_BROKER
    proc = WorkerProcess(s, args.id, table)
    log.info("worker %d serving on %s", args.id, s.worker_endpoint(args.id))
    while not stop:
        proc.do_work()
    proc.stop()
    time.sleep(s.debug_stop_delay_ms / 1000)
    datadir.leave_program(claim, (pid_file, s.worker_endpoint(args.id).removeprefix("ipc://")))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
