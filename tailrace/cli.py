"""The ``tailrace`` command: run the broker, manage topics, produce and consume from a shell.

Exit codes: 0 success, 1 an error (one line on stderr, never a traceback), 2 a usage error (every
numeric option is range-checked here), 130 interrupted (Ctrl-C), 143 and 129 stopped by SIGTERM
and SIGHUP (which stop a command as Ctrl-C does: a group consumer leaves its group). ``tailrace
serve`` adds its own: 3 the data directory belongs to a live broker, 4 the run directory is not
private, 5 supervisord was killed. ``TAILRACE_DEBUG=1`` prints the traceback of an unexpected
error.

Here: the parser (every command, option and help text), serve, workers, status and main. The
other commands live in console.py (produce, consume), admin_commands.py (topic, groups),
access_commands.py (keys, acl, quota), cluster_commands.py (cluster status, dev-cluster),
reassign_commands.py (partitions reassign, cluster decommission), share_commands.py (consume
--share-group, share-groups, dlq replay) and top.py; tables.py prints what they show.
"""

from __future__ import annotations

import argparse
import os
import sys

from tailrace import access_commands, admin_commands, cluster_commands, console, reassign_commands, share_commands
from tailrace.access_commands import data_dir_of
from tailrace.admin_commands import open_admin, security
from tailrace.broker import acl as acl_mod
from tailrace.broker import auth as auth_mod
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import stored_worker_count
from tailrace.client import codecs
from tailrace.client.connection import DEFAULT_BOOTSTRAP, parse_bootstrap
from tailrace.client.errors import BootstrapError, TailraceError

from tailrace.console import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from tailrace.ops import running, scaling, serve
from tailrace.tables import human_bytes, human_rate, print_json, print_table

_DEFAULTS = settings_mod.Settings(data_dir="")  # the settings' defaults, for the help texts
ENV_BOOTSTRAP = "TAILRACE_BOOTSTRAP"
# A command fails this soon when no broker answers (the interpreter's start comes on top: the
# whole command is done within 2 s, as redis-cli and nats are).
CLI_CONNECT_TIMEOUT_MS = 1000
# Limits the broker enforces, for the help texts and the range checks (test_cli.py ties each to
# its source: router/topics.py's MAX_PARTITIONS, broker/settings.py's max_slots).
MAX_PARTITIONS = 16384  # per topic
MAX_SLOTS = _DEFAULTS.max_slots  # partitions of all topics together
MS_MAX = (1 << 31) - 1  # a timeout in ms: ZeroMQ's and poll's are C ints


# --- serve -------------------------------------------------------------------------------------
def cmd_serve(args) -> int:
    data_dir = data_dir_of(args)
    try:
        s = settings_mod.from_env(
            data_dir=data_dir,
            bind=args.bind,
            # --workers, else the count `tailrace workers set` left, else TAILRACE_WORKERS / cores
            workers=args.workers or stored_worker_count(data_dir),
            ring_bytes=args.ring_bytes,
            shm_budget_bytes=args.shm_budget_bytes,
            segment_bytes=args.segment_bytes,
            retention_ms=args.retention_ms,
            retention_bytes=args.retention_bytes,
            disk_max_used_ratio=args.disk_max_used_ratio,
            disk_full_policy=args.disk_full_policy,
            disk_force_delete_min_age_ms=args.disk_force_delete_min_age_ms,
            data_mode=args.data_mode,
            ipc_dir=args.ipc_dir,
            metrics_bind=args.metrics_bind,
            auth=args.auth,
            allow_dir=args.allow_dir,
            insecure=1 if args.insecure else None,
            local_uids=args.local_uids,
            cluster=args.cluster,
            broker_id=args.broker_id,
            advertise=args.advertise,
            cluster_name=args.cluster_name,
            rack=args.rack,
            replica_lag_time_max_ms=args.replica_lag_time_max_ms,
            auto_leader_rebalance=0 if args.no_auto_leader_rebalance else None,
            default_replication_factor=args.default_replication_factor,
        )
        if s.cluster:
            from tailrace.cluster.etcd import parse_endpoints  # the cluster extra: etcd's client

            parse_endpoints(s.cluster)
    except ImportError as exc:
        print(f"tailrace serve: --cluster needs the cluster extra (pip install 'tailrace[cluster]'): {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"tailrace serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    default_run_dir = not s.ipc_dir
    s.ipc_dir = os.path.abspath(s.ipc_path())  # pinned: every program and supervisorctl agree
    env = serve.serve_env(s)
    if args.print_env:
        return serve.print_env(s, env, default_run_dir)
    conf = str(serve.find_supervisord_conf())
    argv = [sys.executable, "-m", "supervisor.supervisord", "-n", "-c", conf]
    return serve.run(s, env, argv, default_run_dir)


# --- produce / consume ---------------------------------------------------------------------------
def cmd_consume(args) -> int:
    return share_commands.consume(args) if args.share_group is not None else console.consume(args)


# --- workers and status --------------------------------------------------------------------------
def run_settings(args) -> settings_mod.Settings:
    """The settings of the broker ``args`` name, for a command that talks to its run directory.
    The data directory: ``--data-dir``, else ``$TAILRACE_DATA_DIR``, else the one the broker at
    ``--bootstrap`` reports. The run directory: ``--ipc-dir``, else ``$TAILRACE_IPC_DIR``, else the
    one the live broker on that data directory was started with (ops/running.py), else the default."""
    if args.data_dir or os.environ.get("TAILRACE_DATA_DIR"):
        data_dir = data_dir_of(args)
    else:
        with open_admin(args) as admin:
            data_dir = admin.status()["data_dir"]
    live = running.live_settings(data_dir)
    ipc_dir = args.ipc_dir or os.environ.get("TAILRACE_IPC_DIR") or (live.ipc_path() if live is not None else None)
    return settings_mod.from_env(data_dir=data_dir, ipc_dir=ipc_dir)


def cmd_workers(args) -> int:
    if args.workers_cmd == "set":
        s = run_settings(args)
        status = scaling.set_workers(s, args.bootstrap, args.count, args.timeout_s,
                                     log=lambda m: print(m, file=sys.stderr), connect_timeout_ms=args.connect_timeout_ms,
                                     **security(args))
    else:
        with open_admin(args) as admin:
            status = admin.status()
    if args.json:
        print_json(status["workers"])
        return EXIT_OK
    print_table(["worker", "partitions", "alive", "retiring"],
                [[w["worker"], w["partitions"], "yes" if w["alive"] else "no", "yes" if w["retiring"] else "no"]
                 for w in status["workers"]], title=f"{status['worker_count']} workers")
    return EXIT_OK


def _disk_line(st: dict) -> str:
    """The journal's filesystem as the flusher last saw it, and whether produce is refused."""
    used, limit = st.get("disk_used_ratio", -1.0), st.get("disk_max_used_ratio", 0.0)
    line = f"{used:.0%} used (limit {limit:.0%})" if used >= 0 else "use not known yet"
    if st.get("storage_full"):
        line += "  STORAGE FULL: produce refused (STORAGE_FULL) until there is room"
    if st.get("records_force_deleted"):
        line += f"  {st['records_force_deleted']:,} records force-deleted inside retention (delete_oldest)"
    return line


def cmd_status(args) -> int:
    with open_admin(args) as admin:
        st = admin.status()
    if args.json:
        print_json(st)
        return EXIT_OK
    up = int(st["uptime_s"])
    alive = sum(1 for w in st["workers"] if w["alive"])
    rates = st.get("rates") or {}
    lines = [
        ("broker", f"{st['bind']}  pid {st['pid']}  up {up // 86400}d {up % 86400 // 3600:02d}h {up % 3600 // 60:02d}m {up % 60:02d}s"),
        ("data", f"{st['data_dir']}  journal {human_bytes(st.get('journal_bytes'))} on disk"),
        ("disk", _disk_line(st)),
        ("workers", f"{st['worker_count']} ({alive} answering)"),
        ("topics", f"{st['topics']}, {st['partitions']} partitions"),
        ("messages", f"in {st.get('records_in', 0):,} ({human_rate(rates.get('records_in'))}/s)  "
                     f"out {st.get('records_out', 0):,} ({human_rate(rates.get('records_out'))}/s)  "
                     f"not yet durable {st.get('unflushed_records', 0):,}"),
        ("bytes", f"in {human_bytes(st.get('bytes_in'))} ({human_bytes(rates.get('bytes_in'))}/s)  "
                  f"out {human_bytes(st.get('bytes_out'))} ({human_bytes(rates.get('bytes_out'))}/s)"),
        ("shm", f"{human_bytes(st.get('shm_resident_bytes'))} held of the {human_bytes(st.get('shm_budget_bytes'))} budget "
                f"(rings of {human_bytes(st.get('shm_used_bytes'))} made)"),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")
    return EXIT_OK


def cmd_top(args) -> int:
    from tailrace import top

    return top.run(args.metrics or f"http://{_DEFAULTS.metrics_bind}/metrics", args.interval, args.iterations)


def cmd_bench(argv: list[str]) -> int:
    from tailrace.bench.runner import main as bench_main  # on use: the command starts without the suite

    return bench_main(argv)


# --- the parser ----------------------------------------------------------------------------------
class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (not for flags and options without one)."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _bootstrap_type(text: str) -> str:
    try:
        return parse_bootstrap(text)
    except BootstrapError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_positive = console.int_at_least(1)
_natural = console.int_at_least(0)
_seconds = console.float_above(0.0, maximum=365 * 86400.0)
_partitions = console.int_at_least(1, maximum=MAX_PARTITIONS)
_partition = console.int_at_least(0, maximum=MAX_PARTITIONS - 1)
_workers = console.int_at_least(1, maximum=MAX_SLOTS)  # more workers than partition slots would idle
_timeout_ms = console.int_at_least(1, maximum=MS_MAX)
_retention = console.int_at_least(-1)
_ratio = console.float_above(0.0, maximum=1.0)


def _config(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE, e.g. retention.ms=86400000")
    return name.strip(), value.strip()


def _reset_to(text: str) -> str:
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return str(console.int_at_least(0, "an offset")(text))  # an offset is an int64
    raise argparse.ArgumentTypeError(f"{text!r}: earliest, latest or an offset")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tailrace", formatter_class=_Help,
        description="tailrace message broker: run it, manage topics, produce and consume.",
        epilog=f"The broker's address comes from --bootstrap, else ${ENV_BOOTSTRAP}, else {DEFAULT_BOOTSTRAP}. "
               "Exit codes: 0 ok, 1 error, 2 usage, 130 interrupted.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(parent, name: str, help_: str):
        return parent.add_parser(name, help=help_, description=help_, formatter_class=_Help)

    def with_bootstrap(p):
        p.add_argument("--bootstrap", type=_bootstrap_type, default=os.environ.get(ENV_BOOTSTRAP, DEFAULT_BOOTSTRAP),
                       metavar="ADDRESS",
                       help=f"the broker: host:port, tcp://host:port or a port on 127.0.0.1 (also ${ENV_BOOTSTRAP})")
        p.add_argument("--connect-timeout-ms", type=_timeout_ms, default=CLI_CONNECT_TIMEOUT_MS, metavar="MS",
                       help="fail when no broker answers this soon")
        p.add_argument("--key-file", default=os.environ.get("TAILRACE_KEY_FILE") or None, metavar="FILE",
                       help="a broker with --auth curve: this client's secret key file, NAME.key_secret from "
                            "`tailrace keys generate` (also $TAILRACE_KEY_FILE)")
        p.add_argument("--server-key", default=os.environ.get("TAILRACE_SERVER_KEY") or None, metavar="FILE|KEY",
                       help="a broker with --auth curve: its public key, <data-dir>/auth/server.key or the Z85 "
                            "text (also $TAILRACE_SERVER_KEY)")
        return p

    sv = command(sub, "serve", "run router, workers and flusher under supervisord (foreground; Ctrl-C stops all)")
    sv.add_argument("--data-dir", default=None, help="data directory (default ./data, or $TAILRACE_DATA_DIR)")
    sv.add_argument("--bind", default=None, help="client endpoint (default tcp://127.0.0.1:7420)")
    sv.add_argument("--workers", type=_workers, default=None,
                    help="worker processes (default: the count `workers set` left, else the number of cores)")
    sv.add_argument("--ring-bytes", type=_positive, default=None, help=f"default ring size per partition (default {human_bytes(_DEFAULTS.ring_bytes)})")
    sv.add_argument("--shm-budget-bytes", type=_positive, default=None,
                    help=f"shared memory all rings may hold together (default half the memory, here "
                         f"{human_bytes(settings_mod.default_shm_budget())})")
    sv.add_argument("--segment-bytes", type=_positive, default=None, help=f"journal segment file size (default {human_bytes(_DEFAULTS.segment_bytes)})")
    sv.add_argument("--retention-ms", type=_retention, default=None, metavar="MS",
                    help="how long topics keep records unless they say otherwise (retention.ms); -1 for ever (default 7 days)")
    sv.add_argument("--retention-bytes", type=_retention, default=None, metavar="BYTES",
                    help="how many bytes each partition keeps unless its topic says otherwise (retention.bytes); -1 no limit (default)")
    sv.add_argument("--disk-max-used-ratio", type=_ratio, default=None, metavar="RATIO",
                    help="when the journal's filesystem is fuller than this, storage is full: see --disk-full-policy "
                         f"(default {_DEFAULTS.disk_max_used_ratio}, 1 never)")
    sv.add_argument("--disk-full-policy", choices=settings_mod.DISK_FULL_POLICIES, default=None,
                    help="storage full: refuse produce with the retriable STORAGE_FULL until there is room, deleting nothing "
                         "(refuse, the default), or first delete the oldest journal segments even inside retention "
                         "(delete_oldest, RocketMQ's; counted in tailrace status and the metrics)")
    sv.add_argument("--disk-force-delete-min-age-ms", type=_natural, default=None, metavar="MS",
                    help="delete_oldest never deletes a segment written to within this long "
                         f"(default {_DEFAULTS.disk_force_delete_min_age_ms // 60000} minutes)")
    sv.add_argument("--data-mode", default=None,
                    help="mode of the data directory and its subdirectories; files get it & 0666 (default 0700: owner only; "
                         "0750 lets the group read)")
    sv.add_argument("--ipc-dir", default=None,
                    help="run directory for sockets and pid files (default: $XDG_RUNTIME_DIR/tailrace/<id>, "
                         "/run/tailrace/<id> for root, else <tmp>/tailrace-<uid>/<id>); must be private to this user")
    sv.add_argument("--metrics-bind", default=None, metavar="HOST:PORT",
                    help=f"the Prometheus endpoint, /metrics (default {_DEFAULTS.metrics_bind}; off for none)")
    sv.add_argument("--auth", choices=list(auth_mod.MODES), default=None,
                    help="curve: clients must present a CurveZMQ key from the allow-list (default none; a "
                         "non-loopback --bind needs curve or --insecure)")
    sv.add_argument("--allow-dir", default=None, metavar="DIR",
                    help="with --auth curve: the allowed clients' public keys, NAME.key each (default "
                         "<data-dir>/auth/clients); re-read when it changes")
    sv.add_argument("--insecure", action="store_true",
                    help="accept a non-loopback --bind without --auth (logged as a warning at every start)")
    sv.add_argument("--local-uids", default=None, metavar="UID[,UID...]",
                    help="user ids the same-host Unix sockets serve (default: the broker's own)")
    sv.add_argument("--cluster", default=None, metavar="etcd://H:P[,H:P...]",
                    help="join the cluster whose metadata lives in this etcd (docs/DESIGN.md \"Cluster\"); "
                         "needs --broker-id. Without it: a single host, nothing of etcd used")
    sv.add_argument("--broker-id", type=_natural, default=None, metavar="N",
                    help="this broker's id in the cluster (unique among live brokers)")
    sv.add_argument("--advertise", default=None, metavar="HOST:PORT",
                    help="the client endpoint other brokers and clients reach this broker at (default: --bind)")
    sv.add_argument("--cluster-name", default=None, metavar="NAME",
                    help="the cluster's name: several clusters may share one etcd (default tailrace)")
    sv.add_argument("--rack", default=None, metavar="RACK", help="this broker's rack (cluster placement)")
    sv.add_argument("--replica-lag-time-max-ms", type=_natural, default=None, metavar="MS",
                    help="a follower not caught up to its leader's log end this long leaves the ISR (default 30000, Kafka's)")
    sv.add_argument("--default-replication-factor", type=_natural, default=None, metavar="N",
                    help="replicas of a cluster topic created without --replication-factor: N when N brokers are live, "
                         "else 1 (default 3)")
    sv.add_argument("--no-auto-leader-rebalance", action="store_true",
                    help="leave a partition's leadership where failover put it (default: it goes back to the preferred "
                         "replica once that is in sync again, Kafka's auto.leader.rebalance.enable)")
    sv.add_argument("--print-env", action="store_true",
                    help="make the data, log and run directories, print the environment supervisord.conf needs and "
                         "the supervisord command line, and exit")
    sv.set_defaults(func=cmd_serve)

    tp = command(sub, "topic", "create, alter, delete, list and describe topics")
    tsub = tp.add_subparsers(dest="topic_cmd", required=True, metavar="SUBCOMMAND")
    c = command(tsub, "create", "create a topic")
    c.add_argument("name", help="topic name: 1-200 letters, digits, '.', '_', '-' (not '.' or '..')")
    c.add_argument("--partitions", type=_partitions, default=1,
                   help=f"number of partitions: at most {MAX_PARTITIONS:,} per topic and {MAX_SLOTS:,} in all topics together")
    c.add_argument("--ring-bytes", type=_natural, default=0,
                   help="shared-memory ring per partition in bytes; 0 takes the broker's default")
    c.add_argument("--replication-factor", type=_natural, default=0, metavar="N",
                   help="copies of each partition on distinct brokers of a cluster (0: the default, 1; a single host holds one)")
    c.add_argument("--config", type=_config, action="append", default=[], metavar="NAME=VALUE",
                   help="a topic setting, repeatable: retention.ms (-1: for ever), retention.bytes (per partition), ring.bytes, "
                        "compression.type (producer|uncompressed|gzip|snappy|lz4|zstd), message.timestamp.type "
                        "(CreateTime|LogAppendTime), message.timestamp.before.max.ms, message.timestamp.after.max.ms")
    al_ = command(tsub, "alter", "grow a topic to more partitions (only up, as Kafka's --alter --partitions)")
    al_.add_argument("name", help="topic name")
    al_.add_argument("--partitions", type=_partitions, default=None,
                     help=f"the new number of partitions, more than now (at most {MAX_PARTITIONS:,} per topic and "
                          f"{MAX_SLOTS:,} in all topics together)")
    al_.add_argument("--config", type=_config, action="append", default=[], metavar="NAME=VALUE",
                     help="set a topic setting, repeatable (NAME= resets it to the broker's default): retention.ms, retention.bytes, "
                          "compression.type, message.timestamp.type, message.timestamp.before.max.ms, "
                          "message.timestamp.after.max.ms, min.insync.replicas, unclean.leader.election.enable")
    dl = command(tsub, "delete", "delete a topic and all its records (its producers and consumers get UNKNOWN_TOPIC)")
    dl.add_argument("name", help="topic name")
    ls = command(tsub, "list", "list topics (a table; --json for scripts)")
    ls.add_argument("--internal", action="store_true", help="the broker's own topics too (__consumer_offsets)")
    d = command(tsub, "describe", "partitions of a topic: owner, watermarks, ring use, bytes")
    d.add_argument("name", help="topic name")
    for p in (c, al_, dl, ls, d):
        with_bootstrap(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tp.set_defaults(func=admin_commands.cmd_topic)

    gp = command(sub, "groups", "consumer groups: list, describe (lag), reset offsets, delete (Kafka's kafka-consumer-groups)")
    gsub = gp.add_subparsers(dest="groups_cmd", required=True, metavar="SUBCOMMAND")
    gl = command(gsub, "list", "every group, its state and epoch")
    gd = command(gsub, "describe", "per partition: member, committed offset, high watermark, lag")
    gd.add_argument("group", help="group name")
    gr = command(gsub, "reset-offsets", "set a group's committed offsets of a topic (only while the group has no members)")
    gr.add_argument("group", help="group name")
    gr.add_argument("--topic", required=True, help="topic whose offsets to set")
    gr.add_argument("--to", required=True, type=_reset_to, metavar="WHERE", help="earliest, latest or an offset")
    gdl = command(gsub, "delete", "delete a group and its committed offsets (only while it has no members)")
    gdl.add_argument("group", help="group name")
    for p in (gl, gd, gr, gdl):
        with_bootstrap(p)
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    gp.set_defaults(func=admin_commands.cmd_groups)

    pr = with_bootstrap(command(sub, "produce", "send each line of stdin as a message, as it arrives"))
    pr.add_argument("name", help="topic name")
    pr.add_argument("--key", default=None, help="the key of every message (then partitions come from the key's hash)")
    pr.add_argument("--key-separator", default=None, metavar="SEP",
                    help="split each line at the first SEP into key and value (Kafka's parse.key); a line without it is an error")
    pr.add_argument("--partition", type=_partition, default=None,
                    help="send every message to this partition (default: by key hash, else round robin)")
    pr.add_argument("--acks", default="memory", choices=["none", "memory", "durable", "all"],
                    help="none: no reply; memory: acked once in the broker's memory; durable: once fsynced to disk (on "
                         "every in-sync replica of a replicated partition); all: once every in-sync replica holds it")
    pr.add_argument("--linger-ms", type=console.float_above(0.0, or_equal=True, maximum=60_000.0), default=5.0,
                    help="a line waits at most this long for others to share its batch")
    pr.add_argument("--header", type=console.parse_header, action="append", default=None, metavar="KEY=VALUE",
                    help="a header on every message, repeatable (a key may repeat; the order is kept): KEY=VALUE, "
                         "KEY= for an empty value, KEY alone for a null value")
    pr.add_argument("--compression", default="none", choices=list(codecs.NAMES.values()),
                    help="compress each batch with this codec (the broker stores it so unless the topic's "
                         "compression.type says otherwise)")
    pr.add_argument("--compression-level", type=console.int_at_least(console.LEVELS[0], maximum=console.LEVELS[1]),
                    default=None, metavar="N",
                    help="the codec's level: " + ", ".join(
                        f"{codecs.NAMES[c]} {lo}..{hi} (default {codecs.DEFAULT_LEVELS[c]})"
                        for c, (lo, hi) in codecs.LEVEL_RANGES.items()) + "; snappy has none")
    pr.add_argument("--delay", type=console.duration_ms, default=None, metavar="DURATION",
                    help="append each line this long after it is read (30s, 500ms, 2m, 1h; the broker's timer keeps it)")
    pr.set_defaults(func=console.produce)

    co = with_bootstrap(command(sub, "consume", "print messages, one per line (values, or what --print-*, --format or --json ask)"))
    co.add_argument("name", help="topic name")
    co.add_argument("--partition", type=_partition, default=None, help="read only this partition (default: all)")
    co.add_argument("--group", default=None, metavar="G",
                    help="consume as a member of group G: partitions shared with its other members, offsets committed as "
                         "messages are printed (--from then says where a partition without a committed offset starts)")
    co.add_argument("--from", dest="from_", type=console.parse_from, default="earliest", metavar="WHERE",
                    help="earliest (or beginning), latest (or end), or an offset")
    co.add_argument("--from-beginning", action="store_true", help="the same as --from earliest (Kafka's spelling)")
    co.add_argument("--from-time", type=console.parse_time, default=None, metavar="TIME",
                    help="start at the first message appended at or after TIME: ISO 8601 (2026-11-23T10:00:00Z) or ms "
                         "since the epoch; partitions with nothing that recent start at their end")
    co.add_argument("--max", type=_natural, default=None, metavar="N", help="stop after N messages")
    co.add_argument("--timeout-ms", type=_natural, default=None, metavar="MS", help="stop after MS ms without a new message")
    co.add_argument("--isolation", default="memory", choices=["memory", "durable"],
                    help="memory: everything acked; durable: only what is fsynced to disk")
    co.add_argument("--print-key", action="store_true", help="print the key before the value (null if none)")
    co.add_argument("--print-offset", action="store_true", help="print Offset:N before the value")
    co.add_argument("--print-partition", action="store_true", help="print Partition:N before the value")
    co.add_argument("--print-timestamp", action="store_true",
                    help="print CreateTime:MS (ms since the epoch; LogAppendTime:MS for a topic with "
                         "message.timestamp.type=LogAppendTime) before the value")
    co.add_argument("--print-headers", action="store_true",
                    help="print the headers before the key and value as KEY=VALUE,KEY=VALUE (in the order sent; "
                         "a null value as KEY alone; empty if none; nothing escaped: --json is exact)")
    co.add_argument("--format", type=console.kcat_format, default=None, metavar="FMT",
                    help="kcat-style line: %%t topic, %%p partition, %%o offset, %%k key, %%v value, %%T timestamp, "
                         "%%y its type (CreateTime or LogAppendTime), %%h headers (as --print-headers), "
                         "%%S value bytes, \\t, \\n (e.g. '%%p %%o %%k %%v %%T %%h')")
    co.add_argument("--json", action="store_true",
                    help="one JSON object a line: topic, partition, offset, timestamp, timestamp_type, key, value "
                         "(UTF-8 text), headers (a list of {\"key\": text, \"value\": text or null})")
    co.add_argument("--base64", action="store_true",
                    help="with --json: key, value and header values as base64 (for binary data)")
    co.set_defaults(func=cmd_consume)
    share_commands.add_parsers(sub, co, command, with_bootstrap)  # consume --share-group, share-groups, dlq

    wk = command(sub, "workers", "show or change the number of workers of a running broker")
    wsub = wk.add_subparsers(dest="workers_cmd", required=True, metavar="SUBCOMMAND")
    ws = command(wsub, "set", "grow or shrink to N workers (starts or stops them through supervisord)")
    ws.add_argument("count", type=_workers, help="the number of workers wanted")
    ws.add_argument("--timeout-s", type=_seconds, default=120.0, help="give up if partitions have not settled by then")
    wl = command(wsub, "list", "workers, their partitions and whether they answer")
    for p in (ws, wl):
        with_bootstrap(p)
        p.add_argument("--data-dir", default=None,
                       help="the broker's data directory (default $TAILRACE_DATA_DIR, else the one the broker reports)")
        p.add_argument("--ipc-dir", default=None,
                       help="the broker's run directory, as given to `serve --ipc-dir` (default $TAILRACE_IPC_DIR, else "
                            "the one the broker on the data directory runs with)")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    wk.set_defaults(func=cmd_workers)

    st = with_bootstrap(command(sub, "status", "a summary of the running broker: uptime, workers, traffic, disk, memory"))
    st.add_argument("--json", action="store_true", help="print the broker's full status as JSON")
    st.set_defaults(func=cmd_status)

    tp_ = command(sub, "top", "a live view of a running broker from its metrics endpoint (q quits)")
    tp_.add_argument("--metrics", default=None, metavar="URL",
                     help=f"the broker's Prometheus endpoint (default http://{_DEFAULTS.metrics_bind}/metrics)")
    tp_.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes")
    tp_.add_argument("--iterations", type=_positive, default=None, help="stop after N refreshes (default: until q or Ctrl-C)")
    tp_.set_defaults(func=cmd_top)

    ac = command(sub, "acl", "who may do what to which topics, with --auth curve (broker/acl.py); edits <data-dir>/auth/acls.json "
                            "(with --cluster: the cluster's, in etcd)")
    asub = ac.add_subparsers(dest="acl_cmd", required=True, metavar="SUBCOMMAND")
    for name, text in (("add", "allow a principal operations on topics (the first rule turns authorization on)"),
                       ("remove", "remove exactly that rule")):
        p = command(asub, name, text)
        p.add_argument("principal", help="the principal: a key's name in the allow-list")
        p.add_argument("--topic", default=None, help="a topic name, or * for every topic")
        p.add_argument("--prefix", default=None, help="every topic whose name starts with this")
        p.add_argument("--ops", required=True, metavar="OP[,OP...]", help=f"operations: {', '.join(acl_mod.OPERATIONS)}")
        access_target(p)
    al = command(asub, "list", "the rules")
    access_target(al)
    al.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ac.set_defaults(func=access_commands.cmd_acl)

    qu = command(sub, "quota", "produce and fetch bytes per second per principal, with --auth curve (broker/quota.py); "
                              "edits <data-dir>/auth/quotas.json")
    qsub = qu.add_subparsers(dest="quota_cmd", required=True, metavar="SUBCOMMAND")
    qs = command(qsub, "set", "set a principal's rates (* = every principal without its own; 0 = unlimited)")
    qs.add_argument("principal", help="a key's name in the allow-list, unix:USER for same-host clients, or * for the default")
    qs.add_argument("--producer-byte-rate", type=_natural, default=None, metavar="BYTES_PER_S", help="produce bytes per second")
    qs.add_argument("--consumer-byte-rate", type=_natural, default=None, metavar="BYTES_PER_S", help="fetch bytes per second")
    qr = command(qsub, "remove", "remove a principal's quota")
    qr.add_argument("principal")
    ql = command(qsub, "list", "the quotas")
    ql.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for p in (qs, qr, ql):
        access_target(p)
    qu.set_defaults(func=access_commands.cmd_quota)

    ky = command(sub, "keys", "CurveZMQ key pairs for clients of a broker with --auth curve")
    ksub = ky.add_subparsers(dest="keys_cmd", required=True, metavar="SUBCOMMAND")
    kg = command(ksub, "generate", "write NAME.key (public: put it in the broker's allow-list) and NAME.key_secret (0600)")
    kg.add_argument("name", help="the principal's name (the key files are named after it)")
    kg.add_argument("--dir", default=".", help="where to write the pair (default: the current directory)")
    kg.set_defaults(func=access_commands.cmd_keys)
    ka = command(ksub, "allow", "allow a client's public key as principal NAME (the data dir's allow-list, or the cluster's)")
    ka.add_argument("name", help="the principal's name")
    ka.add_argument("key", help="its public key: a NAME.key file (or NAME.key_secret), or the 40-character Z85 text")
    kr = command(ksub, "revoke", "remove principal NAME from the allow-list (its connections are refused from the next request)")
    kr.add_argument("name")
    kl = command(ksub, "list", "the allowed principals and their public keys")
    kl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for p in (ka, kr, kl):
        access_target(p)
        p.set_defaults(func=access_commands.cmd_keys_allowed)

    cl = command(sub, "cluster", "a cluster of brokers on etcd (docs/DESIGN.md \"Cluster\"); needs the cluster extra")
    clsub = cl.add_subparsers(dest="cluster_cmd", required=True, metavar="SUBCOMMAND")
    cs = command(clsub, "status", "read etcd: the brokers (endpoint, rack, pid on this host), the controller, and the "
                                  "partitions each broker leads and those without a leader")
    cluster_target(cs, "the cluster's etcd, as given to `serve --cluster`")
    cs.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    cl.set_defaults(func=cluster_commands.cmd_cluster)
    reassign_commands.add_parsers(sub, clsub, command, with_bootstrap)  # partitions reassign, cluster decommission

    dc = command(sub, "dev-cluster", "run one etcd and N brokers on loopback for trying a cluster (foreground; Ctrl-C "
                                     "stops the brokers, then etcd)")
    dc.add_argument("--brokers", type=console.int_at_least(1, maximum=64), default=3, help="how many brokers (ids 0..N-1)")
    dc.add_argument("--dir", default="./dev-cluster", help="where etcd's data (DIR/etcd) and each broker's (DIR/broker-<i>) go")
    dc.add_argument("--workers", type=_workers, default=1, help="worker processes per broker")
    dc.add_argument("--auth", choices=("none", "curve"), default="none",
                    help="curve: every broker with --auth curve and one server key; an admin client key in "
                         "DIR/keys, allowed in the cluster's allow-list (it prints how to use it)")
    dc.add_argument("--base-port", type=console.int_at_least(1, maximum=65535), default=None, metavar="P",
                    help="broker i listens on 127.0.0.1:P+i (default: free ports, the last run's when still free)")
    dc.set_defaults(func=cluster_commands.cmd_dev_cluster)

    sub.add_parser("bench", help="run benchmark workloads (tailrace bench --help; bench/README.md)", add_help=False)
    return ap


def access_target(p) -> None:
    """Where ``keys allow|revoke|list``, ``acl`` and ``quota`` act: a data directory, or a cluster."""
    p.add_argument("--data-dir", default=None, help="the broker's data directory (default ./data)")
    cluster_target(p, "a cluster's etcd instead: the rules of every broker in it")


def cluster_target(p, what: str) -> None:
    """``--cluster`` and ``--cluster-name`` of a command that reads or writes a cluster's etcd."""
    p.add_argument("--cluster", default=os.environ.get("TAILRACE_CLUSTER") or None, metavar="etcd://H:P[,H:P...]",
                   help=f"{what} (also $TAILRACE_CLUSTER)")
    p.add_argument("--cluster-name", default=os.environ.get("TAILRACE_CLUSTER_NAME") or _DEFAULTS.cluster_name,
                   metavar="NAME", help="the cluster's name, as given to `serve --cluster-name` (also $TAILRACE_CLUSTER_NAME)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:  # its own parser: `tailrace bench --help` is the bench's help
            return cmd_bench(argv[1:])
        args = build_parser().parse_args(argv)
        console.stop_on_signals()  # serve puts its own handlers over these
        return args.func(args)
    except SystemExit as exc:  # argparse: 0 for --help, 2 for a usage error
        if isinstance(exc.code, int):
            return exc.code
        if exc.code is not None:
            print(exc.code, file=sys.stderr)
        return EXIT_USAGE if exc.code is not None else EXIT_OK
    except KeyboardInterrupt as exc:  # Ctrl-C, or console.Stopped (SIGTERM, SIGHUP)
        print("tailrace: interrupted", file=sys.stderr)
        return console.interrupted_code(exc)
    except BootstrapError as exc:
        print(f"tailrace: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TailraceError as exc:
        print(f"tailrace: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `tailrace consume t | head`: the reader left
        _quiet_stdout()
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("TAILRACE_DEBUG"):
            raise
        print(f"tailrace: {type(exc).__name__}: {exc} (TAILRACE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_ERROR


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's last flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
