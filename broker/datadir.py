"""One live broker per data directory; a private run directory; private data files.

Some facts about Linux that this module depends on:

- An ``flock`` lock belongs to an open file description. The kernel drops it when the last file
  descriptor of that description is closed, which happens whatever way the holder dies (exit,
  SIGKILL, OOM): a lock left by dead processes never blocks anyone. A description is shared with
  children through fork and survives exec, so a child that keeps the descriptor holds the lock
  too. Converting a shared lock to exclusive (or back) is not atomic: the old lock is dropped
  first.
- A program dies with its supervisor and stops on signals (broker/lifetime.py: prctl's and
  supervisord's facts).
- A Unix socket path holds at most 107 bytes. Anybody may create a directory under /tmp, and a
  name derived from public facts (the data directory's path) can be created there first by
  another user, who then owns it and everything it admits.

What this means for us:

- Every process of a broker holds ``<data_dir>/locks/broker.lock`` shared for its whole life
  (``tailrace serve``, the supervisord it runs, the flusher, the router, each worker). A start
  takes it exclusive for a moment: that succeeds only when no process of any broker is alive on
  the directory. ``tailrace serve`` first takes ``locks/serve.lock`` exclusive (held by it and
  its supervisord), so two starts at the same moment cannot both pass the moment of conversion.
  Each program also takes its own role lock (``locks/flusher.lock``, ``router.lock``,
  ``worker-<id>.lock``) exclusive, so a second flusher, router or worker started by hand
  refuses while one lives.
- Every program asks to die with its supervisor (SIGTERM: it stops cleanly, the flusher drains
  what it can); ``tailrace serve`` asks the same for its supervisord.
- The run directory (sockets, doorbells, pid files, supervisord's socket and the worker programs
  it includes) is created by the broker, 0700, owned by its user, under a base only that user
  can create in (``$XDG_RUNTIME_DIR``, ``/run`` for root, else ``<tmp>/tailrace-<uid>``, made
  private), and refused when it exists with another owner, as a symlink, or with any group or
  other permission bit (as ssh refuses a key file).
- Data files are private: the broker runs with a umask derived from ``data_mode`` (default
  0700: directories 0700, files 0600) and brings existing files to it at start.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import shutil
import stat
import tempfile
import time
from pathlib import Path

from tailrace.client.alloc import keep_large_blocks
from tailrace.client.errors import TailraceError

# a program's life (lifetime.py); stop_on_signals and pdeathsig_preexec are taken from here too
from .lifetime import die_with_parent, holders, in_use_message, pdeathsig_preexec, stop_on_signals  # noqa: F401

# --- every name under the data directory and the run directory -----------------------------
#
#   <data_dir>/                        mode data_mode (0700), files data_mode & 0666 (0600)
#     instance.json                    {"id": random}: the directory's identity (shm carries it)
#     topics.json                      the topic catalog (broker/catalog.py), router writes
#     workers.json                     {"workers": n}: the count last set
#     router.json                      {"generation": g}: bumped at every router start (epochs)
#     cluster.json                     with --cluster: {"cluster", "etcd_cluster_id"} of its first join
#     timer_floor                      where a start reads __delayed_records from (router/timer.py)
#     journal/<20-digit position>.log  the journal segments (persistence/journal.py)
#     journal/checkpoint               where recovery may start (persistence/recovery.py)
#     journal/log_starts.json          each partition's log start offset (persistence/retention.py)
#     journal/truncations.json         each partition's cuts of its log (persistence/truncation.py)
#     journal/<segment>.log.tmp        a segment being pre-written (persistence/journal.py)
#     index/<slot>.index               one dense index per partition (persistence/index.py)
#     locks/broker.lock, serve.lock,   the ownership locks (this module)
#       flusher.lock, router.lock, worker-<id>.lock
#     logs/supervisord.log, <program>.log
#     auth/                            with --auth curve (broker/auth.py, acl.py, quota.py)
#       server.key, server.key_secret  the broker's CURVE key pair (clients are given server.key)
#       router.key, router.key_secret  the router's, as a CURVE client of the workers
#       clients/<principal>.key        the default allow-list (settings allow_dir)
#       cluster-clients/<principal>.key  with --cluster: the cluster's allow-list, mirrored from etcd
#       acls.json, quotas.json         the access and quota rules (tailrace acl / quota; with
#                                      --cluster mirrored from etcd, cluster/access.py)
#     debug-crashed-<step>             a fault injected once (debug_crash_at, persistence/retention.py)
#     <name>.tmp                       any file being replaced by write_atomic
#
#   <run_dir>/                         0700, ours, made by the broker (prepare_run_dir)
#     supervisord.pid, supervisor.sock supervisord's own (supervisord.conf)
#     workers.d/worker-<k>.conf        worker programs added while running (ops/scaling.py)
#     flusher.bell, worker-<id>.bell   doorbells (shm/doorbell.py)
#     worker-<id>.ipc, worker-<id>.sock, worker-<id>.pid
#     slot-<n>.lock                    partition owner locks (shm/fence.py)
#     stats/<process>.msgpack          each process's counters (broker/stats.py)
#
#   the package: supervisord.conf      the program definitions (ops/scaling.py finds it)
#
# Every other module takes these names from here; none spells one (tests/unit/test_file_names.py).
INSTANCE_FILE = "instance.json"
CATALOG_FILE = "topics.json"
WORKERS_FILE = "workers.json"
ROUTER_FILE = "router.json"
TIMER_FLOOR_FILE = "timer_floor"  # the router's timer: where a start reads __delayed_records from (router/timer.py)
CLUSTER_FILE = "cluster.json"
JOURNAL_DIR = "journal"
SEGMENT_SUFFIX = ".log"
CHECKPOINT_FILE = "checkpoint"
INDEX_DIR = "index"
INDEX_SUFFIX = ".index"
LOG_DIR = "logs"
# `tailrace dev-cluster --dir D` (tailrace/cluster_commands.py): its files and folders under D
DEV_CLUSTER_STATE = "dev-cluster.json"  # the ports of the last run, taken again when free (a stable bootstrap)
DEV_CLUSTER_LOCK = "dev-cluster.lock"  # held while a dev-cluster runs on the directory
DEV_CLUSTER_ETCD_DIR = "etcd"  # its etcd's data directory
DEV_CLUSTER_KEYS_DIR = "keys"  # with --auth curve: the admin client's key pair (the cluster allows it)
DEV_CLUSTER_CLIENT = "admin"  # that client's principal (its key files are named after it)
SERVE_OUT = "serve.out"  # a broker's `tailrace serve` output, when a launcher keeps it in the data directory


def dev_broker_dir(broker_id: int) -> str:
    """The data directory of dev-cluster's broker ``broker_id``, under its --dir."""
    return f"broker-{int(broker_id)}"
PROGRAM_LOG_SUFFIX = ".log"  # in LOG_DIR, named by supervisord.conf
LOCK_DIR = "locks"
BROKER_LOCK = "broker.lock"  # shared by every live process of the broker
SERVE_LOCK = "serve.lock"  # exclusive: the one `tailrace serve` (and its supervisord)
SUPERVISOR_SOCKET = "supervisor.sock"
EXTRA_WORKERS_DIR = "workers.d"
FLUSHER_BELL = "flusher.bell"
RUN_BASE_NAME = "tailrace"
LOG_STARTS_FILE = "log_starts.json"  # in JOURNAL_DIR
TRUNCATIONS_FILE = "truncations.json"  # in JOURNAL_DIR
TMP_SUFFIX = ".tmp"  # a file being written before its rename into place
SUPERVISORD_CONF = "supervisord.conf"  # shipped inside the package
EXTRA_WORKER_SUFFIX = ".conf"  # in EXTRA_WORKERS_DIR
# worker_file suffixes in the run directory
WORKER_BELL, WORKER_IPC, WORKER_SOCK, WORKER_PID = "bell", "ipc", "sock", "pid"
# --auth curve (broker/auth.py, broker/acl.py, broker/quota.py)
AUTH_DIR = "auth"
CLIENTS_DIR = "clients"  # in AUTH_DIR: the default allow-list
CLUSTER_CLIENTS_DIR = "cluster-clients"  # in AUTH_DIR: a cluster's allow-list, mirrored from etcd
SERVER_KEY = "server"  # key pair names
ROUTER_KEY = "router"
PUBLIC_KEY_SUFFIX = ".key"
SECRET_KEY_SUFFIX = ".key_secret"
KEYS_TEMP_PREFIX = ".keys-"  # a key pair is made in such a directory, then linked into place
ACL_FILE = "acls.json"  # in AUTH_DIR
QUOTA_FILE = "quotas.json"  # in AUTH_DIR
CRASH_MARKER_PREFIX = "debug-crashed-"
# program names: each names its role lock (locks/<role>.lock) and its stats file (stats/<role>.msgpack)
FLUSHER_ROLE, ROUTER_ROLE, METRICS_ROLE = "flusher", "router", "metrics"
GROUPS_STATS = "groups"  # the router's group coordinator keeps a stats file of its own
QUEUES_STATS = "queues"  # ... and its share groups and timer another (router/share.py, router/timer.py)


def segment_name(start: int) -> str:
    """A journal segment's file name: its start position, zero-padded to 20 digits (Kafka's)."""
    return f"{start:020d}{SEGMENT_SUFFIX}"


def index_name(slot: int) -> str:
    return f"{slot}{INDEX_SUFFIX}"


def worker_file(worker_id: int, suffix: str) -> str:
    """``worker-<id>.<suffix>`` in the run directory: bell, ipc, sock, pid."""
    return f"worker-{worker_id}.{suffix}"


def worker_id_of(name: str, suffix: str) -> int | None:
    """The id in a ``worker-<id>.<suffix>`` name, else None."""
    if name.startswith("worker-") and name.endswith("." + suffix):
        mid = name[len("worker-") : -len(suffix) - 1]
        return int(mid) if mid.isdigit() else None
    return None


def extra_worker_conf(worker_id: int) -> str:
    return f"worker-{worker_id}{EXTRA_WORKER_SUFFIX}"


def worker_role(worker_id: int) -> str:
    """A worker program's name (its role lock, its stats file; supervisord's ``worker-N``)."""
    return f"worker-{worker_id}"


def temp_name(name: str) -> str:
    return name + TMP_SUFFIX


def public_key_name(name: str) -> str:
    return name + PUBLIC_KEY_SUFFIX


def secret_key_name(name: str) -> str:
    return name + SECRET_KEY_SUFFIX


def crash_marker_name(step: str) -> str:
    return CRASH_MARKER_PREFIX + step


def program_logs(data_dir) -> str:
    """The programs' log files, as a shell brace pattern (supervisord.conf names them)."""
    return f"{log_dir(data_dir)}/{{supervisord,router,flusher,worker-N,metrics}}{PROGRAM_LOG_SUFFIX}"


def slot_lock_name(slot: int) -> str:
    return f"slot-{slot}.lock"


def role_lock_name(role: str) -> str:
    return f"{role}.lock"


def log_dir(data_dir) -> Path:
    return Path(data_dir) / LOG_DIR


# --- small files: replaced atomically ------------------------------------------------------


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def journal_usage(data_dir) -> tuple[int, int]:
    """(segment files, disk bytes of the journal directory: allocated blocks), one directory scan."""
    segments = total = 0
    try:
        with os.scandir(os.path.join(data_dir, JOURNAL_DIR)) as it:
            for e in it:
                segments += e.name.endswith(SEGMENT_SUFFIX)
                try:
                    total += e.stat(follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return segments, total


def file_signature(path) -> tuple[int, int, int] | None:
    """What changes when a file is rewritten by ``write_atomic``, or None if there is no file:
    processes re-read a rules file (the catalog, ACLs, quotas) only when this changes.

    The inode alone does not do it: a rewrite's temp file may get the inode number the version
    before last had (ext4 hands a freed one out again at once), and the file system's clock moves
    only every few milliseconds, so versions 1 and 3 of three quick writes of the same size would
    look the same and a reader that saw 1 would miss 3. ``write_atomic`` therefore gives every
    version an mtime past the one it replaces (``_next_mtime_ns``)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _next_mtime_ns(path) -> int:
    """An mtime for the next version of ``path``: now to the nanosecond (the file system's own
    stamp is its coarse clock), and past the present version's whatever the clock did."""
    try:
        prev = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        prev = 0
    return max(time.time_ns(), prev + 1)


def write_atomic(path, data: bytes, sync: bool = True, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content: write a
    temp file, fsync it, rename it over, fsync the directory (the rename is durable only then).
    ``sync=False``: readers never see half a file, but a crash may lose the new one (statistics).
    ``mode``: the file's permissions whatever the umask (``file_mode_in``); None: 0666 & ~umask,
    right inside the broker, whose umask is the data mode's."""
    path = Path(path)
    tmp = path.with_name(temp_name(path.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # a temp file left by a crash keeps its old mode through O_TRUNC
        os.write(fd, data)
        t = _next_mtime_ns(path)
        os.utime(fd, ns=(t, t))  # every version's signature differs from every earlier one's
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def file_mode_in(directory) -> int:
    """The mode a file written into ``directory`` from outside the broker gets (``tailrace acl``
    and ``tailrace quota`` run under the operator's umask, often 022): its directory's, without
    execute bits. The broker makes its directories with the data mode (0700: files 0600; 0750:
    0640), and ``apply_data_mode`` brings them to it at start."""
    return stat.S_IMODE(os.stat(directory).st_mode) & 0o666


STATS_DIR = "stats"  # in the run directory: each process's counters (broker/stats.py, FORMAT.md)
STATS_SUFFIX = ".msgpack"


def stats_dir(run_dir: str) -> str:
    """Where each process writes its counters for the metrics exporter (broker/stats.py)."""
    return os.path.join(run_dir, STATS_DIR)


def stats_file(run_dir: str, process: str) -> str:
    return os.path.join(run_dir, STATS_DIR, process + STATS_SUFFIX)


DEFAULT_DATA_MODE = 0o700
UNIX_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
LOCK_POLL_S = 0.05


class DataDirInUse(TailraceError):
    """Raised when another live broker process uses the data directory (or holds the role)."""


class UnsafeRunDir(TailraceError):
    """Raised when the run directory exists but is not private to this user (owner, mode, link)."""


# --- modes ------------------------------------------------------------------------------


def parse_mode(text: str | int) -> int:
    """``"0750"`` -> 0o750. The owner keeps rwx; bits beyond 0o777 are refused."""
    mode = int(text, 8) if isinstance(text, str) else int(text)
    if mode & ~0o777 or mode & 0o700 != 0o700:
        raise ValueError(f"data_mode={text!r} must be an octal mode within 0777 that gives the owner rwx (e.g. 0700, 0750)")
    return mode


def umask_for(mode: int) -> int:
    return 0o777 & ~mode


def apply_data_mode(data_dir: str | os.PathLike, mode: int) -> None:
    """Bring an existing data directory to ``mode``: directories ``mode``, files ``mode & 0o666``
    (a directory made by an older version, or under another umask). Links are not followed."""
    file_mode = mode & 0o666
    for root, dirs, files in os.walk(data_dir):
        os.chmod(root, mode)
        for name in files:
            p = os.path.join(root, name)
            try:
                if stat.S_ISREG(os.lstat(p).st_mode):
                    os.chmod(p, file_mode)
            except FileNotFoundError:
                pass


def make_data_dir(data_dir: str | os.PathLike, mode: int) -> None:
    os.makedirs(data_dir, mode=mode, exist_ok=True)
    os.chmod(data_dir, mode)


# --- the run directory ------------------------------------------------------------------


def _check_private(path: str) -> None:
    """Refuse ``path`` unless it is a real directory, ours, with no group or other bit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeRunDir(f"run directory {path} is not a directory of ours (a symlink or a file): "
                               f"remove it, or choose another with --ipc-dir / TAILRACE_IPC_DIR") from None
        raise
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeRunDir(f"run directory {path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): "
                           f"someone else created it; remove it as root, or choose another with --ipc-dir")
    if st.st_mode & 0o077:
        raise UnsafeRunDir(f"run directory {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may use it; "
                           f"it must be 0700 (chmod 700 {path}, or remove it)")


def ensure_private_dir(path: str) -> str:
    """Create ``path`` 0700 if it is missing (parents too), then check it is private to us."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    _check_private(path)
    return path


def default_run_base() -> str:
    """A directory only this user can create entries in, for every broker of this user."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return os.path.join(xdg, RUN_BASE_NAME)
        except OSError:
            pass
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return os.path.join("/run", RUN_BASE_NAME)
    return os.path.join(tempfile.gettempdir(), f"{RUN_BASE_NAME}-{os.geteuid()}")


def default_run_dir(instance: str) -> str:
    return os.path.join(default_run_base(), instance)


def prepare_run_dir(run_dir: str, default: bool) -> str:
    """Make the run directory private (and its base, when it is the default one)."""
    if default:
        ensure_private_dir(os.path.dirname(run_dir))
    ensure_private_dir(run_dir)
    longest = os.path.join(run_dir, "worker-9999.sock")
    if len(longest.encode()) > UNIX_PATH_MAX:
        raise UnsafeRunDir(f"run directory {run_dir} is too long for Unix socket paths ({len(longest)} > {UNIX_PATH_MAX} bytes): "
                           f"choose a shorter one with --ipc-dir")
    return run_dir


def clear_run_dir(run_dir: str, remove: bool) -> None:
    """Empty the run directory (a previous broker's sockets, locks, pid files) or remove it.
    Only call with the broker lock held exclusive: nobody alive uses it then."""
    try:
        _check_private(run_dir)
    except (UnsafeRunDir, FileNotFoundError):
        return
    if remove:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for entry in os.scandir(run_dir):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass


# --- the locks --------------------------------------------------------------------------


def lock_path(data_dir, name: str) -> Path:
    return Path(data_dir) / LOCK_DIR / name


def _open_lock(data_dir, name: str) -> int:
    d = Path(data_dir) / LOCK_DIR
    d.mkdir(mode=0o777, parents=True, exist_ok=True)  # the umask (data_mode) decides
    return os.open(d / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


def _try_flock(fd: int, how: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_S)


class Claim:
    """The locks one process holds on a data directory. ``fds`` stay open for the process's life
    (a child that inherits them holds the locks too); ``release`` lets go."""

    def __init__(self, data_dir: str, fds: list[int]):
        self.data_dir = data_dir
        self.fds = fds  # [role lock fd, broker lock fd]

    def wait_last_out(self, timeout_s: float) -> bool:
        """Whether every other process of the broker has exited within ``timeout_s`` (the broker
        lock turns exclusive). Only when about to exit: the shared lock is dropped on the way."""
        return _try_flock(self.fds[-1], fcntl.LOCK_EX, timeout_s)

    def release(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def claim_serve(data_dir: str, wait_s: float = 1.5) -> Claim:
    """For ``tailrace serve``: refuse if any broker process lives on ``data_dir``.

    Returns holding ``serve.lock`` exclusive and ``broker.lock`` exclusive: the caller clears
    stale state, then calls ``share`` before it starts the programs."""
    serve_fd = _open_lock(data_dir, SERVE_LOCK)
    if not _try_flock(serve_fd, fcntl.LOCK_EX, wait_s):
        pids = sorted(set(holders(lock_path(data_dir, SERVE_LOCK)) + holders(lock_path(data_dir, BROKER_LOCK))))
        os.close(serve_fd)
        raise DataDirInUse(in_use_message(data_dir, pids))
    broker_fd = _open_lock(data_dir, BROKER_LOCK)
    if not _try_flock(broker_fd, fcntl.LOCK_EX, wait_s):
        pids = holders(lock_path(data_dir, BROKER_LOCK))
        os.close(broker_fd)
        os.close(serve_fd)
        raise DataDirInUse(in_use_message(data_dir, pids, "broker processes left running (no supervisor)"
                                          if pids else "a running broker"))
    return Claim(data_dir, [serve_fd, broker_fd])


def share(claim: Claim) -> None:
    """Exclusive -> shared on the broker lock, so the programs can join. ``serve.lock`` is still
    held exclusive, so no other start can slip in while the lock is briefly dropped."""
    fcntl.flock(claim.fds[-1], fcntl.LOCK_SH)


def claim_program(data_dir: str, role: str, wait_s: float = 2.0) -> Claim:
    """For the flusher, the router and each worker: join the broker lock (shared) and take the
    role's lock (exclusive); refuse while another process holds the role."""
    broker_fd = _open_lock(data_dir, BROKER_LOCK)
    if not _try_flock(broker_fd, fcntl.LOCK_SH, wait_s):  # a start holds it exclusive for a moment
        pids = holders(lock_path(data_dir, BROKER_LOCK))
        os.close(broker_fd)
        raise DataDirInUse(in_use_message(data_dir, pids, "a broker that is starting"))
    role_fd = _open_lock(data_dir, role_lock_name(role))
    if not _try_flock(role_fd, fcntl.LOCK_EX, 0.0):
        pids = holders(lock_path(data_dir, role_lock_name(role)))
        os.close(role_fd)
        os.close(broker_fd)
        raise DataDirInUse(in_use_message(data_dir, pids, f"another {role}"))
    return Claim(data_dir, [role_fd, broker_fd])


EXIT_REFUSED = 6  # a program's exit code when the data or run directory is not its to use


def enter_program(settings, role: str, log) -> Claim | None:
    """The first steps of every broker program (flusher, router, worker): die with the
    supervisor, private files, join the data directory's broker lock and take the role's lock,
    check the run directory, keep large blocks in the heap (client/alloc.py). Returns None
    after logging why the program must not run."""
    die_with_parent()
    keep_large_blocks()
    raise_fd_limit(FDS_PER_SLOT * settings.max_slots + 4096, log)
    os.umask(umask_for(settings.data_mode_bits))
    try:
        claim = claim_program(settings.data_dir, role)
        prepare_run_dir(settings.ipc_path(), default=not settings.ipc_dir)
    except (DataDirInUse, UnsafeRunDir) as exc:
        log.error("refused: %s", exc)
        if os.environ.get("SUPERVISOR_ENABLED"):
            time.sleep(1.0)  # supervisord restarts an exited program at once: not in a tight loop
        return None
    return claim


FDS_PER_SLOT = 2  # a partition's files a program holds open: the flusher its index, a worker its owner lock
# and its disk reader's index (ring mappings keep none: shm/region.py ``_map``)


def raise_fd_limit(want: int, log) -> int:
    """Raise this process's open-files limit to ``want`` (root may raise the hard limit, up to
    fs.nr_open), else as far as the hard limit allows; returns the soft limit now. 10,000
    partitions take ~20,000 descriptors in the flusher (Kafka asks for 100,000 likewise)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    for limits in ((want, max(hard, want)), (min(want, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            break
        except (ValueError, OSError):
            continue
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < want and log is not None:
        log.warning("open files limited to %d (ulimit -n); max_slots partitions may need %d", soft, want)
    return soft


def leave_program(claim: Claim, own_files: tuple[str, ...] = ()) -> None:
    """The last steps: remove this program's own run-directory files, drop the locks."""
    for path in own_files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    claim.release()
