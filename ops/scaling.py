"""``tailrace workers set N``: change the worker count of a running broker.

The router decides placement; supervisord runs processes. Growing: start the processes first
(stopped members of the ``worker`` program group, or new ``worker-<k>`` programs written into
``<run_dir>/workers.d/`` and added with ``reloadConfig`` + ``addProcessGroup``), then tell the
router (``SET_WORKERS``): once each new worker answers a heartbeat the router moves idle
partitions onto it until partition counts differ by at most one. Shrinking: tell the router
first; it moves every partition off the retiring workers (fenced moves: a new owner epoch, then
ADOPT) and drops them from its status once they own nothing; only then are their processes
stopped. Nothing is copied: partition data lives in shared memory and the journal.

supervisord is reached over its unix socket (``<run_dir>/supervisor.sock``) with its XML-RPC
interface, the one ``supervisorctl`` uses.
"""

from __future__ import annotations

import configparser
import os
import time
import xmlrpc.client
from importlib import resources
from pathlib import Path

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod
from tailrace.client.admin import Admin
from tailrace.client.connection import CONNECT_TIMEOUT_MS
from tailrace.client.errors import TailraceError

BASE_GROUP = "worker"


def find_supervisord_conf() -> Path:
    """The supervisord.conf the broker runs: ``TAILRACE_SUPERVISORD_CONF``, else the one shipped
    inside the package (the repository's top-level file, in a wheel as in a source checkout)."""
    env = os.environ.get("TAILRACE_SUPERVISORD_CONF")
    cand = Path(env) if env else Path(str(resources.files("tailrace") / datadir.SUPERVISORD_CONF))
    if not cand.is_file():
        raise SystemExit(f"supervisord.conf not found at {cand}")
    return cand


def extra_program(k: int) -> str:
    """supervisord's ``[program:worker-<k>]`` for one extra worker, made from the ``[program:worker]``
    section of the supervisord.conf the broker runs (not a copy kept here): the same command,
    priority, restarts and log, with ``%(process_num)d`` fixed at ``k``."""
    conf = configparser.RawConfigParser()
    conf.read(find_supervisord_conf())
    lines = ["; written by `tailrace workers set`; removed when the worker is retired", f"[program:worker-{k}]"]
    for key, value in conf.items(f"program:{BASE_GROUP}"):
        if key in ("numprocs", "process_name"):
            continue
        lines.append(f"{key}={value.replace('%(process_num)d', str(k))}")
    return "\n".join(lines) + "\n"


class ScalingError(TailraceError):
    pass


def supervisor(run_dir: str):
    from supervisor.xmlrpc import SupervisorTransport

    sock = os.path.join(run_dir, datadir.SUPERVISOR_SOCKET)
    if not os.path.exists(sock):
        raise ScalingError(f"no supervisord socket at {sock}: is `tailrace serve` running for this data directory?")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=SupervisorTransport(None, None, "unix://" + sock))


def extra_conf_dir(run_dir: str) -> Path:
    return Path(run_dir) / datadir.EXTRA_WORKERS_DIR


def clear_extra_workers(run_dir: str) -> None:
    """At ``serve`` start: the base group covers every worker, no extra programs."""
    d = extra_conf_dir(run_dir)
    if d.is_dir():
        for f in d.glob("*" + datadir.EXTRA_WORKER_SUFFIX):
            f.unlink()


def _processes(sv) -> dict[str, dict]:
    return {f"{p['group']}:{p['name']}": p for p in sv.supervisor.getAllProcessInfo()}


def _base_name(k: int) -> str:
    return f"{BASE_GROUP}:worker-{k}"


def _extra_name(k: int) -> str:
    return f"worker-{k}:worker-{k}"


def start_workers(sv, run_dir: str, ids: list[int]) -> None:
    procs = _processes(sv)
    write = []
    for k in ids:
        for name in (_base_name(k), _extra_name(k)):
            if name in procs:
                if procs[name]["statename"] not in ("RUNNING", "STARTING"):
                    sv.supervisor.startProcess(name, False)
                break
        else:
            write.append(k)
    if not write:
        return
    d = extra_conf_dir(run_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for k in write:
        (d / datadir.extra_worker_conf(k)).write_text(extra_program(k))
    added, _changed, _removed = sv.supervisor.reloadConfig()[0]
    for k in write:
        if f"worker-{k}" in added:
            sv.supervisor.addProcessGroup(f"worker-{k}")  # autostart: starts it


def stop_workers(sv, run_dir: str, ids: list[int]) -> None:
    procs = _processes(sv)
    for k in ids:
        if _base_name(k) in procs:
            if procs[_base_name(k)]["statename"] in ("RUNNING", "STARTING", "BACKOFF"):
                sv.supervisor.stopProcess(_base_name(k), True)
        if _extra_name(k) in procs:
            if procs[_extra_name(k)]["statename"] in ("RUNNING", "STARTING", "BACKOFF"):
                sv.supervisor.stopProcess(_extra_name(k), True)
            sv.supervisor.removeProcessGroup(f"worker-{k}")
        conf = extra_conf_dir(run_dir) / datadir.extra_worker_conf(k)
        if conf.exists():
            conf.unlink()


def running_workers(sv) -> list[int]:
    ids = []
    for name, p in _processes(sv).items():
        if p["statename"] in ("RUNNING", "STARTING", "BACKOFF") and p["name"].startswith("worker-"):
            ids.append(int(p["name"].rsplit("-", 1)[1]))
    return sorted(ids)


def set_workers(s: settings_mod.Settings, bootstrap: str, n: int, timeout_s: float = 120.0, log=print,
                connect_timeout_ms: int = CONNECT_TIMEOUT_MS, **security) -> dict:
    """Grow or shrink a running broker to ``n`` workers; returns the router's final status."""
    if n < 1:
        raise ScalingError(f"workers={n} must be >= 1")
    run_dir = s.ipc_path()
    sv = supervisor(run_dir)
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap, connect_timeout_ms=connect_timeout_ms, **security) as admin:
        before = admin.status()
        old = before["worker_count"]
        if n > old:
            log(f"starting workers {list(range(old, n))}")
            start_workers(sv, run_dir, list(range(old, n)))
        status = admin.set_workers(n)
        while True:
            status = admin.status()
            live = [w for w in status["workers"] if w["worker"] < n]
            settled = (not any(w["retiring"] for w in status["workers"]) and not status["spread_pending"]
                       and len(live) == n and all(w["alive"] for w in live))
            if settled:
                break
            if time.monotonic() > deadline:
                raise ScalingError(f"broker did not settle on {n} workers within {timeout_s:.0f} s: {status['workers']}")
            time.sleep(0.2)
        extra = [k for k in running_workers(sv) if k >= n]
        if extra:
            log(f"stopping retired workers {extra}")
            stop_workers(sv, run_dir, extra)
    return status
