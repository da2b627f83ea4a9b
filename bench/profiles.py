"""Sample the server processes with py-spy during a run, and summarise the samples.

``tailrace bench WORKLOAD --profile DIR`` starts one ``py-spy record`` per server process when
the load generators are released and stops it (SIGINT, which makes py-spy write its file) when
they finish. Files are py-spy's "raw" format, one collapsed stack per line with a sample count:
``outer (file.py:12);inner (file.py:34) 57``. Idle samples (a thread blocked in poll or recv)
are left out by py-spy, so a process's samples / (rate x seconds) is its busy share.

    python -m tailrace.bench.profiles DIR/*.txt           # top functions, self and inclusive, per file

py-spy needs ptrace rights on the target (root, or kernel.yama.ptrace_scope = 0). It is
installed by bench/setup_peers.sh; without it --profile says so and the run goes on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

RATE_HZ = 200


def start_profilers(out_dir: str, case: str, system: str, pids: dict[str, int], max_seconds: float):
    """Start py-spy on every pid; return a function that stops them and waits for their files."""
    exe = shutil.which("py-spy")
    if exe is None:
        print("bench: --profile needs py-spy (pip install py-spy); not profiling", file=sys.stderr)
        return lambda: None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    started: list[tuple[subprocess.Popen, str]] = []
    tag = case.replace("/", "-")
    for name, pid in pids.items():
        out = os.path.join(out_dir, f"{system}-{tag}-{name}.txt")
        cmd = [exe, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw", "--nonblocking",
               "--duration", str(int(max_seconds)), "--output", out]
        started.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out))
    t0 = time.monotonic()

    def stop() -> None:
        seconds = time.monotonic() - t0
        for proc, _out in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, out in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            Path(out + ".seconds").write_text(f"{seconds:.3f}\n")

    return stop


def load(path: str) -> Counter:
    """Collapsed stack -> samples."""
    stacks: Counter = Counter()
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            stacks[stack] += int(count)
    return stacks


def _short(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``: one entry per function, not per line."""
    func, _, where = frame.partition(" (")
    fname = where.rstrip(")").rsplit(":", 1)[0]
    parts = fname.split("/")
    keep = "/".join(parts[-2:]) if len(parts) > 1 else fname
    return f"{func} ({keep})"


def summarise(path: str, top: int = 15) -> str:
    stacks = load(path)
    total = sum(stacks.values())
    secs_file = Path(path + ".seconds")
    seconds = float(secs_file.read_text()) if secs_file.exists() else None
    self_c: Counter = Counter()
    incl: Counter = Counter()
    for stack, n in stacks.items():
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    lines = [f"== {os.path.basename(path)}: {total} busy samples"
             + (f" over {seconds:.1f} s at {RATE_HZ} Hz = {100 * total / (RATE_HZ * seconds):.0f}% busy" if seconds else "")]
    lines.append("  self%  incl%  function")
    for func, n in self_c.most_common(top):
        lines.append(f"  {100 * n / total:5.1f}  {100 * incl[func] / total:5.1f}  {func}")
    lines.append("  -- inclusive --")
    for func, n in incl.most_common(top):
        lines.append(f"  {100 * self_c[func] / total:5.1f}  {100 * n / total:5.1f}  {func}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tailrace.bench.profiles", description="summarise py-spy raw profiles")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    for path in args.files:
        if path.endswith(".seconds"):
            continue
        print(summarise(path, args.top))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
