"""Peer brokers for compare.py: Redis Streams, NATS JetStream and RabbitMQ, started and stopped by pid.

Each server runs on 127.0.0.1 on a free port, in a temporary directory, with the durable
configuration documented here and in docs/BENCHMARKS.md; ``stop()`` sends SIGTERM to the pid it
started (SIGKILL after 10 s) and removes the directory. Nothing is installed here: run
``bench/setup_peers.sh`` first (Debian ``redis-server`` and ``nats-server``, pip ``redis`` and
``nats-py``).

Redis (7.0 in Debian 12): ``--appendonly yes`` with ``--appendfsync everysec`` for batched
workloads, ``always`` for ``durable-single`` (the AOF is written and fsynced before the replies
of an event-loop turn go out: a group commit); RDB snapshots off. One stream key per partition.

NATS (2.9 in Debian 12): ``-js`` with file storage in the temporary directory; one stream per
topic capturing ``<topic>.*``. 2.9 cannot fsync before it acks (``sync_interval`` arrived in
2.10): its PubAck means written to the OS, synced every 2 minutes. Its rows are not durable
acks, and docs/BENCHMARKS.md says so next to every figure.

RabbitMQ (3.10 in Debian 12): the work-queue workload only (``RabbitMQSystem.workloads``); a
durable classic queue, persistent messages, its own epmd (RabbitMQSystem).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, name: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} in {timeout_s}s")


class _ServerSystem:
    name = "?"
    gen = "?"

    def __init__(self, data_root: str | None = None):
        self.data_root = data_root
        self.proc: subprocess.Popen | None = None
        self.dir: str | None = None
        self.port = 0

    def command(self, workload: str) -> list[str]:
        raise NotImplementedError

    def start(self, workload: str) -> None:
        exe = self.command(workload)[0]
        if shutil.which(exe) is None:
            raise RuntimeError(f"{exe} not found: run bench/setup_peers.sh")
        self.dir = tempfile.mkdtemp(prefix=f"{self.name}-bench-{workload}-", dir=self.data_root)
        self.port = free_port()
        log = open(os.path.join(self.dir, "server.out"), "ab")
        self.proc = subprocess.Popen(self.command(workload), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        log.close()
        try:
            _wait_port(self.port, self.proc, self.name)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(STOP_TIMEOUT_S)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def pids(self) -> dict[str, int]:
        return {"server": self.proc.pid} if self.proc is not None else {}

    def warm(self, topic: str, partitions: int) -> int:
        return 0  # nothing to adopt: partitions are created on first write

    def version(self) -> str:
        exe = self.command("produce")[0]
        try:
            return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "not installed"


class RedisSystem(_ServerSystem):
    name = "redis"
    gen = "tailrace.bench.gen_redis"

    def __init__(self, data_root: str | None = None, client: str = "blocking"):
        super().__init__(data_root)
        # client="async" (compare --client async): the e2e generators use redis.asyncio as
        # tailrace's use its asyncio client, and the cases end in /async like tailrace's
        # (durable-single's producers are redis.asyncio either way)
        self.case_suffix = "" if client == "blocking" else f"/{client}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def fsync_policy(self, workload: str) -> str:
        return "always" if workload == "durable-single" else "everysec"

    def command(self, workload: str) -> list[str]:
        return ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir or ".",
                "--appendonly", "yes", "--appendfsync", self.fsync_policy(workload), "--save", "",
                "--daemonize", "no", "--protected-mode", "no"]

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0) -> None:
        return None  # a stream key exists once written

    def describe(self) -> dict:
        return {"version": self.version(), "persistence": "AOF, appendfsync everysec (batched) / always (durable-single)"}


class NatsSystem(_ServerSystem):
    name = "nats"
    gen = "tailrace.bench.gen_nats"

    @property
    def endpoint(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self, workload: str) -> list[str]:
        return ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.dir or "."]

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0) -> None:
        asyncio.run(self._create(name))

    async def _create(self, name: str) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        nc = await nats.connect(self.endpoint)
        try:
            await nc.jetstream().add_stream(StreamConfig(name=name, subjects=[f"{name}.*"], storage=StorageType.FILE))
        finally:
            await nc.close()

    def describe(self) -> dict:
        return {"version": self.version(), "persistence": "JetStream file storage; 2.9 acks before fsync"}



RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; /usr/sbin's wrapper would su to the rabbitmq user


class RabbitMQSystem(_ServerSystem):
    """RabbitMQ (3.10 in Debian 12), for the work-queue workload only (``workloads``).

    Started as root straight from Debian's script with ``RUNNING_UNDER_SYSTEMD`` set, so the
    script execs the Erlang VM and the pid is the broker's; everything lives in the temporary
    directory (``HOME`` too, for the Erlang cookie). Its own ``epmd`` (the Erlang port mapper)
    runs on a free loopback port, started and stopped by pid here, so no system-wide epmd is
    left behind. AMQP listens on 127.0.0.1 only; no plugins; the Erlang schedulers do not
    busy-wait (``+sbwt none`` and the dirty ones), which on these 2 cores is RabbitMQ's faster
    setting. Queues are durable classic queues with persistent messages (gen_rabbitmq.py).
    """

    name = "rabbitmq"
    gen = "tailrace.bench.gen_rabbitmq"
    workloads = ("work-queue",)
    START_TIMEOUT_S = 90.0

    def __init__(self, data_root: str | None = None):
        super().__init__(data_root)
        self.epmd: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, workload: str) -> list[str]:
        return [RABBITMQ_SERVER]

    def start(self, workload: str) -> None:
        if not os.path.exists(RABBITMQ_SERVER) or shutil.which("epmd") is None:
            raise RuntimeError("rabbitmq-server not found: run bench/setup_peers.sh")
        self.dir = tempfile.mkdtemp(prefix=f"rabbitmq-bench-{workload}-", dir=self.data_root)
        self.port = free_port()
        epmd_port, dist_port = free_port(), free_port()
        with open(os.path.join(self.dir, "rabbitmq.conf"), "w") as f:
            f.write(f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n")
        env = {**os.environ, "HOME": self.dir, "RUNNING_UNDER_SYSTEMD": "true",
               "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_EPMD_PORT": str(epmd_port),
               "RABBITMQ_NODENAME": f"bench{self.port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
               "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(dist_port),
               "RABBITMQ_CONFIG_FILE": os.path.join(self.dir, "rabbitmq.conf"),
               "RABBITMQ_MNESIA_BASE": os.path.join(self.dir, "mnesia"), "RABBITMQ_LOG_BASE": os.path.join(self.dir, "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(self.dir, "enabled_plugins"),
               "RABBITMQ_PID_FILE": os.path.join(self.dir, "rabbit.pid"), "RABBITMQ_LOGS": "-",
               # no scheduler busy-waiting: on 2 shared cores the spinning schedulers take the CPU the
               # consumers need (RabbitMQ's own advice for small or shared hosts); its best case here
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none"}
        log = open(os.path.join(self.dir, "server.out"), "ab")
        try:
            self.epmd = subprocess.Popen(["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
            _wait_port(epmd_port, self.epmd, "epmd")
            self.proc = subprocess.Popen(self.command(workload), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env)
            _wait_port(self.port, self.proc, self.name, self.START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        finally:
            log.close()

    def stop(self) -> None:
        try:
            super().stop()  # the broker first (SIGTERM: a clean shutdown), then its port mapper
        finally:
            if self.epmd is not None:
                if self.epmd.poll() is None:
                    self.epmd.kill()
                self.epmd.wait(STOP_TIMEOUT_S)
                self.epmd = None

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0) -> None:
        raise NotImplementedError("RabbitMQ runs the work-queue workload only")

    def version(self) -> str:
        try:
            out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        return f"rabbitmq-server {out}" if out else "not installed"

    def describe(self) -> dict:
        return {"version": self.version(), "persistence": "durable classic queue, persistent messages"}
