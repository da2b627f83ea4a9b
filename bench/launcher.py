"""Start and stop a real broker (serve + supervisord + flusher + router + workers) for benches
and tests.

The broker runs as ``tailrace serve`` (it *is* ``python -m tailrace serve``), on a given data
directory and a free loopback port. It is stopped by pid (SIGTERM to ``tailrace serve``, which
stops supervisord, which stops its programs in order); ``kill9`` kills one program by pid to
simulate a crash.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tailrace.client.admin import Admin
from tailrace.client.errors import TailraceError
from tailrace.broker import settings as settings_mod
from tailrace.ops.serve import find_supervisord_conf
from tailrace.shm import region

SUPERVISORD_CONF = find_supervisord_conf()  # the one `tailrace serve` runs (shipped in the package)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Broker:
    def __init__(self, data_dir: Path, workers: int = 2, **settings):
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.bootstrap = f"tcp://127.0.0.1:{self.port}"
        if "metrics_bind" not in settings:  # never the default 9420: many brokers run at once
            metrics_port = free_port()
            while metrics_port == self.port:
                metrics_port = free_port()
            settings["metrics_bind"] = f"127.0.0.1:{metrics_port}"
        self.settings = settings_mod.from_env(
            env={}, data_dir=str(self.data_dir.resolve()), bind=self.bootstrap, workers=workers, **settings
        )
        self.proc: subprocess.Popen | None = None
        self.client: dict = {}  # with auth="curve": key_file and server_key for the broker's own checks

    @property
    def metrics_url(self) -> str:
        return f"http://{self.settings.metrics_bind}/metrics"

    @property
    def run_dir(self) -> str:
        return self.settings.ipc_path()

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(settings_mod.to_env(self.settings))
        return env

    def spawn(self, *extra: str, stdout=None) -> subprocess.Popen:
        """Run ``tailrace serve`` on this data directory without waiting for it (output to
        ``serve.out`` unless ``stdout`` is given)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "serve.out", "ab") if stdout is None else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tailrace", "serve", "--data-dir", str(self.data_dir), *extra],
            env=self.env(), stdout=log if log is not None else stdout, stderr=subprocess.STDOUT,
        )
        if log is not None:
            log.close()
        return self.proc

    def start(self, timeout_s: float = 60.0) -> "Broker":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("this broker is already running (a second start would orphan the first)")
        self.spawn()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}; see {self.data_dir}/serve.out")
            try:
                with Admin(self.bootstrap, timeout_ms=1000, **self.client) as a:
                    st = a.status()
                if all(w["alive"] for w in st["workers"]):
                    return
            except (TailraceError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"broker not ready in {timeout_s}s: {last}; logs in {self.data_dir}/logs")

    def supervisorctl(self, *args: str) -> str:
        """Run ``supervisorctl`` against this broker's supervisord; its output."""
        return subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(SUPERVISORD_CONF), *args],
            env={**self.env(), "TAILRACE_PYTHON": sys.executable, "TAILRACE_LOG_DIR": str(self.data_dir / "logs"),
                 "TAILRACE_RUN_DIR": self.run_dir},
            capture_output=True, text=True, timeout=30,
        ).stdout

    def pids(self) -> dict[str, int]:
        """Program name -> pid, read from supervisorctl."""
        out = self.supervisorctl("status")
        pids = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "RUNNING" and parts[2] == "pid":
                pids[parts[0].split(":")[-1]] = int(parts[3].rstrip(","))
        return pids

    def supervisord_pid(self) -> int:
        """supervisord's pid (``tailrace serve`` runs it as a child and stays in front of it)."""
        return int(Path(self.run_dir, "supervisord.pid").read_text().strip())

    def kill9(self, name: str) -> int:
        pid = self.pids()[name]
        os.kill(pid, signal.SIGKILL)
        return pid

    def hard_kill_all(self) -> float:
        """kill -9 every program with supervisord and ``tailrace serve`` frozen (SIGSTOP), then
        those two: nothing runs, nothing was told to stop (nor restarted), as a host that dies.
        Returns the CLOCK_MONOTONIC time right after the programs' SIGKILLs were sent."""
        pids = self.pids()
        sv = self.supervisord_pid()
        for pid in (self.proc.pid, sv):
            os.kill(pid, signal.SIGSTOP)
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed = time.monotonic()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
            time.sleep(0.02)
        for pid in (sv, self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(sv):
            time.sleep(0.02)
        self.proc = None
        return killed

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM supervisord (by pid) and wait; returns its exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def shm_regions(self) -> list[str]:
        return region.list_instance_regions(self.settings.instance)

    def cleanup_shm(self) -> None:
        """Unlink the broker's shared memory and remove its ipc directory (sockets, locks)."""
        for name in self.shm_regions():
            region.unlink(name)
        if self.proc is None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        self.cleanup_shm()
