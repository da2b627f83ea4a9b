"""The workloads, written once for every system (tailrace and the peers).

Each workload function takes ``(system, opts)``, starts the system for itself, runs one or
more *cases* through load generators in separate processes (loadgen.py), stops the system, and
returns one result row per case. A row is a plain dict (see ``_row``); runner.py aggregates
repeated runs and prints them. Besides the figures, a row carries what ``--plot`` draws
(bench/plot.py), small enough for ``--json``: ``series``, the messages counted so far every 20 ms
of the measured phase (progress.Sampler), and for latency cases ``latency_cdf``, a quantile curve.

| workload        | cases                              | what is measured                              |
|-----------------|------------------------------------|-----------------------------------------------|
| produce         | produce/memory                     | batched produce, acks=memory: msgs/s, MB/s    |
| produce-durable | produce/durable                    | batched produce, acks=durable                 |
| durable-single  | durable-single/<k>[/same-host]     | one message, wait for the durable ack, repeat |
| consume-hot     | consume/hot                        | read from the start, data still in the rings  |
| consume-cold    | consume/cold                       | read from the start after the rings wrapped   |
| partitions      | partitions/8, /1000, /ratio        | batched produce over many partitions vs 8     |
| e2e-latency     | e2e/<rate>[/same-host]             | produce-to-consume latency at a fixed rate    |
| sizes           | sizes/<bytes>                      | batched produce, acks=memory, per value size  |
| work-queue      | work-queue/<consumers>             | a loaded queue drained by consumers acking each message: msgs/s, ack-to-ack gaps |

The two latency workloads run once per transport (``--transports``): ``zmq``, what any client
on any host uses, and, for tailrace, ``same-host`` (k in 1,16,64 for durable-single).
"""

from __future__ import annotations

import itertools
import os
import time

import numpy as np

from .loadgen import Job, RunResult, _resolve, run_jobs

MiB = 1 << 20
_topic_ids = itertools.count(1)


def new_topic(kind: str) -> str:
    return f"bench-{kind}-{os.getpid()}-{next(_topic_ids)}"


CDF_QUANTILES = 200  # evenly spaced fractions 1/200 ... 1 (p50 and p99 among them; the last is the max)
CDF_TAIL = (0.999, 0.9999)  # added so the tail is drawn from real points


def latency_cdf(lat_ns: np.ndarray) -> list[list[float]]:
    """``[[latency_us, fraction of messages at or below it], ...]``, both ascending: the minimum,
    CDF_QUANTILES evenly spaced quantiles, the CDF_TAIL quantiles, and the maximum (fraction 1).

    About 200 points whatever the message count: the curve is for pictures, the raw latencies
    stay in the load generators.
    """
    n = len(lat_ns)
    if n == 0:
        return []
    us = np.sort(np.asarray(lat_ns, dtype=np.float64)) / 1000.0
    fractions = np.concatenate((np.arange(1, CDF_QUANTILES + 1) / CDF_QUANTILES, CDF_TAIL))
    ranks = np.unique(np.concatenate(([1], np.ceil(fractions * n).astype(np.int64))))  # 1-based, 1..n
    values = np.unique(us[np.clip(ranks, 1, n) - 1])
    at_or_below = np.searchsorted(us, values, side="right") / n  # exact with ties
    return [[round(float(v), 1), round(float(f), 6)] for v, f in zip(values, at_or_below)]


def latency_summary(lat_ns: np.ndarray) -> dict:
    if len(lat_ns) == 0:
        return {"count": 0}
    us = np.asarray(lat_ns, dtype=np.float64) / 1000.0
    p50, p99, p999 = np.percentile(us, [50, 99, 99.9])
    return {"count": int(len(us)), "p50_us": round(float(p50), 1), "p99_us": round(float(p99), 1),
            "p999_us": round(float(p999), 1), "max_us": round(float(us.max()), 1)}


def _row(case: str, system, run: RunResult, *, messages: int, size: int, counts: dict,
         latency_ns: np.ndarray | None = None, params: dict | None = None, extra: dict | None = None) -> dict:
    row = {
        "case": case,
        "system": system.name,
        "seconds": round(run.wall_s, 3),
        "msgs_per_s": round(messages / run.wall_s, 1),
        "mb_per_s": round(messages * size / run.wall_s / 1e6, 2),
        "latency": None,
        "counts": counts,
        "cpu": {"broker": run.broker_cpu, "loadgen": run.loadgen},
        "params": params or {},
        "series": run.series,  # [[seconds since the release, messages so far], ...]
        **(extra or {}),
    }
    if latency_ns is not None:
        row["latency"] = latency_summary(latency_ns)
        row["latency_cdf"] = latency_cdf(latency_ns)  # [[us, fraction <= us], ...]
    return row


def _split(items: list, n: int) -> list[list]:
    """``items`` dealt over ``n`` groups (disjoint when there are enough; shared otherwise)."""
    if len(items) >= n:
        return [items[i::n] for i in range(n)]
    return [list(items) for _ in range(n)]


def _quota(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def _produce_case(system, o, case: str, *, acks: str, partitions: int, size: int, messages: int,
                  batch: int, ring_bytes: int, label: str | None = None) -> dict:
    topic = new_topic(case.replace("/", "-"))
    system.create_topic(topic, partitions, ring_bytes)
    system.warm(topic, partitions)
    groups = _split(list(range(partitions)), o.producers)
    jobs = [Job(f"{system.gen}:produce", {
        "endpoint": system.endpoint, "direct": not o.via_router, "topic": topic, "partitions": parts, "messages": q, "size": size,
        "batch": batch, "acks": acks, "in_flight": o.in_flight, "max_outstanding": o.outstanding,
        "max_seconds": o.max_seconds})
        for parts, q in zip(groups, _quota(messages, o.producers))]
    run = run_jobs(jobs, label=label or f"{system.name} {case}", total=messages, timeout_s=o.max_seconds + 120,
                   broker_pids=system.pids(), on_go=_profiler(o, system, case))
    sent = sum(r["sent"] for r in run.results)
    acked = sum(r["acked"] for r in run.results)
    return _row(case, system, run, messages=acked, size=size,
                counts={"expected": messages, "sent": sent, "acked": acked, "errors": sum(r["errors"] for r in run.results)},
                params={"acks": acks, "partitions": partitions, "size": size, "batch": batch, "ring_bytes": ring_bytes,
                        "producers": o.producers, "in_flight_per_partition": o.in_flight})


class Scraper:
    """``--scrape-every S``: scrape the broker's metrics endpoint every S seconds while the
    workload runs, as Prometheus would (the cost of being watched)."""

    def __init__(self, url: str | None, every_s: float):
        import threading

        self.url, self.every_s, self.times = url, every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)
        if url:
            self._thread.start()

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(self.every_s):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    r.read()
            except OSError:
                continue
            self.times.append(time.perf_counter() - t0)

    def summary(self) -> dict:
        t = sorted(self.times)
        return {"count": len(t), "p50_ms": round(1000 * t[len(t) // 2], 2) if t else None,
                "max_ms": round(1000 * t[-1], 2) if t else None}

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)


def _with_system(workload: str):
    """Decorator: start the system for the workload and always stop it."""
    def wrap(fn):
        def run(system, o):
            system.start(workload)
            scraper = Scraper(getattr(system, "metrics_url", None), o.scrape_every) if getattr(o, "scrape_every", 0) else None
            try:
                rows = fn(system, o)
                if scraper is not None:
                    for r in rows:
                        r["scrapes"] = scraper.summary()
                return rows
            finally:
                if scraper is not None:
                    scraper.stop()
                system.stop()
        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        return run
    return wrap


@_with_system("produce")
def produce(system, o) -> list[dict]:
    return [_produce_case(system, o, "produce/memory", acks="memory", partitions=o.partitions, size=o.size,
                          messages=o.messages, batch=o.batch, ring_bytes=o.ring_bytes)]


@_with_system("produce-durable")
def produce_durable(system, o) -> list[dict]:
    return [_produce_case(system, o, "produce/durable", acks="durable", partitions=o.partitions, size=o.size,
                          messages=o.messages, batch=o.batch, ring_bytes=o.ring_bytes)]


def _transports(system, o) -> list[str]:
    """The client transports to run latency workloads over: ``zmq`` always; ``same-host`` (Unix
    sockets to the workers, consumers reading the rings) where the system has one."""
    return [t for t in o.transports if t == "zmq" or getattr(system, "same_host", False)]


def _suffix(transport: str) -> str:
    return "" if transport == "zmq" else f"/{transport}"


@_with_system("durable-single")
def durable_single(system, o) -> list[dict]:
    rows = []
    for k in o.single_producers:
        for transport in _transports(system, o):
            rows.append(_single_case(system, o, k, transport))
    return rows


def _single_case(system, o, k: int, transport: str) -> dict:
    placed = getattr(o, "partitioner", "pinned") if system.gen.endswith("aio") else "pinned"
    case = (f"durable-single/{k}{_suffix(transport)}{'' if placed == 'pinned' else '/' + placed}"
            f"{getattr(system, 'case_suffix', '')}")
    topic = new_topic(f"single{k}")
    system.create_topic(topic, o.partitions, o.ring_bytes)
    system.warm(topic, o.partitions)
    procs = max(1, min(k, o.single_procs))
    per_proc = _quota(k, procs)
    quotas = _quota(o.single_messages, procs)
    first = np.concatenate(([0], np.cumsum(per_proc)[:-1])).tolist()
    jobs = [Job(f"{system.gen}:single", {
        "endpoint": system.endpoint, "direct": not o.via_router, "same_host": transport == "same-host", "topic": topic,
        "partitions": o.partitions, "producers": n, "first_producer": f, "messages": q, "size": o.size, "acks": "durable",
        "max_seconds": o.single_seconds, "uvloop": getattr(o, "uvloop", False), "partitioner": placed})
        for n, q, f in zip(per_proc, quotas, first)]
    run = run_jobs(jobs, label=f"{system.name} {case}", total=o.single_messages, timeout_s=o.single_seconds + 120,
                   broker_pids=system.pids(), on_go=_profiler(o, system, case))
    acked = sum(r["acked"] for r in run.results)
    lat = np.concatenate([r["latency_ns"] for r in run.results])
    return _row(case, system, run, messages=acked, size=o.size, latency_ns=lat,
                counts={"expected": sum(r["sent"] for r in run.results), "sent": sum(r["sent"] for r in run.results),
                        "acked": acked, "errors": sum(r["errors"] for r in run.results),
                        "redirected": sum(r.get("redirected", 0) for r in run.results)},
                params={"producers": k, "processes": procs, "partitions": o.partitions, "size": o.size,
                        "transport": transport, "max_seconds": o.single_seconds, "uvloop": getattr(o, "uvloop", False),
                        "partitioner": placed})


def _consume_case(system, o, case: str, ring_bytes: int) -> dict:
    topic = new_topic(case.replace("/", "-"))
    system.create_topic(topic, o.partitions, ring_bytes)
    groups = _split(list(range(o.partitions)), o.producers)
    prep = [Job(f"{system.gen}:produce", {
        "endpoint": system.endpoint, "direct": not o.via_router, "topic": topic, "partitions": parts, "messages": q, "size": o.size,
        "batch": o.batch, "acks": "durable", "in_flight": o.in_flight, "max_outstanding": o.outstanding,
        "max_seconds": o.max_seconds})
        for parts, q in zip(groups, _quota(o.messages, o.producers))]
    written = run_jobs(prep, label=f"{system.name} {case} (fill)", total=o.messages, timeout_s=o.max_seconds + 120)
    per_partition = _per_partition_counts(written.results, o)
    cgroups = _split(list(range(o.partitions)), o.consumers)
    if len(cgroups[0]) == o.partitions and o.consumers > 1:  # fewer partitions than consumers: one reads all
        cgroups = cgroups[:1]
    jobs = [Job(f"{system.gen}:consume", {
        "endpoint": system.endpoint, "direct": not o.via_router, "topic": topic, "partitions": parts,
        "expected": sum(per_partition[p] for p in parts), "fetch_bytes": o.fetch_bytes, "max_seconds": o.max_seconds})
        for parts in cgroups]
    total = sum(per_partition.values())
    run = run_jobs(jobs, label=f"{system.name} {case}", total=total, timeout_s=o.max_seconds + 120,
                   broker_pids=system.pids(), on_go=_profiler(o, system, case))
    consumed = sum(r["consumed"] for r in run.results)
    sources: dict = {}
    for r in run.results:
        for k, v in r.get("sources", {}).items():
            sources[k] = sources.get(k, 0) + v
    return _row(case, system, run, messages=consumed, size=o.size,
                counts={"expected": total, "acked": sum(r["acked"] for r in written.results), "consumed": consumed},
                params={"partitions": o.partitions, "size": o.size, "ring_bytes": ring_bytes, "consumers": len(jobs),
                        "fetch_bytes": o.fetch_bytes},
                extra={"sources": sources})


def _per_partition_counts(results: list[dict], o) -> dict[int, int]:
    """Records each partition received in the fill phase (producers deal batches round robin)."""
    counts = dict.fromkeys(range(o.partitions), 0)
    for r in results:
        for p, n in r.get("by_partition", {}).items():
            counts[p] += n
    if sum(counts.values()) == 0:  # a generator that does not report by partition
        acked = sum(r["acked"] for r in results)
        return {p: acked // o.partitions + (1 if p < acked % o.partitions else 0) for p in counts}
    return counts


@_with_system("consume-hot")
def consume_hot(system, o) -> list[dict]:
    return [_consume_case(system, o, "consume/hot", o.hot_ring_bytes)]


@_with_system("consume-cold")
def consume_cold(system, o) -> list[dict]:
    return [_consume_case(system, o, "consume/cold", o.cold_ring_bytes)]


@_with_system("partitions")
def partitions(system, o) -> list[dict]:
    base = _produce_case(system, o, f"partitions/{o.partitions}", acks="memory", partitions=o.partitions, size=o.size,
                         messages=o.messages, batch=o.many_batch, ring_bytes=o.many_ring_bytes)
    many = _produce_case(system, o, f"partitions/{o.many_partitions}", acks="memory", partitions=o.many_partitions,
                         size=o.size, messages=o.messages, batch=o.many_batch, ring_bytes=o.many_ring_bytes)
    ratio = many["msgs_per_s"] / base["msgs_per_s"] if base["msgs_per_s"] else 0.0
    return [base, many, {"case": "partitions/ratio", "system": system.name, "ratio": round(ratio, 3),
                         "msgs_per_s": None, "params": {"many": o.many_partitions, "base": o.partitions},
                         "counts": {"expected": base["counts"]["expected"] + many["counts"]["expected"],
                                    "acked": base["counts"]["acked"] + many["counts"]["acked"]}}]


@_with_system("e2e-latency")
def e2e_latency(system, o) -> list[dict]:
    """One case per transport: ``zmq`` (ZeroMQ produce, long-poll fetches: any host) and, for
    tailrace, ``same-host`` (produce over the workers' Unix sockets, the consumer reading the
    rings: client/ring_reader.py)."""
    return [_e2e_case(system, o, transport) for transport in _transports(system, o)]


def _e2e_case(system, o, transport: str) -> dict:
    case = f"e2e/{o.rate}{_suffix(transport)}{getattr(system, 'case_suffix', '')}"
    topic = new_topic("e2e")
    system.create_topic(topic, o.partitions, o.ring_bytes)
    system.warm(topic, o.partitions)
    total = int(o.rate * o.duration)
    common = {"endpoint": system.endpoint, "direct": not o.via_router, "same_host": transport == "same-host", "topic": topic,
              "partitions": o.partitions, "size": max(o.size, 8), "max_seconds": o.duration * 3 + 10,
              "uvloop": getattr(o, "uvloop", False), "client": getattr(o, "client", "blocking")}
    jobs = [Job(f"{system.gen}:e2e_consume", {**common, "expected": total, "max_wait_ms": o.max_wait_ms}),
            Job(f"{system.gen}:e2e_produce", {**common, "rate": o.rate, "messages": total, "acks": "memory"})]
    run = run_jobs(jobs, label=f"{system.name} {case}", total=total, timeout_s=o.duration * 3 + 130,
                   broker_pids=system.pids(), on_go=_profiler(o, system, case))
    cons, prod = run.results
    return _row(case, system, run, messages=cons["consumed"], size=o.size, latency_ns=cons["latency_ns"],
                counts={"expected": total, "sent": prod["sent"], "acked": prod["acked"], "consumed": cons["consumed"],
                        "errors": prod.get("errors", 0), "redirected": prod.get("redirected", 0)},
                params={"rate": o.rate, "duration_s": o.duration, "partitions": o.partitions, "acks": "memory",
                        "transport": transport, "max_wait_ms": o.max_wait_ms, "rate_achieved": round(prod["rate_achieved"], 1),
                        "uvloop": getattr(o, "uvloop", False)})


@_with_system("sizes")
def sizes(system, o) -> list[dict]:
    rows = []
    for size in o.sizes:
        batch = max(1, min(o.batch, o.batch_bytes // size))
        messages = max(batch, min(o.messages, o.sweep_bytes // size))
        rows.append(_produce_case(system, o, f"sizes/{size}", acks="memory", partitions=o.partitions, size=size,
                                  messages=messages, batch=batch, ring_bytes=o.ring_bytes))
    return rows


QUEUE_GEN = {"tailrace.bench.gen_aio": "tailrace.bench.gen_tailrace"}  # --client async: the same ShareConsumer


@_with_system("work-queue")
def work_queue(system, o) -> list[dict]:
    """A work queue: a producer loads ``--queue-messages`` values of ``--size`` bytes (each starting
    with its id), untimed; then ``--queue-consumers`` processes drain the queue, acknowledging
    every message on its own in the system's own way (gen_*.py ``queue_work``), until all of them
    together acknowledged what was loaded. msgs/s: distinct ids acknowledged over the drain (the
    release to the last acknowledgement of any consumer); latency: the gaps between consecutive
    acknowledgements of one consumer, every consumer's together; counts: distinct ids, duplicates
    (acknowledgements beyond the first of an id) and ids never acknowledged."""
    gen = QUEUE_GEN.get(system.gen, system.gen)
    module = __import__(gen, fromlist=["queue_work"])
    n, k = o.queue_messages, o.queue_consumers
    xack = getattr(o, "xack", "batch")
    case = f"work-queue/{k}" + ("/xack-each" if system.name == "redis" and xack == "each" else "")
    name = new_topic("queue")
    spec = {"endpoint": system.endpoint, "queue": name, "group": f"{name}-workers", "partitions": o.queue_partitions,
            "ring_bytes": o.queue_ring_bytes, "size": max(o.size, 8), "batch": o.queue_batch, "consumers": k,
            "poll_ms": o.queue_poll_ms, "max_seconds": o.queue_seconds, "xack": xack}
    module.queue_setup(spec)
    fillers = max(1, o.producers)
    firsts = np.concatenate(([0], np.cumsum(_quota(n, fillers))[:-1])).tolist()
    t_fill = time.monotonic()
    fill = run_jobs([Job(f"{gen}:queue_fill", {**spec, "first_id": f, "messages": q})
                     for f, q in zip(firsts, _quota(n, fillers))],
                    label=f"{system.name} {case} (fill)", total=n, timeout_s=o.queue_seconds + 120)
    loaded = sum(r["acked"] for r in fill.results)
    depth = None
    if hasattr(module, "queue_depth"):  # no publish confirms (RabbitMQ): wait until the queue holds them
        deadline = time.monotonic() + o.queue_seconds
        while (depth := module.queue_depth(spec)) < loaded and time.monotonic() < deadline:
            time.sleep(0.1)
        loaded = min(loaded, depth)
    fill_s = time.monotonic() - t_fill
    jobs = [Job(f"{gen}:queue_work", {**spec, "expected": loaded}) for _ in range(k)]
    run = run_jobs(jobs, label=f"{system.name} {case}", total=loaded, timeout_s=o.queue_seconds + 120,
                   broker_pids=system.pids(), on_go=_profiler(o, system, case))
    ids = np.concatenate([r["ids"] for r in run.results])
    distinct = np.unique(ids)
    known = distinct[(distinct >= 0) & (distinct < n)]
    last = max((r["last_ack_ns"] for r in run.results if r["acked"]), default=0)
    start = min(r["t_start"] for r in run.results)
    if last:
        run.wall_s = max(last / 1e9 - start, 1e-9)  # the drain: release -> last acknowledgement
    gaps = np.concatenate([r["gaps_ns"] for r in run.results])
    per = [{key: v for key, v in r.items() if key not in ("ids", "gaps_ns")} for r in run.results]
    for p, r in zip(per, run.results):
        p["gap_p50_us"], p["gap_p99_us"] = (np.percentile(r["gaps_ns"], [50, 99]) / 1000).round(1).tolist() \
            if len(r["gaps_ns"]) else (None, None)
    return [_row(case, system, run, messages=len(distinct), size=spec["size"], latency_ns=gaps,
                 counts={"expected": n, "loaded": loaded, "acked": int(len(ids)), "distinct": int(len(distinct)),
                         "duplicates": int(len(ids) - len(distinct)), "missing": int(n - len(known)),
                         "unknown": int(len(distinct) - len(known))},
                 params={"consumers": k, "size": spec["size"], "batch": o.queue_batch, "poll_ms": o.queue_poll_ms,
                         "partitions": o.queue_partitions if system.name == "tailrace" else 1, "fillers": fillers,
                         **({"xack": xack} if system.name == "redis" else {})},
                 extra={"fill": {"seconds": round(fill_s, 3), "msgs_per_s": round(loaded / max(fill_s, 1e-9), 1),
                                 "depth": depth},
                        "consumers": per})]


WORKLOADS = {
    "produce": produce,
    "produce-durable": produce_durable,
    "durable-single": durable_single,
    "consume-hot": consume_hot,
    "consume-cold": consume_cold,
    "partitions": partitions,
    "e2e-latency": e2e_latency,
    "sizes": sizes,
    "work-queue": work_queue,
}


def _profiler(o, system, case: str):
    """on_go hook: profile every server process for the run when --profile DIR is given."""
    if not getattr(o, "profile", None):
        return None
    from .profiles import start_profilers

    return lambda: start_profilers(o.profile, case, system.name, system.pids(), o.profile_seconds)

