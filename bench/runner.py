"""``tailrace bench``: run benchmark workloads against a broker and print the results.

    tailrace bench                          # lists the workloads
    tailrace bench all                      # every workload, full sizes (see bench/README.md)
    tailrace bench produce consume-hot --messages 1000000 --repeat 3
    tailrace bench e2e-latency --bootstrap tcp://127.0.0.1:7420 --json
    tailrace bench produce e2e-latency --plot bench.png   # throughput over time, latency CDF

By default each workload runs on a fresh broker (the test harness starts it exactly as
``tailrace serve`` does, on a temporary data directory and a free loopback port) that is stopped
and removed afterwards; ``--bootstrap`` uses a running broker instead (then broker CPU is not
reported). Load generators are separate processes; the table shows how many and their CPU next
to each broker process's CPU (percent of one core over the measured interval).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import report
from .procstat import machine_info
from .workloads import WORKLOADS

MiB = 1 << 20
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


INT64_MAX = (1 << 63) - 1
SECONDS_MAX = 365 * 86400.0


def _count(text: str) -> int:
    """An argparse type: a whole number from 0 to 2**63 - 1, else a usage error (not an
    OverflowError from an encoder later)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from None
    if not 0 <= n <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be 0 to {INT64_MAX:,}, not {text}")
    return n


def _seconds(text: str) -> float:
    """An argparse type: finite seconds, 0 to a year."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not 0 <= x <= SECONDS_MAX:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 to {SECONDS_MAX:.0f} seconds, not {text}")
    return x


def _ints(text: str) -> list[int]:
    return [_count(x) for x in text.split(",") if x]


def _kinds(text: str) -> list[str]:
    kinds = [x for x in text.split(",") if x]
    bad = [k for k in kinds if k not in ("zmq", "same-host")]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"transports are zmq and same-host, got {text!r}")
    return kinds


def _seconds_or_never(text: str) -> float:
    return _seconds(text)  # 0: never


def add_workload_options(ap: argparse.ArgumentParser) -> None:
    """Options shared with compare.py: sizes and shapes of every workload."""
    ap.add_argument("workloads", nargs="*", default=[], metavar="WORKLOAD",
                    help=f"any of: {', '.join(WORKLOADS)}, or all")
    ap.add_argument("--messages", type=_count, default=5_000_000, help="messages per batched/consume run (default %(default)s)")
    ap.add_argument("--partitions", type=_count, default=8, help="partitions of each workload's topic")
    ap.add_argument("--size", type=_count, default=100, help="value bytes (default %(default)s)")
    ap.add_argument("--batch", type=_count, default=4000, help="records per produce request (default %(default)s)")
    ap.add_argument("--producers", type=_count, default=2, help="producer processes for batched produce")
    ap.add_argument("--in-flight", type=_count, default=4, help="requests in flight per partition per producer")
    ap.add_argument("--outstanding", type=_count, default=32, help="requests in flight per producer process, at most")
    ap.add_argument("--consumers", type=_count, default=2, help="consumer processes")
    ap.add_argument("--fetch-bytes", type=_count, default=4 * MiB, help="max bytes per fetch")
    ap.add_argument("--ring-bytes", type=_count, default=32 * MiB, help="ring per partition for produce topics")
    ap.add_argument("--hot-ring-bytes", type=_count, default=128 * MiB, help="ring per partition for consume-hot")
    ap.add_argument("--cold-ring-bytes", type=_count, default=4 * MiB, help="ring per partition for consume-cold")
    ap.add_argument("--many-partitions", type=_count, default=1000, help="partitions in the partitions workload")
    ap.add_argument("--many-ring-bytes", type=_count, default=1 * MiB, help="ring per partition in the partitions workload")
    ap.add_argument("--many-batch", type=_count, default=1000, help="records per request in the partitions workload")
    ap.add_argument("--single-producers", type=_ints, default=[1, 16, 64], help="durable-single concurrency, comma list")
    ap.add_argument("--single-procs", type=_count, default=2, help="processes the single-message producers are spread over")
    ap.add_argument("--client", choices=["blocking", "async"], default="blocking",
                    help="tailrace's client in durable-single and e2e-latency: the blocking one (raw requests "
                         "over its Connection) or the asyncio one (tailrace.aio, one AsyncProducer shared by "
                         "each process's coroutines); cases of the async client end in /async")
    ap.add_argument("--partitioner", choices=["pinned", "round_robin", "sticky"], default="pinned",
                    help="durable-single with --client async: pinned (each coroutine sends to its own partition, "
                         "as each Redis coroutine to its own stream) or unkeyed sends placed by this partitioner "
                         "of the shared producer (cases end in /round_robin or /sticky)")
    ap.add_argument("--uvloop", action="store_true",
                    help="asyncio load generators (tailrace's --client async, Redis durable-single) run on "
                         "uvloop instead of asyncio's own loop (needs uvloop installed)")
    ap.add_argument("--single-messages", type=_count, default=1_000_000, help="upper bound per durable-single case")
    ap.add_argument("--single-seconds", type=_seconds, default=10.0, help="time bound per durable-single case")
    ap.add_argument("--rate", type=_count, default=5000, help="e2e-latency messages per second")
    ap.add_argument("--duration", type=_seconds, default=10.0, help="e2e-latency seconds")
    ap.add_argument("--max-wait-ms", type=_count, default=500, help="e2e-latency consumer long-poll wait")
    ap.add_argument("--transports", type=_kinds, default=["zmq", "same-host"],
                    help="client transports of the latency workloads, comma list: zmq (any host), "
                         "same-host (Unix sockets + ring reads; tailrace only)")
    ap.add_argument("--sizes", type=_ints, default=[16, 100, 1024, 16384], help="sizes workload, comma list of bytes")
    ap.add_argument("--sweep-bytes", type=_count, default=1 << 30, help="sizes workload: payload bytes per size, at most")
    ap.add_argument("--batch-bytes", type=_count, default=400_000, help="sizes workload: payload bytes per request")
    ap.add_argument("--queue-messages", type=_count, default=200_000, help="work-queue: messages loaded, then drained")
    ap.add_argument("--queue-consumers", type=_count, default=4, help="work-queue: consumer processes")
    ap.add_argument("--queue-batch", type=_count, default=500,
                    help="work-queue: records per poll / XREADGROUP COUNT / fetch batch / RabbitMQ prefetch, and per fill request")
    ap.add_argument("--queue-partitions", type=_count, default=4, help="work-queue: partitions of tailrace's topic (peers: one queue)")
    ap.add_argument("--queue-ring-bytes", type=_count, default=32 * MiB, help="work-queue: ring per partition of tailrace's topic")
    ap.add_argument("--queue-poll-ms", type=_count, default=100, help="work-queue: longest wait of one empty poll")
    ap.add_argument("--queue-seconds", type=_seconds, default=60.0, help="work-queue: time bound of the drain (and of the fill)")
    ap.add_argument("--xack", choices=["batch", "each"], default="batch",
                    help="work-queue on Redis: one XACK with every id of a read, pipelined with the next XREADGROUP "
                         "(batch), or one XACK round trip per message (each; cases end in /xack-each)")
    ap.add_argument("--max-seconds", type=_seconds, default=120.0, help="time bound of each measured phase")
    ap.add_argument("--repeat", type=_count, default=1, help="runs per workload; the table shows the median")
    ap.add_argument("--json", action="store_true", help="print results as JSON on stdout (table goes to stderr)")
    ap.add_argument("--plot", default=None, metavar="FILE.png",
                    help="draw throughput over time and latency CDFs into this PNG (needs matplotlib: tailrace[plot])")
    ap.add_argument("--scrape-every", type=_seconds_or_never, default=0.0, metavar="S",
                    help="scrape the broker's metrics endpoint every S seconds during each run (0: never)")
    ap.add_argument("--via-router", action="store_true",
                    help="tailrace clients send every request through the router (no client-side addressing)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tailrace bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_workload_options(ap)
    ap.add_argument("--bootstrap", default=None, help="use this running broker instead of starting one")
    ap.add_argument("--workers", type=_count, default=2, help="worker processes of the broker started")
    ap.add_argument("--data-root", default=None, help="where the temporary data directories go")
    ap.add_argument("--profile", default=None, metavar="DIR", help="py-spy every broker process into DIR")
    ap.add_argument("--profile-seconds", type=_seconds, default=60.0, help="longest profile per case")
    return ap


# Targets (report.TARGETS) are judged only when every size is at least its default: a small run
# says nothing about them, and "MISSED" on it read like a failure.
SIZE_OPTIONS = ("messages", "single_messages", "single_seconds", "duration", "many_partitions", "sweep_bytes",
                "queue_messages")


def full_size(opts, ap: argparse.ArgumentParser) -> bool:
    return all(getattr(opts, k) >= ap.get_default(k) for k in SIZE_OPTIONS)


WHAT = {
    "produce": "batched produce, acks=memory (--messages, --batch, --producers)",
    "produce-durable": "batched produce, acks=durable (fsynced before the ack)",
    "durable-single": "one message per request, acks=durable, 1/16/64 producers (--single-producers)",
    "consume-hot": "consume what is still in the shared-memory rings",
    "consume-cold": "consume from the journal on disk (small rings)",
    "partitions": "produce over 1,000 partitions against 8 (--many-partitions)",
    "e2e-latency": "produce-to-consume latency at a fixed rate (--rate, --duration)",
    "sizes": "throughput over value sizes (--sizes)",
    "work-queue": "share group: 4 consumers drain 200,000 messages, acknowledging each (--queue-messages)",
}


def list_workloads(prog: str = "tailrace bench") -> str:
    lines = ["workloads (each on a fresh broker unless --bootstrap is given):"]
    for name in WORKLOADS:
        lines.append(f"  {name:<16} {WHAT.get(name, '')}")
    lines += ["", f"run one:   {prog} produce --messages 200000", f"run all:   {prog} all   (full sizes: minutes on both cores)",
              f"options:   {prog} --help"]
    return "\n".join(lines)


def selected(names: list[str]) -> list[str]:
    if not names or names == ["all"]:
        return list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"tailrace bench: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def run_all(system, names: list[str], opts, keep_going: bool = False) -> list[dict]:
    """Every workload ``opts.repeat`` times; with ``keep_going`` a failed run is reported on
    stderr and skipped (compare.py: one peer's failure must not lose the others' figures)."""
    rows = []
    supported = getattr(system, "workloads", None)  # a peer that runs some workloads only (RabbitMQ)
    for name in names:
        if supported is not None and name not in supported:
            print(f"-- {system.name}: {name} skipped (it runs {', '.join(supported)} only)", file=sys.stderr)
            continue
        for i in range(opts.repeat):
            print(f"-- {system.name}: {name} (run {i + 1}/{opts.repeat})", file=sys.stderr)
            try:
                rows.extend(WORKLOADS[name](system, opts))
            except Exception as exc:
                if not keep_going:
                    raise
                print(f"!! {system.name}: {name} failed: {exc}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    opts = ap.parse_args(argv)
    if not opts.workloads:
        print(list_workloads())
        return EXIT_OK
    _exit_on_sigterm()
    names = selected(opts.workloads)
    plotter = load_plotter(opts.plot, "tailrace bench")
    from .systems import TailraceSystem

    system = TailraceSystem(bootstrap=opts.bootstrap, workers=opts.workers, data_root=opts.data_root,
                            client=opts.client)
    started = time.time()
    raw = run_all(system, names, opts)
    judged = full_size(opts, ap)
    rows = report.aggregate(raw, judge=judged)
    out = sys.stderr if opts.json else sys.stdout
    print(report.results_table(rows), file=out)
    if not judged:
        print("targets are judged on full-size runs only (every size option at least its default)", file=out)
    if opts.json:
        doc = {"machine": machine_info(), "system": system.describe(), "argv": list(argv or sys.argv[1:]),
               "started": started, "results": rows, "raw": raw}
        json.dump(doc, sys.stdout, indent=1, default=_jsonable)
        sys.stdout.write("\n")
    if plotter is not None:
        save_plot(plotter, opts.plot, rows, raw, f"tailrace bench {' '.join(names)}", out)
    return EXIT_OK


def load_plotter(path: str | None, prog: str):
    """bench/plot.py when ``--plot`` is given, checked before any run: a missing matplotlib or
    folder must not cost a whole bench. None without ``--plot`` (matplotlib is never imported)."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        print(f"{prog}: --plot {path}: no folder {folder}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    try:
        from . import plot
    except ImportError as exc:
        print(f"{prog}: --plot needs matplotlib ({exc}): pip install 'tailrace[plot]'", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    return plot


def save_plot(plotter, path: str, rows: list[dict], raw: list[dict], title: str, out) -> None:
    width, height = plotter.write_plot(path, rows, raw, machine_info(), title)
    print(f"plot: {path} ({width}x{height})", file=out)



def _exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so every ``finally`` runs and brokers started are stopped."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _jsonable(o):
    try:
        import numpy as np

        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
    except ImportError:
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


if __name__ == "__main__":
    raise SystemExit(main())
