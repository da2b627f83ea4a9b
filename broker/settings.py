"""Broker settings: one struct, read from ``TAILRACE_*`` environment variables.

``tailrace serve`` sets these variables and supervisord passes them to every program, so the
router, the workers and the flusher always agree. Each has an embedded default: data under
``./data``, loopback only.
"""

from __future__ import annotations

import functools
import hashlib
import os

import msgspec

from tailrace.client.connection import parse_bootstrap

from . import auth, datadir

METRICS_OFF = ("off", "no", "none", "0", "")
DISK_FULL_POLICIES = ("refuse", "delete_oldest")  # persistence/diskguard.py; the first is the default

MiB = 1 << 20


class Settings(msgspec.Struct, kw_only=True):
    data_dir: str = "./data"
    bind: str = "tcp://127.0.0.1:7420"
    workers: int = os.cpu_count() or 2
    ring_bytes: int = 8 * MiB  # default per-partition ring (a topic may choose its own)
    shm_budget_bytes: int = 0  # total shared memory all rings may take; 0: default_shm_budget() (half the memory)
    max_slots: int = 16384  # partition slots in the control table (192 B each; more with settings, docs/OPERATIONS.md)
    ring_idle_ms: int = 10_000  # a ring not appended to this long gives back its flushed pages (actors/keeper.py)
    ring_warm_bytes: int = 1 * MiB  # under memory pressure each ring keeps its newest this many bytes longest
    segment_bytes: int = 64 * MiB  # journal segment file size
    metrics_bind: str = "127.0.0.1:9420"  # the Prometheus endpoint (ops/metrics.py); "off" for none
    metrics_partitions: int = 1000  # per-partition series for at most this many (the most bytes appended); -1: all
    max_batch_bytes: int = 1 * MiB  # largest record batch accepted
    flush_interval_ms: int = 50  # fsync at least this often when data is pending
    flush_bytes: int = 16 * MiB  # ... or once this many bytes are written but not synced
    write_buffer_bytes: int = 8 * MiB  # the flusher's aligned staging buffer
    checkpoint_interval_ms: int = 10_000  # how often index files are synced and checkpointed
    retention_ms: int = 7 * 24 * 3600 * 1000  # a topic's records are kept this long unless it says otherwise; -1: forever
    retention_bytes: int = -1  # per partition, unless the topic says otherwise; -1: no limit
    disk_max_used_ratio: float = 0.85  # the journal's filesystem fuller than this: "storage full" (disk_full_policy; 1.0: never)
    disk_full_policy: str = "refuse"  # storage full: "refuse" produce (STORAGE_FULL, retriable; nothing deleted) or
    # "delete_oldest" (RocketMQ's: the oldest segments go inside retention, then refuse) (persistence/diskguard.py)
    disk_force_delete_min_age_ms: int = 3600 * 1000  # delete_oldest never deletes a segment written to within this long
    retention_check_ms: int = 5000  # how often the flusher moves log starts and deletes segments (persistence/retention.py)
    group_offsets_retention_ms: int = 6 * 3600 * 1000  # __consumer_offsets keeps records this long: a router start reads at most that
    group_refresh_ms: int = 2 * 3600 * 1000  # every group's offsets are written again this often (router/groups.py)
    # share groups (router/share.py): the defaults of each group's settings (tailrace share-groups alter)
    share_record_lock_duration_ms: int = 30_000  # an acquired record is the member's this long (Kafka's)
    share_delivery_count_limit: int = 5  # delivered this many times and still not accepted: dead-lettered (Kafka's)
    share_max_in_flight: int = 10_000  # records read but not done, per share partition (Kafka's record locks)
    share_session_timeout_ms: int = 45_000  # a member silent this long leaves; what it holds goes back
    delay_max_ms: int = 7 * 24 * 3600 * 1000  # a delayed record's delivery time at most this far ahead (router/timer.py)
    direct_io: str = "auto"  # "auto": O_DIRECT where the filesystem allows it; "off"
    ipc_dir: str = ""  # the run directory (sockets, doorbells, pid files); default: broker/datadir.py
    data_mode: str = "0700"  # data directory and subdirectories; files get this & 0666 (umask rule)
    worker_timeout_ms: int = 3000  # a worker silent this long is declared dead...
    reassign_grace_ms: int = 5000  # ...and its partitions move after this grace unless it returns
    rebalance: int = 1  # 1: move idle partitions off overloaded workers (router/scheduler.py)
    rebalance_interval_ms: int = 2000  # ... at most one move per this long
    rebalance_cooldown_ms: int = 30_000  # ... and the same partition not again within this
    rebalance_persist_ms: int = 3000  # ... and only once an imbalance has lasted this long
    auth: str = "none"  # "curve": CurveZMQ on the router's and the workers' ZeroMQ endpoints (broker/auth.py)
    allow_dir: str = ""  # with auth: the allow-list of client public keys (default <data_dir>/auth/clients)
    insecure: int = 0  # 1: a non-loopback bind without auth is accepted (with a warning at every start)
    local_uids: str = ""  # user ids the same-host Unix sockets accept, comma-separated (default: the broker's own)
    # cluster (docs/DESIGN.md "Cluster"): empty = a single host, nothing of etcd imported
    cluster: str = ""  # etcd endpoints, etcd://h1:2379,h2:2379 (or h1:2379,h2:2379)
    broker_id: int = -1  # this broker's id in the cluster, >= 0, unique among live brokers
    advertise: str = ""  # the client endpoint other brokers and clients reach this one at (default: bind)
    cluster_name: str = "tailrace"  # several clusters may share one etcd: each under /tailrace/<name>/
    cluster_ttl_s: int = 10  # the broker's registration lease: dead brokers are noticed within this long
    rack: str = ""  # optional: the broker's rack (placement may spread over racks)
    replica_lag_time_max_ms: int = 30_000  # a follower not caught up to its leader's log end this long leaves the ISR (Kafka's)
    default_replication_factor: int = 3  # a cluster topic created without a factor: this many replicas when this many brokers live, else 1 (Kafka's default.replication.factor)
    auto_leader_rebalance: int = 1  # 1: leadership goes back to a partition's preferred replica once it is in sync (Kafka's auto.leader.rebalance.enable)
    debug_read_delay_ms: int = 0  # fault injection for tests: each journal read on a worker waits this long
    debug_stop_delay_ms: int = 0  # fault injection for tests: a stopping worker lingers this long before it exits
    debug_crash_at: str = ""  # fault injection for tests: the flusher dies (once) at this step of retention (a worker: ring_*, actors/keeper.py)

    @property
    def instance(self) -> str:
        return instance_of(self.data_dir)

    def ipc_path(self) -> str:
        """The run directory: private to the broker's user (broker/datadir.py says where and why)."""
        return self.ipc_dir or datadir.default_run_dir(self.instance)

    @property
    def max_frame_bytes(self) -> int:
        """The largest inbound message part the router and the workers read (ZMQ_MAXMSGSIZE, the
        Unix wire's length check): a largest batch plus room for the headers. Anything larger is
        dropped before Python sees it."""
        return self.max_batch_bytes + (1 << 20)

    @property
    def data_mode_bits(self) -> int:
        return datadir.parse_mode(self.data_mode)

    def worker_unix_endpoint(self, worker_id: int) -> str:
        """The worker's same-host endpoint (client/unixwire.py), beside its ZeroMQ one."""
        return "unix://" + os.path.join(self.ipc_path(), datadir.worker_file(worker_id, datadir.WORKER_SOCK))

    def worker_endpoint(self, worker_id: int) -> str:
        return "ipc://" + os.path.join(self.ipc_path(), datadir.worker_file(worker_id, datadir.WORKER_IPC))

    def worker_pid_path(self, worker_id: int) -> str:
        return os.path.join(self.ipc_path(), datadir.worker_file(worker_id, datadir.WORKER_PID))

    def flusher_bell_path(self) -> str:
        """The flusher's doorbell (shm/doorbell.py), which workers ring with their kicks."""
        return os.path.join(self.ipc_path(), datadir.FLUSHER_BELL)

    def worker_bell_path(self, worker_id: int) -> str:
        """A worker's doorbell, which the flusher rings after every sync."""
        return os.path.join(self.ipc_path(), datadir.worker_file(worker_id, datadir.WORKER_BELL))

    def metrics_address(self) -> tuple[str, int] | None:
        """``metrics_bind`` as (host, port) to listen on, or None when it is off; a bad value is
        a ValueError (the forms of a bootstrap address: host:port, or a port on loopback)."""
        text = self.metrics_bind.strip()
        if text.lower() in METRICS_OFF:
            return None
        endpoint = parse_bootstrap(text)
        if not endpoint.startswith("tcp://"):
            raise ValueError(f"metrics_bind={text!r}: expected host:port, a port, or off")
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def advertised(self) -> str:
        """The client endpoint this broker is known by in a cluster: ``advertise``, else ``bind``."""
        return parse_bootstrap(self.advertise) if self.advertise else self.bind

    def validate(self) -> None:
        self.metrics_address()
        if self.default_replication_factor < 1:
            raise ValueError(f"default_replication_factor={self.default_replication_factor} must be >= 1")
        if self.replica_lag_time_max_ms < 100:
            raise ValueError(f"replica_lag_time_max_ms={self.replica_lag_time_max_ms} must be >= 100")
        if self.max_batch_bytes * 4 > self.segment_bytes:
            raise ValueError(f"segment_bytes={self.segment_bytes} must be >= 4 x max_batch_bytes={self.max_batch_bytes}")
        if self.segment_bytes % 4096 or self.write_buffer_bytes % 4096:
            raise ValueError("segment_bytes and write_buffer_bytes must be multiples of 4096")
        if self.write_buffer_bytes < 2 * self.max_batch_bytes:
            raise ValueError("write_buffer_bytes must be >= 2 x max_batch_bytes")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if self.cluster:
            if self.broker_id < 0:
                raise ValueError("a cluster broker needs --broker-id N (N >= 0, unique in the cluster)")
            if self.allow_dir:
                raise ValueError("--allow-dir with --cluster: a cluster's allow-list is in etcd, the same for every broker "
                                 "(tailrace keys allow NAME KEYFILE --cluster ...)")
            if self.cluster_ttl_s < 2:
                raise ValueError(f"cluster_ttl_s={self.cluster_ttl_s} must be >= 2 (etcd's smallest lease)")
        datadir.parse_mode(self.data_mode)
        if not 0.0 < self.disk_max_used_ratio <= 1.0:
            raise ValueError(f"disk_max_used_ratio={self.disk_max_used_ratio} must be in (0, 1] (1: never full)")
        if self.disk_full_policy not in DISK_FULL_POLICIES:
            raise ValueError(f"disk_full_policy={self.disk_full_policy!r}: one of {', '.join(DISK_FULL_POLICIES)}")
        if self.disk_force_delete_min_age_ms < 0:
            raise ValueError(f"disk_force_delete_min_age_ms={self.disk_force_delete_min_age_ms} must be >= 0")
        if not 0 < self.group_refresh_ms < self.group_offsets_retention_ms:
            raise ValueError(f"group_refresh_ms={self.group_refresh_ms} must be > 0 and below group_offsets_retention_ms="
                             f"{self.group_offsets_retention_ms} (offsets are written again before they expire)")
        if self.retention_ms < -1 or self.retention_bytes < -1 or self.retention_check_ms < 1:
            raise ValueError(f"retention_ms={self.retention_ms} must be >= -1 (-1: for ever) and retention_check_ms >= 1")
        if self.auth not in auth.MODES:
            raise ValueError(f"auth={self.auth!r}: one of {', '.join(auth.MODES)}")
        why = auth.exposure_error(self.bind, self.auth, bool(self.insecure))
        if why:
            raise ValueError(why)
        self.allowed_uids()

    def allowed_uids(self) -> frozenset[int]:
        """The user ids a same-host Unix socket accepts (SO_PEERCRED): ``local_uids``, else ours."""
        text = self.local_uids.strip()
        if not text:
            return frozenset({os.geteuid()})
        try:
            return frozenset(int(u) for u in text.split(","))
        except ValueError:
            raise ValueError(f"local_uids={text!r}: user ids separated by commas") from None


_FIELDS = Settings.__struct_fields__


def from_env(env=None, **overrides) -> Settings:
    env = os.environ if env is None else env
    values = {}
    defaults = Settings()
    for name in _FIELDS:
        raw = env.get("TAILRACE_" + name.upper())
        if raw is not None and raw != "":
            values[name] = type(getattr(defaults, name))(raw)
    values.update({k: v for k, v in overrides.items() if v is not None})
    s = Settings(**values)
    if s.shm_budget_bytes == 0:
        s.shm_budget_bytes = default_shm_budget()
    s.validate()
    return s


@functools.lru_cache(maxsize=64)
def instance_of(data_dir: str) -> str:
    """The instance id of a data directory: its real path, hashed (computed once per process:
    realpath costs a stat per path component, and every partition made asks for it)."""
    return hashlib.sha1(os.path.realpath(data_dir).encode()).hexdigest()[:10]


def default_shm_budget() -> int:
    """Half of the machine's memory, at most 90% of /dev/shm: 1,000 partitions of the default
    8 MiB ring (9.3 GiB with their descriptors, docs/DESIGN.md) fit on a 24 GiB machine. Rings take memory as they fill, not when made
    (shm/region.py), so the budget bounds what a full broker can hold, not what it holds idle."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 2 * 1024 * MiB
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_frsize * st.f_blocks
    except OSError:
        shm = ram
    return max(256 * MiB, min(ram // 2, shm * 9 // 10))


def to_env(settings: Settings) -> dict[str, str]:
    return {"TAILRACE_" + name.upper(): str(getattr(settings, name)) for name in _FIELDS}
