"""The ``tailrace`` command: run the broker, manage topics, produce and consume from a shell."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import stored_worker_count
from tailrace.client.admin import Admin
from tailrace.client.connection import DEFAULT_BOOTSTRAP
from tailrace.client.consumer import Consumer
from tailrace.client.errors import TailraceError
from tailrace.client.producer import Producer

from tailrace.ops import scaling, serve

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _data_dir(args) -> str:
    return os.path.realpath(args.data_dir) if args.data_dir else os.path.realpath(os.environ.get("TAILRACE_DATA_DIR", "./data"))


def cmd_serve(args) -> int:
    data_dir = _data_dir(args)
    try:
        s = settings_mod.from_env(
            data_dir=data_dir,
            bind=args.bind,
            # --workers, else the count `tailrace workers set` left, else TAILRACE_WORKERS / cores
            workers=args.workers or stored_worker_count(data_dir),
            ring_bytes=args.ring_bytes,
            shm_budget_bytes=args.shm_budget_bytes,
            segment_bytes=args.segment_bytes,
            data_mode=args.data_mode,
            ipc_dir=args.ipc_dir,
        )
    except ValueError as exc:
        print(f"tailrace serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    default_run_dir = not s.ipc_dir
    s.ipc_dir = os.path.abspath(s.ipc_path())  # pinned: every program and supervisorctl agree
    env = serve.serve_env(s)
    if args.print_env:
        for k, v in sorted(env.items()):
            if k.startswith("TAILRACE_"):
                print(f"export {k}={v}")
        print(f"# then: supervisord -n -c {serve.find_supervisord_conf()}")
        return EXIT_OK
    conf = str(serve.find_supervisord_conf())
    argv = [sys.executable, "-m", "supervisor.supervisord", "-n", "-c", conf]
    return serve.run(s, env, argv, default_run_dir)


def cmd_topic(args) -> int:
    with Admin(args.bootstrap) as admin:
        if args.topic_cmd == "create":
            info = admin.create_topic(args.name, args.partitions, args.ring_bytes)
            print(f"created topic {info.name} with {info.partitions} partitions (id {info.topic_id})")
        elif args.topic_cmd == "list":
            for t in admin.list_topics():
                print(f"{t.name}\t{t.partitions}")
        elif args.topic_cmd == "describe":
            d = admin.describe_topic(args.name)
            print(f"topic {d.topic.name} id={d.topic.topic_id} partitions={d.topic.partitions} ring_bytes={d.topic.ring_bytes}")
            print("partition\tworker\tlog_start\thigh_watermark\tdurable_watermark\tendpoint")
            for p in d.partitions:
                print(f"{p.partition}\t{p.worker}\t{p.log_start_offset}\t{p.high_watermark}\t{p.durable_watermark}\t{p.endpoint}")
    return EXIT_OK


def cmd_produce(args) -> int:
    key = args.key.encode() if args.key is not None else None
    with Producer(args.bootstrap, acks=args.acks, partitioner="key_hash" if key is not None else "round_robin") as prod:
        for line in sys.stdin.buffer:
            prod.send(args.name, line.rstrip(b"\n"), key=key, partition=args.partition)
        acked = prod.flush()
    print(f"produced {acked} messages", file=sys.stderr)
    return EXIT_OK


def cmd_consume(args) -> int:
    start = args.from_ if args.from_ in ("earliest", "latest") else int(args.from_)
    out = sys.stdout.buffer
    seen = 0
    with Consumer(args.bootstrap, isolation=args.isolation) as cons:
        cons.assign(args.name, None if args.partition is None else [args.partition], start=start)
        last_new = time.monotonic()
        while args.max is None or seen < args.max:
            wait = 500 if args.timeout_ms is None else max(1, min(500, int(args.timeout_ms - (time.monotonic() - last_new) * 1000)))
            records = cons.poll(wait)
            if records:
                last_new = time.monotonic()
                if args.max is not None:
                    records = records[: args.max - seen]
                out.write(b"".join(r.value + b"\n" for r in records))
                out.flush()
                seen += len(records)
            elif args.timeout_ms is not None and (time.monotonic() - last_new) * 1000 >= args.timeout_ms:
                break
    return EXIT_OK


def cmd_workers(args) -> int:
    s = settings_mod.from_env(data_dir=_data_dir(args))
    if args.workers_cmd == "set":
        status = scaling.set_workers(s, args.bootstrap, args.count, args.timeout_s,
                                     log=lambda m: print(m, file=sys.stderr))
    else:
        with Admin(args.bootstrap) as admin:
            status = admin.status()
    print(f"{status['worker_count']} workers")
    print("worker\tpartitions\talive\tendpoint")
    for w in status["workers"]:
        print(f"{w['worker']}\t{w['partitions']}\t{'yes' if w['alive'] else 'no'}\t{w['endpoint']}")
    return EXIT_OK


def cmd_status(args) -> int:
    with Admin(args.bootstrap) as admin:
        print(json.dumps(admin.status(), indent=2))
    return EXIT_OK


def cmd_bench(args) -> int:
    from tailrace.bench.runner import main as bench_main  # on use: the command starts without the suite

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tailrace", description="tailrace message broker")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def with_bootstrap(p):
        p.add_argument("--bootstrap", default=os.environ.get("TAILRACE_BOOTSTRAP", DEFAULT_BOOTSTRAP),
                       help="router endpoint (default %(default)s)")
        return p

    sv = sub.add_parser("serve", help="run router, workers and flusher under supervisord (foreground)")
    sv.add_argument("--data-dir", default=None, help="data directory (default ./data)")
    sv.add_argument("--bind", default=None, help="client endpoint (default tcp://127.0.0.1:7420)")
    sv.add_argument("--workers", type=int, default=None, help="worker processes (default: number of cores)")
    sv.add_argument("--ring-bytes", type=int, default=None, help="default ring size per partition")
    sv.add_argument("--shm-budget-bytes", type=int, default=None, help="total shared memory for rings")
    sv.add_argument("--segment-bytes", type=int, default=None, help="journal segment file size")
    sv.add_argument("--data-mode", default=None,
                    help="mode of the data directory and its subdirectories; files get it & 0666 (default 0700: owner only; "
                         "0750 lets the group read)")
    sv.add_argument("--ipc-dir", default=None,
                    help="run directory for sockets and pid files (default: $XDG_RUNTIME_DIR/tailrace/<id>, "
                         "/run/tailrace/<id> for root, else <tmp>/tailrace-<uid>/<id>); must be private to this user")
    sv.add_argument("--print-env", action="store_true", help="print the environment supervisord.conf needs and exit")
    sv.set_defaults(func=cmd_serve)

    tp = with_bootstrap(sub.add_parser("topic", help="create, list, describe topics"))
    tsub = tp.add_subparsers(dest="topic_cmd", required=True)
    c = tsub.add_parser("create")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--ring-bytes", type=int, default=0)
    tsub.add_parser("list")
    d = tsub.add_parser("describe")
    d.add_argument("name")
    for p in (c, d, tsub.choices["list"]):
        with_bootstrap(p)
    tp.set_defaults(func=cmd_topic)

    pr = with_bootstrap(sub.add_parser("produce", help="produce one message per stdin line"))
    pr.add_argument("name")
    pr.add_argument("--key", default=None)
    pr.add_argument("--partition", type=int, default=None)
    pr.add_argument("--acks", default="memory", choices=["none", "memory", "durable"])
    pr.set_defaults(func=cmd_produce)

    co = with_bootstrap(sub.add_parser("consume", help="print one value per line"))
    co.add_argument("name")
    co.add_argument("--partition", type=int, default=None)
    co.add_argument("--from", dest="from_", default="earliest", help="earliest, latest or an offset")
    co.add_argument("--max", type=int, default=None, help="stop after N messages")
    co.add_argument("--timeout-ms", type=int, default=None, help="stop after T ms with no new message")
    co.add_argument("--isolation", default="memory", choices=["memory", "durable"])
    co.set_defaults(func=cmd_consume)

    wk = sub.add_parser("workers", help="show or change the number of workers of a running broker")
    wsub = wk.add_subparsers(dest="workers_cmd", required=True)
    ws = wsub.add_parser("set", help="grow or shrink to N workers (starts/stops them through supervisord)")
    ws.add_argument("count", type=int)
    ws.add_argument("--timeout-s", type=float, default=120.0, help="give up if partitions have not settled by then")
    wl = wsub.add_parser("list", help="workers, their partitions and whether they answer")
    for p in (ws, wl):
        with_bootstrap(p)
        p.add_argument("--data-dir", default=None, help="the broker's data directory (default ./data)")
    wk.set_defaults(func=cmd_workers)

    st = with_bootstrap(sub.add_parser("status", help="broker status as JSON"))
    st.set_defaults(func=cmd_status)

    be = sub.add_parser("bench", help="run a benchmark workload (see bench/README.md)", add_help=False)
    be.add_argument("bench_args", nargs=argparse.REMAINDER)
    be.set_defaults(func=cmd_bench)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TailraceError as exc:
        print(f"tailrace: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
