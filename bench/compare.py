"""Run the same workloads on tailrace and on its peers (Redis Streams, NATS JetStream, RabbitMQ) in one run.

    bash bench/setup_peers.sh                       # once: installs the servers and clients
    python -m tailrace.bench.compare produce durable-single --messages 1000000 --repeat 3
    python -m tailrace.bench.compare --peers redis --json > compare.json
    python -m tailrace.bench.compare e2e-latency --plot compare.png   # latency CDF per system
    python -m tailrace.bench.compare work-queue --repeat 3          # share groups vs RabbitMQ, Redis, JetStream

Installs nothing. Each system is started fresh for each workload (peers.py for how, and with
which durability settings), on loopback on a free port, and stopped by pid in a ``finally``.
The table shows tailrace's figure, each peer's, and the ratio tailrace / peer: above 1 means
tailrace is faster for msgs/s, and for latency rows (ratio of p99) below 1 means tailrace is
faster. RabbitMQ runs the work-queue workload only (its column is "-" elsewhere). A peer whose
Python client or server is not installed is reported missing (stderr, and "-" in its column);
the others still run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

from . import report
from .peers import NatsSystem, RabbitMQSystem, RedisSystem
from .procstat import machine_info
from .runner import EXIT_OK, EXIT_USAGE, _count, _jsonable, add_workload_options, load_plotter, run_all, save_plot, selected
from .systems import TailraceSystem

PEERS = {"redis": (RedisSystem, "redis"), "nats": (NatsSystem, "nats"),
         "rabbitmq": (RabbitMQSystem, "pika")}  # name -> (class, Python module)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.compare", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_options(ap)
    ap.add_argument("--peers", default="redis,nats,rabbitmq", help="comma list of peers (rabbitmq: work-queue only)")
    ap.add_argument("--workers", type=_count, default=2, help="tailrace worker processes")
    ap.add_argument("--data-root", default=None, help="where the temporary data directories go")
    ap.add_argument("--no-tailrace", action="store_true", help="run the peers only")
    ap.set_defaults(profile=None, profile_seconds=60.0)
    return ap


def _latency_case(row: dict) -> bool:
    return row["case"].startswith(("e2e/", "durable-single/", "work-queue/"))


def _figure(row: dict | None) -> str:
    if row is None:
        return "-"
    s = report.fmt_value(row)
    if _latency_case(row) and row.get("latency", {}).get("count"):
        s += f" p99 {row['latency']['p99_us']:,.0f}us"
    return s


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    if ours is None or theirs is None:
        return "-"
    if ours["case"].startswith("e2e/"):
        a, b = report.metric(ours, "latency.p99_us"), report.metric(theirs, "latency.p99_us")
        return "-" if not a or not b else f"{a / b:.2f}x p99"
    a, b = report.main_value(ours), report.main_value(theirs)
    return "-" if not a or not b else f"{a / b:.2f}x"


TAILRACE_ONLY = ("/same-host", "/round_robin", "/sticky", "/async")  # case parts a peer's case has not


def peer_case(case: str, keep: tuple[str, ...] = ()) -> str:
    """The peer's case a tailrace case is set against: its tailrace-only parts (the async client,
    a partitioner, the same-host transport) taken out, but for those in ``keep`` (a peer run
    with its asyncio client too names its cases /async)."""
    for part in TAILRACE_ONLY:
        if part not in keep:
            case = case.replace(part, "")
    return case


def comparison_table(rows: list[dict], systems: list[str]) -> str:
    by = {(r["system"], r["case"]): r for r in rows}
    cases = list(dict.fromkeys(r["case"] for r in rows))
    # a peer's plain case already shown against a tailrace row gets no line of its own
    shown = {peer_case(c, keep) for s, c in by if s == "tailrace" for keep in ((), ("/async",))}
    cases = [c for c in cases if ("tailrace", c) in by or c not in shown]
    peers = [s for s in systems if s != "tailrace"]
    headers = ["case", "tailrace"] + [h for p in peers for h in (p, f"tailrace/{p}")]
    body = []
    for case in cases:
        ours = by.get(("tailrace", case))
        line = [case, _figure(ours)]
        for p in peers:
            theirs = by.get((p, case)) or by.get((p, peer_case(case, ("/async",)))) or by.get((p, peer_case(case)))
            line += [_figure(theirs), _ratio(ours, theirs)]
        body.append(line)
    return report.table(headers, body)


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    _exit_on_sigterm()
    names = selected(opts.workloads)
    plotter = load_plotter(opts.plot, "python -m tailrace.bench.compare")
    systems = [] if opts.no_tailrace else [TailraceSystem(workers=opts.workers, data_root=opts.data_root,
                                                                client=opts.client)]
    missing: list[str] = []
    for name in [p for p in opts.peers.split(",") if p]:
        if name not in PEERS:
            print(f"unknown peer {name!r}; choose from {', '.join(PEERS)}", file=sys.stderr)
            return EXIT_USAGE
        cls, module = PEERS[name]
        if importlib.util.find_spec(module) is None:  # reported missing, as a peer whose server is not there
            print(f"!! {name}: Python module {module!r} missing (run bench/setup_peers.sh): its rows are missing",
                  file=sys.stderr)
            missing.append(name)
            continue
        systems.append(cls(data_root=opts.data_root, client=opts.client) if name == "redis" else cls(data_root=opts.data_root))
    started = time.time()
    raw = []
    for system in systems:
        try:
            raw.extend(run_all(system, names, opts, keep_going=True))
        finally:
            system.stop()
    rows = report.aggregate(raw)
    out = sys.stderr if opts.json else sys.stdout
    print(report.results_table(rows), file=out)
    print(file=out)
    print(comparison_table(rows, [s.name for s in systems] + missing), file=out)
    if opts.json:
        doc = {"machine": machine_info(), "systems": {s.name: s.describe() for s in systems},
               "argv": list(argv or sys.argv[1:]), "started": started, "results": rows, "raw": raw}
        json.dump(doc, sys.stdout, indent=1, default=_jsonable)
        sys.stdout.write("\n")
    if plotter is not None:
        title = f"{' vs '.join(s.name for s in systems)}: {' '.join(names)}"
        save_plot(plotter, opts.plot, rows, raw, title, out)
    return EXIT_OK



def _exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so every ``finally`` runs and servers started are stopped."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


if __name__ == "__main__":
    raise SystemExit(main())
