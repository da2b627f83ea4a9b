"""Aggregate repeated runs (median, min, max) and print result tables.

A case run N times becomes one row: the run with the median msgs/s (or ratio) stands for it,
with ``runs`` (every run's figure), ``min`` and ``max`` added, and latency percentiles replaced
by their medians over the runs. Targets are the issue's goals for a 2-core machine.
"""

from __future__ import annotations

import statistics
from typing import Iterable

# case -> list of (metric path, comparison, threshold)
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "produce/memory": [("msgs_per_s", ">=", 2_000_000)],
    "produce/durable": [("msgs_per_s", ">=", 1_000_000)],
    "durable-single/64": [("msgs_per_s", ">=", 40_000), ("latency.p99_us", "<=", 10_000)],
    "consume/hot": [("msgs_per_s", ">=", 4_000_000)],
    "consume/cold": [("msgs_per_s", ">=", 1_500_000)],
    "partitions/ratio": [("ratio", ">=", 0.8)],
    "e2e/5000": [("latency.p99_us", "<=", 1_000)],
    "e2e/5000/same-host": [("latency.p99_us", "<=", 1_000)],
    "durable-single/64/same-host": [("msgs_per_s", ">=", 40_000), ("latency.p99_us", "<=", 10_000)],
    # ack-to-ack p99; the throughput goal (>= 2x the best peer's) is compare.py's ratio column
    "work-queue/4": [("latency.p99_us", "<=", 10_000)],
}


def metric(row: dict, path: str):
    cur = row
    for part in path.split("."):
        if not isinstance(cur, dict) or cur.get(part) is None:
            return None
        cur = cur[part]
    return cur


def main_value(row: dict) -> float | None:
    return row.get("ratio") if row.get("ratio") is not None else row.get("msgs_per_s")


def aggregate(rows: Iterable[dict], judge: bool = True) -> list[dict]:
    """One row per (system, case): the median run, with min/max; ``judge``: check the target."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["case"]), []).append(r)
    out = []
    for (_system, _case), runs in groups.items():
        values = [main_value(r) for r in runs]
        ranked = sorted(range(len(runs)), key=lambda i: values[i] if values[i] is not None else -1)
        rep = dict(runs[ranked[(len(runs) - 1) // 2]])
        good = [v for v in values if v is not None]
        rep["runs"] = values
        rep["min"] = min(good) if good else None
        rep["max"] = max(good) if good else None
        lats = [r["latency"] for r in runs if r.get("latency") and r["latency"].get("count")]
        if lats:
            rep["latency"] = dict(rep["latency"])
            for key in ("p50_us", "p99_us", "p999_us", "max_us"):
                rep["latency"][key] = round(statistics.median(l[key] for l in lats), 1)
        rep["target"] = check_target(rep) if judge else None
        out.append(rep)
    return out


def check_target(row: dict) -> dict | None:
    goals = TARGETS.get(row["case"])
    if not goals or row.get("system") != "tailrace":
        return None
    parts, met = [], True
    for path, op, threshold in goals:
        v = metric(row, path)
        ok = v is not None and (v >= threshold if op == ">=" else v <= threshold)
        met = met and ok
        parts.append(f"{path} {op} {threshold:,g}")
    return {"goal": " and ".join(parts), "met": met}


def fmt_rate(v) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def fmt_value(row: dict) -> str:
    if row.get("ratio") is not None:
        s = f"{row['ratio']:.2f}x"
        if row.get("min") is not None and len(row.get("runs", [])) > 1:
            s += f" [{row['min']:.2f}-{row['max']:.2f}]"
        return s
    s = fmt_rate(row.get("msgs_per_s"))
    if len(row.get("runs", [])) > 1 and row.get("min") is not None:
        s += f" [{fmt_rate(row['min'])}-{fmt_rate(row['max'])}]"
    return s


def fmt_latency(row: dict) -> str:
    lat = row.get("latency")
    if not lat or not lat.get("count"):
        return "-"
    return f"{lat['p50_us']:,.0f}/{lat['p99_us']:,.0f}/{lat['p999_us']:,.0f}"


def fmt_cpu(row: dict) -> str:
    cpu = (row.get("cpu") or {}).get("broker") or {}
    if not cpu:
        return "-"
    return " ".join(f"{name.replace('worker-', 'w')}:{v['cpu_pct']:.0f}" if v.get("cpu_pct") is not None else f"{name}:?"
                    for name, v in sorted(cpu.items()))


def fmt_loadgen(row: dict) -> str:
    lg = (row.get("cpu") or {}).get("loadgen")
    if not lg:
        return "-"
    return f"{lg['processes']}p {lg['cpu_pct']:.0f}%"


def table(headers: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in body])


def results_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        t = r.get("target")
        body.append([
            r["case"], fmt_value(r),
            "-" if r.get("mb_per_s") is None else f"{r['mb_per_s']:.1f}",
            fmt_latency(r), fmt_cpu(r), fmt_loadgen(r),
            "-" if t is None else ("met" if t["met"] else "MISSED") + f" ({t['goal']})",
        ])
    return table(["case", "msgs/s (median [min-max])", "MB/s", "lat p50/p99/p999 us", "server CPU %", "loadgen",
                  "target"], body)
