"""``tailrace cluster status`` and ``tailrace dev-cluster`` (tailrace/cluster_commands.py), run as
the user runs them: as subprocesses, against real brokers and a real etcd.

cluster status: two brokers (bench/launcher.py) in a cluster of their own name on the session's
etcd; a 4-partition topic made through any broker; the JSON names both brokers (endpoint, pid),
the controller and its epoch, and the 4 partitions led 2 and 2; the table names both brokers;
a broker stopped shows as down with its 2 partitions unavailable; an etcd nobody runs is one
line on stderr and exit code 1.

dev-cluster: 2 brokers and an etcd of its own; a topic made, produced to and consumed from over
the bootstrap it prints; SIGINT stops it with exit code 0 within 60 s, and every process it
started (each broker's serve, supervisord and programs, and etcd) is gone, shared memory too.
Every broker started here is stopped by its pid in a finally.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tailrace.bench.launcher import Broker, free_port
from tailrace.broker.settings import instance_of
from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer
from tailrace.client.errors import TailraceError
from tailrace.client.producer import Producer
from tailrace.shm import region

from .conftest import wait_until

TOPIC = "events"


def tailrace(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TAILRACE_BOOTSTRAP", "TAILRACE_CLUSTER", "TAILRACE_CLUSTER_NAME")}
    return subprocess.run([sys.executable, "-m", "tailrace", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


def cluster_view(bootstrap: str) -> dict:
    """STATUS's ``cluster`` of one broker ({} when it does not answer)."""
    try:
        with Admin(bootstrap, timeout_ms=1000, connect_timeout_ms=1000) as a:
            return a.status().get("cluster") or {}
    except TailraceError:
        return {}


def status_json(endpoint: str, name: str | None = None) -> dict:
    argv = ["cluster", "status", "--cluster", f"etcd://{endpoint}", "--json"]
    r = tailrace(*argv, *(["--cluster-name", name] if name else []))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def two_brokers(etcd_server, cluster_name, tmp_path):
    brokers = [Broker(tmp_path / f"broker-{i}", workers=1, cluster=etcd_server.endpoint, broker_id=i, cluster_ttl_s=3,
                      cluster_name=cluster_name, segment_bytes=8 << 20, shm_budget_bytes=512 << 20) for i in range(2)]
    try:
        for b in brokers:
            b.start()
        # both registered and a controller elected, as each broker sees it: topic creation places on both
        for b in brokers:
            assert wait_until(lambda: len(cluster_view(b.bootstrap).get("brokers", {})) == 2
                              and cluster_view(b.bootstrap).get("controller", -1) >= 0, 30), cluster_view(b.bootstrap)
        yield brokers
    finally:
        for b in brokers:  # SIGTERM to both at once (by pid), then wait for each
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGTERM)
        for b in brokers:
            b.stop()
        for b in brokers:
            b.cleanup_shm()


def test_cluster_status_names_the_brokers_the_controller_and_who_leads_each_partition(etcd_server, cluster_name,
                                                                                      two_brokers):
    with Admin(two_brokers[1].bootstrap) as admin:  # the controller may be the other one: Admin follows NOT_CONTROLLER
        admin.create_topic(TOPIC, 4)
    pids = {}
    for i, b in enumerate(two_brokers):
        with Admin(b.bootstrap) as admin:
            pids[i] = admin.status()["pid"]
    view = cluster_view(two_brokers[0].bootstrap)

    doc = status_json(etcd_server.endpoint, cluster_name)
    assert doc["cluster"] == cluster_name
    assert doc["controller"] == {"broker": view["controller"], "epoch": view["controller_epoch"]}
    assert doc["controller"]["broker"] in (0, 1) and doc["controller"]["epoch"] > 0
    brokers = {b["id"]: b for b in doc["brokers"]}
    assert sorted(brokers) == [0, 1]
    for i, b in enumerate(two_brokers):
        row = brokers[i]
        assert row["live"] and row["endpoint"] == b.bootstrap and row["rack"] is None, row
        assert row["pid"] == pids[i], (row, pids)  # on this host: learned from the broker's STATUS
        assert row["controller"] == (i == doc["controller"]["broker"])
        assert row["partitions_led"] == 2, doc  # 4 partitions over two brokers: 2 and 2
    assert [(t["name"], t["partitions"]) for t in doc["topics"]] == [(TOPIC, 4)]
    parts = [p for p in doc["partitions"] if p["topic"] == TOPIC]
    assert sorted(p["partition"] for p in parts) == [0, 1, 2, 3]
    assert sorted(p["leader"] for p in parts) == [0, 0, 1, 1]
    assert all(p["available"] and p["replicas"] == [p["leader"]] for p in parts), parts
    assert doc["unavailable"] == []

    r = tailrace("cluster", "status", "--cluster", f"etcd://{etcd_server.endpoint}", "--cluster-name", cluster_name)
    assert r.returncode == 0, r.stderr
    for i, b in enumerate(two_brokers):  # a row per broker: its id, then its endpoint
        assert re.search(rf"^\s*{i}\s+{re.escape(b.bootstrap)}\s", r.stdout, re.M), r.stdout
    assert f"controller broker {doc['controller']['broker']} (epoch {doc['controller']['epoch']})" in r.stdout, r.stdout
    assert "all 4 partitions have a live leader" in r.stdout, r.stdout

    # a broker stopped: down, and the 2 partitions it led have no leader (replication factor 1)
    two_brokers[1].stop()
    gone = wait_until(lambda: (lambda d: d if len(d["unavailable"]) == 2 else None)(
        status_json(etcd_server.endpoint, cluster_name)), 30, interval_s=0.5)
    assert gone, status_json(etcd_server.endpoint, cluster_name)
    down = {b["id"]: b for b in gone["brokers"]}[1]
    assert not down["live"] and down["endpoint"] is None and down["partitions_led"] == 0, down
    assert all(u["leader"] == -1 and u["replicas"] == [1] for u in gone["unavailable"]), gone["unavailable"]
    assert {b["id"]: b for b in gone["brokers"]}[0]["partitions_led"] == 2
    r = tailrace("cluster", "status", "--cluster", f"etcd://{etcd_server.endpoint}", "--cluster-name", cluster_name)
    assert r.returncode == 0 and "2 partitions unavailable" in r.stdout and re.search(r"^\s*1\s+-\s.*down", r.stdout, re.M), r.stdout


def test_cluster_status_with_no_etcd_is_one_line_and_exit_code_1():
    port = free_port()
    t0 = time.monotonic()
    r = tailrace("cluster", "status", "--cluster", f"etcd://127.0.0.1:{port}")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and f"no etcd answered at 127.0.0.1:{port}" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 20
    r = tailrace("cluster", "status")  # no --cluster, no $TAILRACE_CLUSTER: a usage error
    assert r.returncode == 2 and "--cluster" in r.stderr, r.stderr


# --- dev-cluster ---------------------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) of a live process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below ``root``."""
    children: dict[int, list[int]] = {}
    starts = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry))
                starts[int(entry)] = st[2]
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return out


def still_running(procs: dict[int, int]) -> list[int]:
    """The ones of ``procs`` (pid -> start time) that are still there (a zombie is gone)."""
    left = []
    for pid, start in procs.items():
        st = _proc_stat(pid)
        if st is not None and st[2] == start and st[0] != "Z":
            left.append(pid)
    return left


@pytest.mark.parametrize("auth", ["none", "curve"])
def test_dev_cluster_serves_produce_and_consume_and_ctrl_c_stops_every_process_it_started(tmp_path, auth):
    top = tmp_path / "dev"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILRACE_")}
    proc = subprocess.Popen([sys.executable, "-m", "tailrace", "dev-cluster", "--brokers", "2", "--dir", str(top),
                             "--auth", auth], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    out: list[str] = []

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    started: dict[int, int] = {}
    serve_pids: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 150
        bootstrap = None
        while bootstrap is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "dev-cluster exited before it was ready:\n" + "".join(out)
            out.append(line)
            m = re.match(r"broker (\d+)\s+\S+\s+pid (\d+)", line)
            if m:
                serve_pids[int(m.group(1))] = int(m.group(2))
            if line.startswith("bootstrap: "):
                bootstrap = line.split(":", 1)[1].strip()
        keys: dict = {}
        while True:  # the hint lines, up to the cluster status one
            line = lines.get(timeout=10)
            out.append(line)
            m = re.search(r"TAILRACE_KEY_FILE=(\S+) TAILRACE_SERVER_KEY=(\S+)", line)
            if m:  # --auth curve: the client the cluster's allow-list lets in
                keys = {"key_file": m.group(1), "server_key": m.group(2)}
            if "cluster status --cluster" in line:
                break
        assert bool(keys) == (auth == "curve"), out
        if keys:  # without the keys every broker refuses
            with Admin(bootstrap, timeout_ms=3000) as admin, pytest.raises(TailraceError, match="CURVE"):
                admin.list_topics()
        etcd = re.search(r"--cluster etcd://(\S+)", line).group(1)
        addresses = bootstrap.split(",")
        assert len(addresses) == 2 and all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in addresses), bootstrap
        assert sorted(serve_pids) == [0, 1], out
        started = descendants(proc.pid)
        assert set(serve_pids.values()) <= set(started), (serve_pids, started)
        assert len(started) >= 2 * 5 + 1, started  # etcd; per broker serve, supervisord, router, flusher, metrics, worker

        client = bootstrap  # the printed list as it is (clients take a bootstrap list)
        with Admin(client, **keys) as admin:
            admin.create_topic(TOPIC, 4)
        sent = [f"record-{i}".encode() for i in range(20)]
        with Producer(client, **keys) as producer:
            for i, value in enumerate(sent):
                producer.send(TOPIC, value, partition=i % 4)
            producer.flush()
        got: list[bytes] = []
        with Consumer(client, max_wait_ms=100, **keys) as consumer:
            consumer.assign(TOPIC, start="earliest")
            until = time.monotonic() + 30
            while len(got) < len(sent) and time.monotonic() < until:
                got.extend(r.value for r in consumer.poll(200))
        assert sorted(got) == sorted(sent)

        doc = status_json(etcd)  # the default cluster name
        assert sorted(b["id"] for b in doc["brokers"] if b["live"]) == [0, 1], doc
        assert sorted(b["partitions_led"] for b in doc["brokers"]) == [2, 2], doc
        assert {b["id"]: b["endpoint"] for b in doc["brokers"]} == {i: f"tcp://{a}" for i, a in enumerate(addresses)}

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(out)
        while (line := lines.get(timeout=10)) is not None:
            out.append(line)
        assert "stopped" in out[-1], out
        left = wait_until(lambda: not still_running(started), 10)
        assert left, f"left running: {still_running(started)}"
        for i in range(2):
            assert not region.list_instance_regions(instance_of(str(top / f"broker-{i}")))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # its clean stop; then by pid whatever is left
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in serve_pids.values():
            if pid in still_running(started):
                os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not still_running(started), 30)
        for pid in still_running(started):
            os.kill(pid, signal.SIGKILL)
        for i in range(2):
            for name in region.list_instance_regions(instance_of(str(top / f"broker-{i}"))):
                region.unlink(name)
