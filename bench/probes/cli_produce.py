"""How fast ``tailrace produce`` moves keyed lines from stdin into few and into many partitions.

    python -m tailrace.bench.probes.cli_produce [--repeat 3] [--old-tree DIR]

Starts a broker (bench/launcher.py, as ``tailrace serve``), makes ``few`` (6 partitions, 32 MiB
rings) and ``many`` (1,000 partitions, 2 MiB rings), writes 300,000 and 100,000 lines of
``key:value`` (5,000 keys, ~100-byte values) and runs ``tailrace produce TOPIC --key-separator :``
on each, ``--repeat`` times, as a subprocess with the file on stdin. It prints the median wall
time, the same with no input (the interpreter's start and the connection: paid once by any run),
and lines per second net of that start. ``--old-tree DIR`` runs the command from another checkout
(``git archive <commit> | tar -x -C DIR``) against the same broker, for a before/after.
(docs/BENCHMARKS.md, "tailrace produce over many partitions".)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = (("few", 6, 32 << 20, 300_000), ("many", 1000, 2 << 20, 100_000))
KEYS = 5000


def write_lines(path: Path, n: int) -> None:
    pad = b"x" * 80
    path.write_bytes(b"".join(b"k%d:value-%08d-%s\n" % (i % KEYS, i, pad) for i in range(n)))


def timed(argv: list[str], stdin_path: str, env: dict, cwd: str | None) -> float:
    with open(stdin_path, "rb") as f:
        t0 = time.perf_counter()
        r = subprocess.run(argv, stdin=f, capture_output=True, env=env, cwd=cwd)
        dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old-tree", default=None, help="a checkout whose `tailrace produce` to time as well")
    opts = ap.parse_args()
    from tailrace import Admin
    from tailrace.bench.launcher import Broker

    work = Path(tempfile.mkdtemp(prefix="cli-produce-"))
    broker = Broker(work / "data", workers=2, shm_budget_bytes=4 << 30)
    broker.start()
    try:
        with Admin(broker.bootstrap) as admin:
            for name, partitions, ring, _n in CASES:
                admin.create_topic(name, partitions, ring)
        for name, _p, _r, n in CASES:
            write_lines(work / f"{name}.txt", n)
        trees = [("now", None)] + ([("old", opts.old_tree)] if opts.old_tree else [])
        for label, tree in trees:
            env = {**os.environ, "TAILRACE_BOOTSTRAP": broker.bootstrap}
            cwd = str(Path(tree).resolve()) if tree else str(work)  # `python -m` imports from its cwd first
            if tree:
                env["PYTHONPATH"] = cwd
            for name, partitions, _r, n in CASES:
                argv = [sys.executable, "-m", "tailrace", "produce", name, "--key-separator", ":"]
                start = statistics.median(timed(argv, os.devnull, env, cwd) for _ in range(opts.repeat))
                runs = [timed(argv, str(work / f"{name}.txt"), env, cwd) for _ in range(opts.repeat)]
                wall = statistics.median(runs)
                print(f"{label:4} {name:5} {partitions:5} partitions {n:8,} lines: wall {wall:6.2f} s "
                      f"[{min(runs):.2f}-{max(runs):.2f}], start {start:.2f} s, {n / max(wall - start, 1e-3):9,.0f} lines/s "
                      f"net of the start ({n / wall:,.0f} with it)", flush=True)
    finally:
        broker.stop()
        broker.cleanup_shm()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
