"""The Prometheus endpoint (ops/metrics.py) and ``tailrace top``, on a real broker.

A known workload (N records in B bytes of batch frames over P partitions) reads back exactly from
one scrape parsed with prometheus_client's parser; counters never go backwards across a worker's
kill -9 and restart; the Grafana dashboard only names metrics a scrape has; ``tailrace top``
under tmux shows the topic and a non-zero rate while a producer runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.client.connection import Connection
from tailrace.client.records import align8, encode_batch

ROOT = Path(__file__).resolve().parents[2]


def scrape(b) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, of one scrape."""
    with urllib.request.urlopen(b.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(b) -> set[str]:
    with urllib.request.urlopen(b.metrics_url, timeout=10) as r:
        text = r.read().decode()
    fams = list(text_string_to_metric_families(text))
    # a family without samples yet is named by its HELP/TYPE lines (the parser drops a counter's _total)
    return {s.name for fam in fams for s in fam.samples} | {fam.name for fam in fams} | \
        {fam.name + "_total" for fam in fams if fam.type == "counter"}


def part(topic: str, p: int) -> tuple:
    return tuple(sorted({"topic": topic, "partition": str(p)}.items()))


def wait_for(b, check, within_s: float = 15.0) -> dict:
    """Scrape until ``check(scrape)`` holds (processes write their counters once a second)."""
    until = time.monotonic() + within_s
    while True:
        m = scrape(b)
        if check(m) or time.monotonic() > until:
            return m
        time.sleep(0.3)


def test_a_scrape_reads_back_the_workload_exactly_and_counters_survive_a_worker_restart(make_broker):
    b = make_broker(workers=2)
    topic, partitions = "metered", 3
    with Admin(b.bootstrap) as a:
        a.create_topic(topic, partitions)
    conn = Connection(b.bootstrap)
    header = P.encode(P.ProduceRequest(acks=P.Acks.DURABLE))
    n = dict.fromkeys(range(partitions), 0)
    nbytes = dict.fromkeys(range(partitions), 0)
    for i in range(30):
        p = i % partitions
        frame = encode_batch([b"v%05d" % j * (1 + i % 7) for j in range(100 + i)])
        conn.request(P.Op.PRODUCE, topic, p, header, frame)
        n[p] += 100 + i
        nbytes[p] += align8(len(frame))
    conn.close()
    with Consumer(b.bootstrap, max_wait_ms=100) as c:
        c.assign(topic, start="earliest")
        got, until = 0, time.monotonic() + 20
        while got < sum(n.values()) and time.monotonic() < until:
            got += sum(len(r) for _t, _p, r in c.poll_columns(300))
    assert got == sum(n.values())

    # the workers' counters and the router's owners: each program writes its own snapshot once a
    # second, so a scrape may have one before the other
    m = wait_for(b, lambda m: all(m.get(("tailrace_partition_records_fetched_total", part(topic, p))) == n[p]
                                  and ("tailrace_partition_owner_worker", part(topic, p)) in m
                                  for p in range(partitions)))
    with Admin(b.bootstrap) as a:
        offsets = a.list_offsets(topic)
    for p in range(partitions):
        lab = part(topic, p)
        assert m[("tailrace_partition_records_appended_total", lab)] == n[p]
        assert m[("tailrace_partition_bytes_appended_total", lab)] == nbytes[p]
        assert m[("tailrace_partition_high_watermark", lab)] == offsets[p].high_watermark == n[p]
        assert m[("tailrace_partition_durable_watermark", lab)] == offsets[p].durable_watermark == n[p]
        assert m[("tailrace_partition_log_start_offset", lab)] == 0
        assert m[("tailrace_partition_records_fetched_total", lab)] == n[p]
        assert m[("tailrace_partition_durable_lag_records", lab)] == 0
        assert m[("tailrace_partition_owner_worker", lab)] in (0, 1)
    produce_ok = sum(v for (name, lab), v in m.items()
                     if name == "tailrace_worker_requests_total" and ("op", "PRODUCE") in lab and ("code", "OK") in lab)
    assert produce_ok == 30
    assert m[("tailrace_topics", ())] == 1 and m[("tailrace_partitions", ())] == partitions
    assert m[("tailrace_flusher_fsync_duration_seconds_count", ())] > 0
    assert m[("tailrace_flusher_bytes_written_total", ())] >= sum(nbytes.values())
    assert 0 < m[("tailrace_shm_used_bytes", ())] <= m[("tailrace_shm_budget_bytes", ())]
    held = [v for (name, _lab), v in m.items() if name == "tailrace_ring_held_bytes"]  # the keepers' counts
    assert len(held) == 2 and 0 < sum(held) <= m[("tailrace_shm_budget_bytes", ())], held
    assert m[("tailrace_journal_bytes", ())] > 0 and m[("tailrace_journal_segments", ())] >= 1
    assert m[("tailrace_worker_up", (("worker", "0"),))] == 1

    # kill -9 a worker; supervisord restarts it. No counter may go backwards meanwhile.
    before = m
    b.kill9("worker-0")
    with Consumer(b.bootstrap, max_wait_ms=100) as c:  # more traffic, through whichever worker owns what now
        c.assign(topic, start="earliest")
        until = time.monotonic() + 30
        while time.monotonic() < until:
            c.poll_columns(300)
            m = scrape(b)
            for key, v in before.items():
                if key[0].endswith(("_total", "_count", "_bucket", "_sum")) and key in m:
                    assert m[key] >= v, (key, v, m[key])
            before = {**before, **m}
            if m.get(("tailrace_worker_restarts_total", (("worker", "0"),)), 0) >= 1:
                break
    assert m.get(("tailrace_worker_restarts_total", (("worker", "0"),)), 0) >= 1, "the router never saw worker 0 come back"


def test_the_grafana_dashboard_names_only_metrics_a_scrape_has(broker):
    with Admin(broker.bootstrap) as a:
        a.create_topic("dash", 1)
    with Producer(broker.bootstrap, acks="durable") as prod:
        prod.send_batch("dash", [b"x"] * 10)
        prod.flush()
    time.sleep(1.5)
    have = families(broker)
    doc = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 8
    named = {name for e in exprs for name in re.findall(r"\btailrace_[a-z_]+", e)}
    missing = sorted(nm for nm in named if nm not in have)
    assert not missing, f"the dashboard names metrics the broker does not expose: {missing}"


def _tmux() -> str:
    """tmux, installed the project's way (apt, as root) when the machine has none."""
    if shutil.which("tmux") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "tmux"], env=env, capture_output=True, timeout=600)
        if shutil.which("tmux") is None:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-q", "tmux"], env=env, capture_output=True, timeout=600)
    path = shutil.which("tmux")
    if path is None:
        pytest.fail("tmux is not installed and could not be installed")
    return path


def test_top_shows_the_topic_and_a_rate_under_tmux(broker, tmp_path):
    tmux = _tmux()
    with Admin(broker.bootstrap) as a:
        a.create_topic("watched", 2)
    stop = threading.Event()

    def produce():
        with Producer(broker.bootstrap, acks="memory") as prod:
            while not stop.is_set():
                prod.send_batch("watched", [b"y" * 50] * 500)
                prod.flush()
                time.sleep(0.01)

    session = f"tailrace-top-{os.getpid()}"
    sock = str(tmp_path / "tmux.sock")
    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        cmd = f"{sys.executable} -m tailrace top --metrics {broker.metrics_url} --interval 0.5"
        subprocess.run([tmux, "-S", sock, "new-session", "-d", "-s", session, "-x", "200", "-y", "60", cmd], check=True,
                       env={**os.environ, "TERM": "xterm-256color"})
        screen, until = "", time.monotonic() + 30
        while time.monotonic() < until:
            time.sleep(0.5)
            screen = subprocess.run([tmux, "-S", sock, "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
            rows = [line for line in screen.splitlines() if "watched" in line]
            rates = [re.findall(r"[\d,]+", line.split("watched", 1)[1]) for line in rows]
            # the topics row: "watched | 2 (partitions) | in msg/s | ..."
            if any(len(r) >= 2 and r[0] == "2" and int(r[1].replace(",", "")) > 0 for r in rates):
                break
        else:
            pytest.fail(f"no non-zero rate for the topic on the screen:\n{screen}")
        subprocess.run([tmux, "-S", sock, "send-keys", "-t", session, "q"], check=True)
        until = time.monotonic() + 10
        while time.monotonic() < until and subprocess.run([tmux, "-S", sock, "has-session", "-t", session],
                                                          capture_output=True).returncode == 0:
            time.sleep(0.2)
        assert subprocess.run([tmux, "-S", sock, "has-session", "-t", session], capture_output=True).returncode != 0, \
            "q did not quit tailrace top"
    finally:
        stop.set()
        t.join(10)
        subprocess.run([tmux, "-S", sock, "kill-server"], capture_output=True)


def test_consumer_lag_is_exported_per_group_and_partition_in_records_and_seconds_and_top_shows_it(make_broker):
    """Lag was in ``groups describe`` only. Now: records behind the high watermark, and how long
    ago the first record not yet consumed was appended (from the ring, and from the journal once
    the ring has moved past it); 0 s for a partition the group has caught up with."""
    from rich.console import Console

    from tailrace import top

    b = make_broker(workers=2, max_batch_bytes=128 << 10)
    with Admin(b.bootstrap) as a:
        a.create_topic("lagged", 3, 256 << 10)
    with Producer(b.bootstrap) as p:
        p.send_batch("lagged", [b"x%d" % i for i in range(10)], partition=0)
        p.send_batch("lagged", [b"y%d" % i for i in range(4)], partition=1)
    appended = time.time()
    with Admin(b.bootstrap) as a:
        a.reset_offsets("billing", {("lagged", 0): 3, ("lagged", 1): 4, ("lagged", 2): 0})
    # partition 2: 4 MB through a 256 KiB ring, so its first record is found in the journal
    with Producer(b.bootstrap, acks="durable") as p:
        for _ in range(40):
            p.send_batch("lagged", [b"z" * 1000] * 100, partition=2)
    time.sleep(1.2)

    def lag(m, name, part_):
        return m.get((name, tuple(sorted({"group": "billing", "topic": "lagged", "partition": str(part_)}.items()))))

    m = wait_for(b, lambda m: lag(m, "tailrace_group_lag_records", 2) == 4000)
    assert [lag(m, "tailrace_group_lag_records", p_) for p_ in range(3)] == [7, 0, 4000]
    assert lag(m, "tailrace_group_lag_seconds", 1) == 0
    waited = time.time() - appended
    for p_ in (0, 2):
        s = lag(m, "tailrace_group_lag_seconds", p_)
        assert s is not None and 1.0 <= s <= waited + 1.0, (p_, s, waited)
    assert m[("tailrace_group_committed_offset", tuple(sorted({"group": "billing", "topic": "lagged",
                                                                    "partition": "0"}.items())))] == 3
    console = Console(record=True, width=200)
    console.print(top.View().frame(top.scrape(b.metrics_url), time.monotonic()))
    text = console.export_text()
    assert "consumer groups" in text and "billing" in text and "4,007" in text, text
