"""``tailrace serve``: own the data directory, run supervisord, stop it cleanly on any signal.

This process stays in front of supervisord for its whole life instead of exec'ing into it:

- It takes the data directory (broker/datadir.py): a second ``tailrace serve`` on the same
  directory, or one while processes of an earlier broker still live, refuses within 2 s naming
  their pids, and disturbs nothing.
- SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal closed) all become one SIGTERM to supervisord:
  a clean stop (workers, router, then the flusher, which drains every ring). supervisord runs in
  its own process group, so a terminal's signals reach it only through here, once. Not in its
  own session: with the kernel's autogroup scheduling (sched_autogroup_enabled, on here) a new
  session is a new scheduling group, and the whole broker then shared one group's CPU against
  its clients' group; on 2 cores that took e2e/5000 over ZeroMQ from p50 13 ms to 0.1-3 s
  (docs/BENCHMARKS.md).
- supervisord's output is relayed to our stdout, but for the lines ``EXPECTED`` names (said at
  every start, about what is so by design; supervisord.conf explains each; supervisord.log keeps
  them); when stdout breaks (``| tee`` killed by the same Ctrl-C, the terminal gone) relaying
  stops and supervisord still never blocks or dies of it.
- supervisord gets SIGTERM from the kernel if this process is killed (PR_SET_PDEATHSIG), and
  each program gets SIGTERM if supervisord is: nothing is ever left running unsupervised.
- After supervisord exits, once every program has released the broker lock, the run directory
  is removed: a clean stop leaves nothing there.
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import store_worker_count

from . import scaling
from .scaling import find_supervisord_conf

EXIT_OK = 0
EXIT_ERROR = 1  # the client address cannot be listened on
EXIT_IN_USE = 3  # the data directory belongs to a live broker
EXIT_UNSAFE = 4  # the run directory is not private
EXIT_SUPERVISOR_DIED = 5  # supervisord was killed; its programs stopped by themselves
EXIT_NO_SPACE = 6  # the journal's filesystem cannot hold the segments the flusher needs to start
AFTER_STOP_WAIT_S = 15.0  # for the programs to exit after supervisord died
# supervisord's lines that are so by design (supervisord.conf says why): kept in its log, not relayed
EXPECTED = (
    b"CRIT Server 'unix_http_server' running without any HTTP authentication checking",
    b'WARN No file matches via include "',  # ... workers.d/*.conf": no extra workers yet
)


def serve_env(s: settings_mod.Settings) -> dict[str, str]:
    """Everything supervisord.conf and the programs read, as environment variables."""
    env = dict(os.environ)
    env.update(settings_mod.to_env(s))
    env["TAILRACE_PYTHON"] = sys.executable
    env["TAILRACE_LOG_DIR"] = str(datadir.log_dir(s.data_dir))
    env["TAILRACE_RUN_DIR"] = s.ipc_path()
    # supervisord's user=: the one we run as (no privilege is dropped; "running as root" unsaid)
    env["TAILRACE_SUPERVISOR_USER"] = str(os.getuid())
    return env


def check_bind(endpoint: str) -> str | None:
    """Why the router could not listen on ``endpoint`` (``tcp://host:port``), or None if it can.

    Tried once before supervisord starts, so a busy port is one line at once instead of a router
    that supervisord restarts a hundred times with the reason only in router.log."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    host = "" if host in ("*", "0.0.0.0") else host
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as exc:
        return f"cannot listen on {endpoint}: {exc}"
    family, kind, proto, _name, addr = infos[0]
    with socket.socket(family, kind, proto) as sk:
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ does
        try:
            sk.bind(addr)
        except OSError as exc:
            why = "the port is in use (another broker or program listens there)" if exc.errno == errno.EADDRINUSE \
                else exc.strerror
            return f"cannot listen on {endpoint}: {why}"
    return None


def check_metrics_bind(s: settings_mod.Settings) -> str | None:
    """The same for the Prometheus endpoint (``--metrics-bind``; ``off`` needs no port)."""
    where = s.metrics_address()  # validated with the settings
    why = check_bind(f"tcp://{where[0]}:{where[1]}") if where is not None else None
    return f"{why} (the metrics endpoint: choose another with --metrics-bind, or --metrics-bind off)" if why else None


def metrics_url(s: settings_mod.Settings) -> str:
    where = s.metrics_address()
    return "off" if where is None else f"http://{where[0]}:{where[1]}/metrics"


def log_files(s: settings_mod.Settings) -> str:
    return datadir.program_logs(s.data_dir)


def print_env(s: settings_mod.Settings, env: dict[str, str], default_run_dir: bool) -> int:
    """``tailrace serve --print-env``: make the directories supervisord.conf names, then print its
    environment and command line, for running supervisord yourself."""
    mode = s.data_mode_bits
    os.umask(datadir.umask_for(mode))
    datadir.make_data_dir(s.data_dir, mode)
    try:
        datadir.prepare_run_dir(env["TAILRACE_RUN_DIR"], default_run_dir)
    except datadir.UnsafeRunDir as exc:
        say(f"refused: {exc}")
        return EXIT_UNSAFE
    os.makedirs(env["TAILRACE_LOG_DIR"], mode=mode, exist_ok=True)
    env = {**env, "TAILRACE_SUPERVISORD_CONF": str(find_supervisord_conf())}
    for k, v in sorted(env.items()):
        if k.startswith("TAILRACE_"):
            print(f"export {k}={shlex.quote(v)}")
    print('# then: supervisord -n -c "$TAILRACE_SUPERVISORD_CONF"')
    return EXIT_OK


def check_space(s: settings_mod.Settings) -> str | None:
    """Why the flusher could not start on this disk, or None. It writes the current segment and
    pre-writes the next one (persistence/journal.py): a journal with no segment yet needs room
    for two, one that has segments room for the next. Below that the flusher would fail every
    boot on ENOSPC while supervisord restarts it, and serve would look up."""
    journal = os.path.join(s.data_dir, datadir.JOURNAL_DIR)
    where = journal if os.path.isdir(journal) else s.data_dir
    try:
        has_segments = any(n.endswith(datadir.SEGMENT_SUFFIX) for n in os.listdir(journal))
    except FileNotFoundError:
        has_segments = False
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    need = s.segment_bytes * (1 if has_segments else 2)
    if free >= need:
        return None
    return (f"refused: the journal needs {need} bytes free at {where} ({1 if has_segments else 2} segment(s) of "
            f"segment_bytes={s.segment_bytes}); the filesystem has {free}")


def say(msg: str) -> None:
    try:
        print(f"tailrace serve: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run(s: settings_mod.Settings, env: dict[str, str], argv: list[str], default_run_dir: bool) -> int:
    """Claim ``s.data_dir``, prepare it and the run directory, run ``argv`` (supervisord)."""
    mode = s.data_mode_bits
    os.umask(datadir.umask_for(mode))  # inherited by supervisord, its log files and every program
    log_dir, run_dir = env["TAILRACE_LOG_DIR"], env["TAILRACE_RUN_DIR"]
    datadir.make_data_dir(s.data_dir, mode)
    try:
        claim = datadir.claim_serve(s.data_dir)
    except datadir.DataDirInUse as exc:
        say(f"refused: {exc}")
        return EXIT_IN_USE
    try:
        datadir.prepare_run_dir(run_dir, default_run_dir)
    except datadir.UnsafeRunDir as exc:
        say(f"refused: {exc}")
        claim.release()
        return EXIT_UNSAFE
    why = check_bind(s.bind) or check_metrics_bind(s)
    if why:
        say(why)
        claim.release()
        return EXIT_ERROR
    why = check_space(s)
    if why:
        say(why)
        claim.release()
        return EXIT_NO_SPACE
    # Nobody alive uses the directory: what a crashed broker left in the run directory is stale.
    datadir.clear_run_dir(run_dir, remove=False)
    datadir.apply_data_mode(s.data_dir, mode)
    os.makedirs(log_dir, mode=mode, exist_ok=True)
    store_worker_count(s.data_dir, s.workers)
    scaling.clear_extra_workers(run_dir)
    datadir.share(claim)

    stopping: list[int] = []  # the first stop signal, once one came
    procs: list[subprocess.Popen] = []  # supervisord, once started

    def on_signal(signum, _frame):
        if not stopping:
            say(f"{signal.Signals(signum).name}: stopping (workers, router, then the flusher drains to disk)")
            stopping.append(signum)
            for p in procs:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=claim.fds, process_group=0,
                            preexec_fn=datadir.pdeathsig_preexec(os.getpid()))
    procs.append(proc)
    say(f"serving {s.bind}, data in {s.data_dir}; metrics {metrics_url(s)}; logs: {log_files(s)}")
    if stopping:
        proc.send_signal(signal.SIGTERM)
    _relay(proc.stdout.fileno())
    rc = proc.wait()
    if rc < 0 and not stopping:
        say(f"supervisord died of {signal.Signals(-rc).name}; its programs stop by themselves (they die with it)")
    # Every program holds the broker lock shared: exclusive once they have all exited.
    if claim.wait_last_out(AFTER_STOP_WAIT_S):
        datadir.clear_run_dir(run_dir, remove=True)
    else:
        pids = datadir.holders(datadir.lock_path(s.data_dir, datadir.BROKER_LOCK))
        say(f"programs still running after {AFTER_STOP_WAIT_S:.0f} s: {pids}; run directory {run_dir} kept")
    claim.release()
    if rc < 0 and not stopping:
        return EXIT_SUPERVISOR_DIED
    return rc if rc >= 0 else EXIT_OK


def _relay(fd: int) -> None:
    """Copy supervisord's output to our stdout until it closes, whole lines, without the
    ``EXPECTED`` ones; a broken stdout stops the copying, never the reading (supervisord must not
    block on a full pipe)."""
    out = sys.stdout.buffer
    broken = False
    partial = b""
    while True:
        try:
            chunk = os.read(fd, 65536)  # EINTR (a signal arrived) is retried by Python itself
        except OSError:
            chunk = b""  # the pipe is gone: supervisord's exit is still reaped by wait()
        if not chunk:
            text, partial = partial, b""
        else:
            data = partial + chunk
            cut = data.rfind(b"\n") + 1
            text, partial = data[:cut], data[cut:]
        if text and not broken:
            kept = b"".join(line for line in text.splitlines(keepends=True) if not any(e in line for e in EXPECTED))
            try:
                out.write(kept)
                out.flush()
            except (OSError, ValueError):
                broken = True
        if not chunk:
            return
