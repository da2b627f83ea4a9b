"""CPU time of processes, read from /proc (no psutil), for the CPU columns of every result.

Some facts about /proc/<pid>/stat: the second field (the command name) is in parentheses and
may itself contain spaces and parentheses, so fields are counted from the *last* ``)``. utime
and stime are fields 14 and 15 (1-based), in clock ticks (``SC_CLK_TCK``, 100 on Linux), and
they cover every thread of the process, so libzmq's I/O thread is counted with the Python one.

What this means for us: a process's CPU share over a run is (ticks after - ticks before) /
CLK_TCK / wall seconds, at 10 ms resolution; fine for runs of a second or more. A process that
exits between the two samples has no "after": it is reported as None, never as zero.
"""

from __future__ import annotations

import os
import resource
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
_UTIME_FIELD = 11  # index of utime after the ")" that closes the command name
_STIME_FIELD = 12
_MINFLT_FIELD = 7  # minor page faults (field 10, 1-based)


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(b")") + 2 :].split()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far, or None if it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[_UTIME_FIELD]) + int(fields[_STIME_FIELD])) / CLK_TCK


def minor_faults(pid: int) -> int | None:
    """Minor page faults of ``pid`` so far (a page mapped in without a disk read), or None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[_MINFLT_FIELD])


def self_cpu_seconds() -> float:
    """CPU seconds of the calling process, all threads (for load generators to report)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CpuMeter:
    """Samples named pids at ``start()`` and ``stop()``; reports CPU seconds and percent of one core."""

    def __init__(self, pids: dict[str, int]):
        self.pids = dict(pids)  # name -> pid
        self._before: dict[str, float | None] = {}
        self._t0 = 0.0
        self.report: dict[str, dict] = {}  # name -> {"pid", "cpu_s", "cpu_pct"}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, dict]:
        wall_s = max(time.monotonic() - self._t0, 1e-9)
        for name, pid in self.pids.items():
            before, after = self._before.get(name), cpu_seconds(pid)
            used = None if before is None or after is None else after - before
            self.report[name] = {
                "pid": pid,
                "cpu_s": None if used is None else round(used, 3),
                "cpu_pct": None if used is None else round(100.0 * used / wall_s, 1),
            }
        return self.report


def machine_info() -> dict:
    """What docs/BENCHMARKS.md needs to say about the machine a figure came from."""
    import platform

    import zmq

    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except OSError:
        pass
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyzmq": zmq.pyzmq_version(),
        "libzmq": zmq.zmq_version(),
    }
