"""A broker program's life: dying with its supervisor, stopping on signals, and who holds a lock.

Some facts about Linux that this module depends on:

- ``prctl(PR_SET_PDEATHSIG, sig)`` makes the kernel send ``sig`` to a process when the thread
  that forked it dies, SIGKILL included. It is kept across execve (for non-setuid programs) and
  cleared by fork. A process whose parent died *before* it asked is already orphaned and must
  check for itself.
- supervisord closes every descriptor above 2 in the programs it starts, and puts each in its
  own process group, so a terminal's SIGINT or SIGHUP never reaches them.
- ``/proc/<pid>/fd`` lists a process's open files (ours only, unless root): how a refusal names
  the pids that hold a data directory's lock.

broker/datadir.py uses these for its locks and re-exports what the programs call
(``datadir.stop_on_signals``, ``datadir.pdeathsig_preexec``).
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1


def holders(path: str | os.PathLike) -> list[int]:
    """Pids of the live processes that have ``path`` open (from /proc; ours only, unless root)."""
    target = os.path.realpath(path)
    me, found = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(f"{fd_dir}/{fd}") == target:
                        found.append(int(pid))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return sorted(found)


def process_name(pid: int) -> str:
    """``tailrace serve``, ``supervisord``, ``flusher``, ``worker 3``... from the command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    words = [a for a in argv if a]
    for i, a in enumerate(words):
        if a == "-m" and i + 1 < len(words):
            mod = words[i + 1].rsplit(".", 1)[-1]
            rest = words[i + 2:]
            if mod == "worker" and "--id" in rest:
                return f"worker {rest[rest.index('--id') + 1]}" if rest.index("--id") + 1 < len(rest) else "worker"
            if mod in ("cli", "tailrace", "__main__") and "serve" in rest:
                return "tailrace serve"
            return "supervisord" if mod == "supervisord" else mod
    if any(w.endswith("supervisord") for w in words[:2]):
        return "supervisord"
    if "serve" in words[1:3]:
        return "tailrace serve"
    return os.path.basename(words[0]) if words else "?"


def in_use_message(data_dir, pids: list[int], what: str = "a running broker") -> str:
    named = ", ".join(f"{p} ({process_name(p)})" for p in pids) or "unknown (they exited just now?)"
    top = [p for p in pids if process_name(p) in ("tailrace serve", "supervisord")]
    how = (f"stop it with `kill {top[0]}` (SIGTERM: a clean stop)" if top else
           f"stop them with `kill {' '.join(map(str, pids))}` (SIGTERM: each stops cleanly)" if pids else "try again")
    return f"data directory {data_dir} is in use by {what}: pids {named}; {how}"


def _prctl_pdeathsig(sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``sig`` when our parent dies; if it died already, send it now.

    Under supervisord (``SUPERVISOR_ENABLED``) the parent must be supervisord: a program whose
    supervisord died while it was starting has been re-parented already."""
    ppid = os.getppid()
    _prctl_pdeathsig(sig)
    orphaned = os.getppid() != ppid
    if os.environ.get("SUPERVISOR_ENABLED") and process_name(os.getppid()) != "supervisord":
        orphaned = True
    if orphaned:
        os.kill(os.getpid(), sig)


def pdeathsig_preexec(parent_pid: int, sig: int = signal.SIGTERM):
    """A ``preexec_fn`` for subprocess: the child gets ``sig`` when ``parent_pid`` dies."""

    def preexec() -> None:
        _prctl_pdeathsig(sig)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def stop_on_signals(stop: list) -> None:
    """SIGTERM, SIGINT and SIGHUP ask for a clean stop (``stop`` gets an item); a second one
    exits at once. SIGHUP too: the kernel sends it to a stopped program whose supervisor died
    (an orphaned process group), and a program has no configuration to reload."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1) if not stop else os._exit(1))
