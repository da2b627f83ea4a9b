"""What one request/reply hop between two Python processes costs on this machine, with no broker:
the floor under every per-message workload (durable-single, e2e).

    python -m tailrace.bench.probes.hop --round-trips 20000 --in-flight 1,64

A client process sends a 100-byte request and an echo process sends it back, over

- ``zmq``: DEALER -> ROUTER over ipc, as tailrace's clients and workers talk (each message passes
  the sending process's ZeroMQ I/O thread and the receiving one's);
- ``unix``: a plain Unix stream socket pair, each side blocking in ``recv`` (no I/O threads).

With ``--in-flight 1`` each request waits for its reply (latency: p50/p99 per round trip); with
more, that many requests are kept outstanding (throughput). CPU is user+system time of both
processes (all their threads) per round trip, from ``resource.getrusage`` in each. Stops after
``--round-trips`` per case.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import tempfile
import time

import numpy as np
import zmq

PAYLOAD = bytes(100)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _echo_zmq(endpoint: str, total: int, out) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(endpoint)
    out.put(("ready", 0.0))
    c0 = _cpu_s()
    for _ in range(total):
        s.send_multipart(s.recv_multipart(copy=False), copy=False)
    out.put(("echo", _cpu_s() - c0))
    s.close(linger=1000)
    ctx.term()


def _echo_unix(sock: socket.socket, total: int, out) -> None:
    out.put(("ready", 0.0))
    c0 = _cpu_s()
    n = len(PAYLOAD)
    for _ in range(total):
        buf = sock.recv(n, socket.MSG_WAITALL)
        sock.sendall(buf)
    out.put(("echo", _cpu_s() - c0))
    sock.close()


def _drive(send, recv, total: int, in_flight: int) -> tuple[np.ndarray, float, float]:
    """Keep ``in_flight`` requests outstanding; return (round-trip ns, wall s, client CPU s)."""
    lat = np.zeros(total, dtype=np.int64)
    sent_at: list[int] = []
    c0, t0 = _cpu_s(), time.perf_counter()
    sent = got = 0
    while got < total:
        while sent < total and sent - got < in_flight:
            sent_at.append(time.perf_counter_ns())
            send()
            sent += 1
        recv()
        lat[got] = time.perf_counter_ns() - sent_at[got]
        got += 1
    return lat, time.perf_counter() - t0, _cpu_s() - c0


def run_case(transport: str, total: int, in_flight: int) -> dict:
    ctx_mp = mp.get_context("spawn")
    out = ctx_mp.Queue()
    tmp = tempfile.mkdtemp(prefix="tailrace-hop-")
    zctx = sock = None
    try:
        if transport == "zmq":
            endpoint = f"ipc://{tmp}/echo"
            proc = ctx_mp.Process(target=_echo_zmq, args=(endpoint, total, out))
            proc.start()
            assert out.get(timeout=30)[0] == "ready"
            zctx = zmq.Context()
            sock = zctx.socket(zmq.DEALER)
            sock.connect(endpoint)
            send = lambda: sock.send(PAYLOAD, copy=False)  # noqa: E731
            recv = lambda: sock.recv(copy=False)  # noqa: E731
        else:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            proc = ctx_mp.Process(target=_echo_unix, args=(theirs, total, out))
            proc.start()
            theirs.close()
            assert out.get(timeout=30)[0] == "ready"
            sock = mine
            n = len(PAYLOAD)
            send = lambda: sock.sendall(PAYLOAD)  # noqa: E731
            recv = lambda: sock.recv(n, socket.MSG_WAITALL)  # noqa: E731
        lat, wall, client_cpu = _drive(send, recv, total, in_flight)
        _, echo_cpu = out.get(timeout=60)
        proc.join(30)
    finally:
        if sock is not None:
            if zctx is not None:
                sock.close(linger=0)
            else:
                sock.close()
        if zctx is not None:
            zctx.term()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)
    return {
        "transport": transport,
        "in_flight": in_flight,
        "round_trips": total,
        "round_trips_per_s": round(total / wall),
        "p50_us": round(float(np.percentile(lat, 50)) / 1000, 1),
        "p99_us": round(float(np.percentile(lat, 99)) / 1000, 1),
        "cpu_us_per_round_trip": round((client_cpu + echo_cpu) / total * 1e6, 1),
        "client_cpu_us": round(client_cpu / total * 1e6, 1),
        "echo_cpu_us": round(echo_cpu / total * 1e6, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=20_000)
    ap.add_argument("--in-flight", default="1,64", help="comma-separated outstanding requests per case")
    ap.add_argument("--transports", default="zmq,unix")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args(argv)
    rows = [run_case(t, o.round_trips, int(k)) for k in o.in_flight.split(",") for t in o.transports.split(",")]
    if o.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'transport':9}  {'in flight':>9}  {'round trips/s':>13}  {'p50 us':>7}  {'p99 us':>7}  "
          f"{'CPU us/rt (client+echo)':>24}")
    for r in rows:
        print(f"{r['transport']:9}  {r['in_flight']:>9}  {r['round_trips_per_s']:>13,}  {r['p50_us']:>7}  {r['p99_us']:>7}  "
              f"{r['cpu_us_per_round_trip']:>10} ({r['client_cpu_us']} + {r['echo_cpu_us']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
