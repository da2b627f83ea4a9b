"""``tailrace cluster status`` and ``tailrace dev-cluster``: a cluster of brokers from the shell.

cluster status reads etcd itself (cluster/metadata.py's keys and values, the whole cluster at one
revision: no broker needs to be up) and prints the brokers (id, advertised endpoint, rack, and
the pid a broker on this host reports), the controller (broker and epoch) and the partitions:
how many each broker leads and which have no live leader (unavailable). A table, or one JSON
object with ``--json``.

dev-cluster runs a cluster on this machine for trying things out: one etcd and N brokers, each a
``tailrace serve --cluster ...`` on loopback in a directory of its own, until Ctrl-C or SIGTERM
stops the brokers (SIGTERM to each ``tailrace serve``, waited for) and then etcd. If it is killed
itself, its children still go (PR_SET_PDEATHSIG: SIGTERM, a clean stop, to each broker; SIGKILL
to etcd); each runs in a process group of its own, so a terminal's Ctrl-C reaches them only
through here, in that order. Its ports are kept in ``DIR/dev-cluster.json`` and taken again
when free, so a restarted dev cluster has the same bootstrap (and its topics and records).

``tailrace.cluster`` is imported inside the commands only: a single host never imports it (nor
etcd's client, which ``cluster status`` needs: the ``cluster`` extra).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod
from tailrace.broker.lifetime import pdeathsig_preexec
from tailrace.client.admin import Admin
from tailrace.client.connection import parse_bootstrap
from tailrace.client.errors import TailraceError
from tailrace.console import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from tailrace.tables import print_json, print_table

PID_TIMEOUT_MS = 1000  # asking a broker on this host for its pid waits at most this long
EXTRA = "pip install 'tailrace[cluster]'"


# --- cluster status ------------------------------------------------------------------------------
def cmd_cluster(args) -> int:
    return cluster_status(args)  # the one subcommand so far


def cluster_status(args) -> int:
    where = "tailrace cluster status"
    if not args.cluster:
        print(f"{where}: give --cluster etcd://HOST:PORT (or set $TAILRACE_CLUSTER)", file=sys.stderr)
        return EXIT_USAGE
    try:
        from tailrace.cluster.errors import ClusterError, EtcdUnavailable
        from tailrace.cluster.etcd import Etcd
        from tailrace.cluster.metadata import Keys
    except ImportError as exc:
        print(f"{where}: needs the cluster extra ({EXTRA}): {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        etcd = Etcd(args.cluster, timeout_s=2.0)
        keys = Keys(args.cluster_name)
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        doc = read_cluster(etcd, keys)
    except EtcdUnavailable:
        at = ",".join(f"{h}:{p}" for h, p in etcd.endpoints)
        print(f"{where}: no etcd answered at {at} within {etcd.timeout_s:.0f} s (is it running? `tailrace dev-cluster` "
              "starts one)", file=sys.stderr)
        return EXIT_ERROR
    except ClusterError as exc:
        print(f"{where}: etcd at {args.cluster}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    doc["etcd"] = args.cluster
    pids = local_pids({b["id"]: b["endpoint"] for b in doc["brokers"] if b["live"] and b["endpoint"]})
    for b in doc["brokers"]:
        b["pid"] = pids.get(b["id"])
    if args.json:
        print_json(doc)
    else:
        print_status(doc)
    return EXIT_OK


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def read_cluster(etcd, keys) -> dict:
    """What etcd holds for one cluster, as builtins (the ``--json`` object without ``etcd`` and
    the pids)."""
    from tailrace.cluster.metadata import (NO_LEADER, BrokerInfo, ControllerInfo, PartitionAssignment, TopicMeta,
                                           decode)

    # one read of the cluster's whole prefix: brokers, controller, topics and assignments as of one
    # revision (separate reads could show a topic without its partitions, or miss a broker)
    kvs, revision = etcd.get_prefix(keys.root)
    brokers, topics, assignments, controller = {}, {}, {}, None
    for kv in kvs:
        if kv.key == keys.controller:
            controller = (decode(kv, ControllerInfo).broker, kv.create_revision)  # the epoch: its create revision
        elif kv.key.startswith(keys.brokers):
            b = decode(kv, BrokerInfo)
            brokers[b.id] = b
        elif kv.key.startswith(keys.topics):
            t = decode(kv, TopicMeta)
            topics[t.name] = (t, kv.create_revision)  # the topic id: its create revision
        elif kv.key.startswith(keys.partitions):
            a = decode(kv, PartitionAssignment)
            assignments[(a.topic, a.partition)] = (a, kv.mod_revision)
    led: dict[int, int] = {}
    partitions, unavailable, under = [], [], []
    for (topic, p), (a, _mod) in sorted(assignments.items()):
        available = a.leader != NO_LEADER and a.leader in brokers
        if available:
            led[a.leader] = led.get(a.leader, 0) + 1
        else:
            unavailable.append({"topic": topic, "partition": p, "leader": a.leader, "replicas": list(a.replicas)})
        if available and len(a.isr) < len(a.replicas):  # Kafka's under-replicated partitions
            under.append({"topic": topic, "partition": p, "leader": a.leader, "replicas": list(a.replicas),
                          "isr": list(a.isr)})
        partitions.append({"topic": topic, "partition": p, "leader": a.leader, "leader_epoch": a.leader_epoch,
                           "replicas": list(a.replicas), "isr": list(a.isr), "available": available,
                           "target": list(a.target)})  # a reassignment under way: where it goes ([]: none)
    # brokers that are registered, and those that hold replicas but are not (down)
    known = set(brokers) | {r for (a, _mod) in assignments.values() for r in a.replicas} | \
        {a.leader for (a, _mod) in assignments.values() if a.leader != NO_LEADER}
    ctl_id, ctl_epoch = controller if controller is not None else (None, None)
    rows = []
    for bid in sorted(known):
        b = brokers.get(bid)
        rows.append({"id": bid, "live": b is not None,
                     "endpoint": (b.endpoints[0] if b is not None and b.endpoints else None),
                     "rack": b.rack if b is not None else None, "started": b.started if b is not None else None,
                     "controller": bid == ctl_id, "partitions_led": led.get(bid, 0),
                     "replicas": sum(1 for (a, _mod) in assignments.values() if bid in a.replicas)})
    return {
        "cluster": keys.cluster,
        "revision": revision,
        "controller": None if controller is None else {"broker": ctl_id, "epoch": ctl_epoch},
        "brokers": rows,
        "topics": [{"name": name, "topic_id": tid, "partitions": meta.partitions,
                    "replication_factor": meta.replication_factor, "config": dict(meta.config)}
                   for name, (meta, tid) in sorted(topics.items())],
        "partitions": partitions,
        "unavailable": unavailable,
        "under_replicated": under,
    }


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is one of this machine's addresses: one can bind
    a socket to it."""
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _type, _proto, _name, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def local_pids(endpoints: dict[int, str]) -> dict[int, int]:
    """Broker id -> the pid its STATUS reports, for the brokers on this host that answer within
    PID_TIMEOUT_MS (asked all at once); the others are left out."""
    def pid_of(endpoint: str) -> int | None:
        try:
            host = parse_bootstrap(endpoint).removeprefix("tcp://").rpartition(":")[0]
            if not is_local_host(host):
                return None
            with Admin(endpoint, timeout_ms=PID_TIMEOUT_MS, connect_timeout_ms=PID_TIMEOUT_MS) as admin:
                return int(admin.status()["pid"])
        except Exception:  # noqa: BLE001 - a pid is a nicety: a broker that cannot say has none
            return None

    if not endpoints:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as pool:
        found = dict(zip(endpoints, pool.map(pid_of, endpoints.values())))
    return {bid: pid for bid, pid in found.items() if pid is not None}


def print_status(doc: dict) -> None:
    ctl = doc["controller"]
    live = [b for b in doc["brokers"] if b["live"]]
    head = (f"cluster {doc['cluster']} on etcd {doc['etcd']}: {_n(len(live), 'broker')} live, controller "
            + (f"broker {ctl['broker']} (epoch {ctl['epoch']})" if ctl else "none (no broker holds the controller key)"))
    print_table(["broker", "endpoint", "rack", "pid", "state", "partitions led"],
                [[b["id"], b["endpoint"] or "-", b["rack"] or "-", b.get("pid") or "-",
                  "controller" if b["controller"] else "live" if b["live"] else "down", b["partitions_led"]]
                 for b in doc["brokers"]], title=head)
    if not doc["brokers"]:
        print(f"no broker is registered in cluster {doc['cluster']!r} (another --cluster-name?)")
    if doc["topics"]:
        by_topic: dict[str, dict[int, int]] = {}
        down: dict[str, int] = {}
        for p in doc["partitions"]:
            if p["available"]:
                counts = by_topic.setdefault(p["topic"], {})
                counts[p["leader"]] = counts.get(p["leader"], 0) + 1
            else:
                down[p["topic"]] = down.get(p["topic"], 0) + 1
        print()
        print_table(["topic", "partitions", "leaders (broker: partitions)", "unavailable"],
                    [[t["name"], t["partitions"],
                      ", ".join(f"{b}: {n}" for b, n in sorted(by_topic.get(t["name"], {}).items())) or "-",
                      down.get(t["name"], 0)] for t in doc["topics"]])
    if doc["unavailable"]:
        print()
        print_table(["topic", "partition", "leader", "replicas"],
                    [[u["topic"], u["partition"], u["leader"], ",".join(map(str, u["replicas"]))] for u in doc["unavailable"]],
                    title=f"{_n(len(doc['unavailable']), 'partition')} unavailable (no live leader: they come back with "
                          "a broker of their ISR)")
    elif doc["partitions"]:
        n = len(doc["partitions"])
        print(f"\nall {n} partitions have a live leader" if n > 1 else "\nthe one partition has a live leader")
    moving = [p for p in doc["partitions"] if p.get("target")]
    if moving:
        print()
        print_table(["topic", "partition", "replicas", "isr", "moving to"],
                    [[p["topic"], p["partition"], ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])),
                      ",".join(map(str, p["target"]))] for p in moving],
                    title=f"{_n(len(moving), 'partition')} being reassigned (done once the new replicas are in sync)")
    if doc.get("under_replicated"):
        print()
        print_table(["topic", "partition", "leader", "replicas", "isr"],
                    [[u["topic"], u["partition"], u["leader"], ",".join(map(str, u["replicas"])), ",".join(map(str, u["isr"]))]
                     for u in doc["under_replicated"]],
                    title=f"{_n(len(doc['under_replicated']), 'partition')} under-replicated (fewer in-sync replicas than replicas)")


# --- dev-cluster ---------------------------------------------------------------------------------
STATE_FILE = datadir.DEV_CLUSTER_STATE  # the ports of the last run, taken again when free (a stable bootstrap)
LOCK_FILE = datadir.DEV_CLUSTER_LOCK  # held while a dev-cluster runs on the directory
READY_TIMEOUT_S = 90.0  # a restarted broker first waits out its old registration (TTL + 2 s)
STOP_TIMEOUT_S = 60.0  # a broker not stopped by then is killed


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Ports:
    """Free loopback ports, never the same one twice."""

    def __init__(self):
        self.taken: set[int] = set()

    def take(self, wanted: int | None = None) -> int:
        if wanted and wanted not in self.taken and _port_free(wanted):
            self.taken.add(wanted)
            return wanted
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in self.taken:
                self.taken.add(port)
                return port


class _Broker:
    def __init__(self, broker_id: int, data_dir: Path, port: int, metrics_port: int, auth: str = "none"):
        self.id = broker_id
        self.data_dir = data_dir
        self.port = port
        self.metrics_port = metrics_port
        self.auth = auth
        self.client: dict = {}  # with --auth curve: the admin client's key_file and server_key
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.data_dir / datadir.SERVE_OUT

    def argv(self, etcd_endpoint: str, workers: int) -> list[str]:
        return [sys.executable, "-m", "tailrace", "serve", "--data-dir", str(self.data_dir),
                "--bind", f"tcp://{self.address}", "--cluster", f"etcd://{etcd_endpoint}",
                "--broker-id", str(self.id), "--metrics-bind", f"127.0.0.1:{self.metrics_port}",
                "--workers", str(workers), "--auth", self.auth]

    def spawn(self, etcd_endpoint: str, workers: int, env: dict) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            # its own process group (a terminal's Ctrl-C reaches it through us, after nothing
            # else), and SIGTERM when we die, whatever kills us
            self.proc = subprocess.Popen(self.argv(etcd_endpoint, workers), env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, process_group=0,
                                         preexec_fn=pdeathsig_preexec(os.getpid(), signal.SIGTERM))

    def ready(self, brokers: int) -> str:
        """"" once it answers STATUS with every worker alive and sees all ``brokers`` registered
        and a controller; else what it lacks."""
        try:
            with Admin(f"tcp://{self.address}", timeout_ms=1000, connect_timeout_ms=1000, **self.client) as admin:
                st = admin.status()
        except (TailraceError, OSError) as exc:
            return _one_line(exc)
        cl = st.get("cluster") or {}
        if not all(w["alive"] for w in st["workers"]):
            return "its workers are not all up"
        if len(cl.get("brokers", {})) < brokers:
            return f"it sees brokers {sorted(int(b) for b in cl.get('brokers', {}))} registered, not all {brokers}"
        if cl.get("controller", -1) < 0:
            return "it sees no controller yet"
        return ""

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no output)"


def cmd_dev_cluster(args) -> int:
    where = "tailrace dev-cluster"
    try:
        from tailrace.cluster.etcd_server import EtcdServer, etcd_binary

        etcd_binary()
    except (ImportError, FileNotFoundError) as exc:
        print(f"{where}: needs etcd ({EXTRA}): {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.base_port is not None and args.base_port + args.brokers - 1 > 65535:
        print(f"{where}: --base-port {args.base_port} leaves no room for {args.brokers} brokers", file=sys.stderr)
        return EXIT_USAGE
    # Ctrl-C stops it even when started with SIGINT ignored (`&` in a script): as SIGTERM does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    top = Path(args.dir).resolve()
    top.mkdir(parents=True, exist_ok=True)
    lock = open(top / LOCK_FILE, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        print(f"{where}: {top} is in use by another tailrace dev-cluster", file=sys.stderr)
        return EXIT_ERROR
    try:
        return _run_dev_cluster(args, top, EtcdServer)
    finally:
        lock.close()


def _run_dev_cluster(args, top: Path, EtcdServer) -> int:
    where = "tailrace dev-cluster"
    try:
        last = json.loads((top / STATE_FILE).read_text())
    except (OSError, ValueError):
        last = {}
    ports = _Ports()
    brokers: list[_Broker] = []
    if args.base_port is not None:
        busy = [p for p in range(args.base_port, args.base_port + args.brokers) if not _port_free(p)]
        if busy:
            print(f"{where}: port {busy[0]} on 127.0.0.1 is in use (another --base-port?)", file=sys.stderr)
            return EXIT_ERROR
        ports.taken.update(range(args.base_port, args.base_port + args.brokers))
    before = {b.get("id"): b for b in last.get("brokers", []) if isinstance(b, dict)}
    for i in range(args.brokers):
        was = before.get(i, {})
        port = args.base_port + i if args.base_port is not None else ports.take(was.get("port"))
        brokers.append(_Broker(i, top / datadir.dev_broker_dir(i), port, ports.take(was.get("metrics_port")), args.auth))
    client = _curve_keys(top, brokers) if args.auth == "curve" else {}
    etcd = EtcdServer(top / datadir.DEV_CLUSTER_ETCD_DIR, fsync=True, name="tailrace-dev-etcd")
    etcd.client_port = ports.take(last.get("etcd_client_port"))
    etcd.peer_port = ports.take(last.get("etcd_peer_port"))
    (top / STATE_FILE).write_text(json.dumps({
        "etcd_client_port": etcd.client_port, "etcd_peer_port": etcd.peer_port,
        "brokers": [{"id": b.id, "port": b.port, "metrics_port": b.metrics_port, "data_dir": str(b.data_dir)}
                    for b in brokers]}, indent=2) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TAILRACE_IPC_DIR", "TAILRACE_ADVERTISE")}
    reported: set[int] = set()
    try:
        _say(f"starting etcd on 127.0.0.1:{etcd.client_port} (data {top / datadir.DEV_CLUSTER_ETCD_DIR}) and {_n(len(brokers), 'broker')} ...")
        try:
            etcd.start()
            if client:  # the cluster's allow-list lets the admin client in, on every broker
                from tailrace.cluster.access import ClusterAccess
                from tailrace.cluster.errors import ClusterError
                from tailrace.cluster.etcd import Etcd
                try:
                    ClusterAccess(Etcd(etcd.endpoint, timeout_s=10.0), settings_mod.Settings(data_dir="").cluster_name).allow(
                        datadir.DEV_CLUSTER_CLIENT, client["public"])
                except (ClusterError, ValueError) as exc:
                    raise RuntimeError(f"the admin client's key could not be allowed: {exc}") from exc
        except RuntimeError as exc:
            print(f"{where}: {_one_line(exc)}", file=sys.stderr)
            return EXIT_ERROR
        client.pop("public", None)
        for b in brokers:
            b.client = client
        for b in brokers:
            b.spawn(etcd.endpoint, args.workers, env)
        t0 = time.monotonic()
        waiting = {b.id: "not asked yet" for b in brokers}
        while waiting:
            for b in brokers:
                if b.id not in waiting:
                    continue
                if b.proc.poll() is not None:
                    print(f"{where}: broker {b.id} exited with {b.proc.returncode} at start ({b.log}):\n{b.log_tail()}",
                          file=sys.stderr)
                    return EXIT_ERROR
                waiting[b.id] = b.ready(len(brokers))
                if not waiting[b.id]:
                    del waiting[b.id]
            if waiting and time.monotonic() - t0 > READY_TIMEOUT_S:
                for bid, why in sorted(waiting.items()):
                    print(f"{where}: broker {bid} not ready within {READY_TIMEOUT_S:.0f} s: {why} "
                          f"(see {brokers[bid].data_dir / datadir.LOG_DIR})", file=sys.stderr)
                return EXIT_ERROR
            if waiting:
                time.sleep(0.2)
        _say(f"etcd      127.0.0.1:{etcd.client_port}  pid {etcd.pid}  data {top / datadir.DEV_CLUSTER_ETCD_DIR}")
        for b in brokers:
            _say(f"broker {b.id}  {b.address}  pid {b.proc.pid}  data {b.data_dir}  "
                 f"metrics http://127.0.0.1:{b.metrics_port}/metrics  output {b.log}")
        hint = ",".join(b.address for b in brokers)  # a bootstrap list: any broker answers for all
        _say(f"{_n(len(brokers), 'broker')} ready in {time.monotonic() - t0:.1f} s; Ctrl-C stops them, then etcd.")
        _say("")
        _say(f"bootstrap: {hint}")
        if client:
            _say(f"auth: CURVE; as the allowed client: export TAILRACE_KEY_FILE={client['key_file']} "
                 f"TAILRACE_SERVER_KEY={client['server_key']}")
            _say(f"     (more clients: tailrace keys allow NAME NAME.key --cluster etcd://127.0.0.1:{etcd.client_port})")
        _say(f"try: tailrace topic create t --partitions 6 --bootstrap {hint}")
        _say(f"     printf 'hello\\nworld\\n' | tailrace produce t --bootstrap {hint}")
        _say(f"     tailrace consume t --bootstrap {hint} --timeout-ms 1000")
        _say(f"     tailrace cluster status --cluster etcd://127.0.0.1:{etcd.client_port}")
        while True:  # until a signal: report a child that went away, keep the rest running
            time.sleep(1.0)
            for b in brokers:
                if b.id not in reported and b.proc.poll() is not None:
                    reported.add(b.id)
                    _say(f"broker {b.id} exited with {b.proc.returncode} (see {b.log}); its partitions are unavailable")
            if -1 not in reported and etcd.proc.poll() is not None:
                reported.add(-1)
                _say(f"etcd exited with {etcd.proc.returncode} (see {etcd.log_path}); the brokers keep their last assignments")
    except KeyboardInterrupt:  # Ctrl-C, or console.Stopped (SIGTERM, SIGHUP): a clean stop is the way out
        pass
    finally:
        _stop_all(brokers, etcd)
    return EXIT_OK


def _curve_keys(top: Path, brokers: list[_Broker]) -> dict:
    """--auth curve: one server key pair for every broker (made in broker 0's data directory,
    copied to the others before their first start, as an operator would) and the admin client's
    pair under DIR/keys; both kept across runs. Its client options, and its public key."""
    from tailrace.broker import auth

    first = auth.auth_dir(str(brokers[0].data_dir))
    auth.server_keys(str(brokers[0].data_dir))
    for b in brokers[1:]:
        mine = auth.auth_dir(str(b.data_dir))
        os.makedirs(mine, mode=0o700, exist_ok=True)
        for name in (datadir.public_key_name(datadir.SERVER_KEY), datadir.secret_key_name(datadir.SERVER_KEY)):
            if not os.path.exists(os.path.join(mine, name)):
                shutil.copy2(os.path.join(first, name), mine)
    keys = top / datadir.DEV_CLUSTER_KEYS_DIR
    public, secret = auth.ensure_keys(str(keys), datadir.DEV_CLUSTER_CLIENT)
    return {"key_file": str(keys / datadir.secret_key_name(datadir.DEV_CLUSTER_CLIENT)),
            "server_key": os.path.join(first, datadir.public_key_name(datadir.SERVER_KEY)), "public": public}


def _say(line: str) -> None:
    print(line, flush=True)


def _stop_all(brokers: list[_Broker], etcd) -> None:
    """SIGTERM every broker's ``tailrace serve`` and wait (SIGKILL after STOP_TIMEOUT_S), then
    stop etcd; further signals are ignored meanwhile (the stop is bounded)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    running = [b for b in brokers if b.proc is not None and b.proc.poll() is None]
    if running:
        _say(f"stopping {_n(len(running), 'broker')}, then etcd ...")
    for b in running:
        try:
            b.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for b in running:
        try:
            b.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"broker {b.id} (pid {b.proc.pid}) did not stop within {STOP_TIMEOUT_S:.0f} s: killed")
            b.proc.kill()
            b.proc.wait()
    for b in brokers:  # reaped, whatever happened to them
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait()
    etcd.stop()
    if running:
        _say("stopped")
