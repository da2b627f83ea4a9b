"""CI smoke test of the benchmark harness: it runs, exits 0, and its counts add up.

Tiny sizes, a few seconds in all; no timing assertion (a 2-core CI box says nothing about
speed). Runs ``tailrace bench`` exactly as a person would, through the CLI in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str, timeout_s: float = 240.0) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tailrace", "bench", *args, "--json"], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"bench exited {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


def by_case(doc: dict) -> dict[str, dict]:
    return {r["case"]: r for r in doc["results"]}


def test_bench_produce_and_consume_counts_add_up():
    doc = run_bench("produce", "consume-hot", "--messages", "20000", "--batch", "1000", "--partitions", "4",
                    "--hot-ring-bytes", str(4 << 20), "--ring-bytes", str(4 << 20))
    rows = by_case(doc)
    produced = rows["produce/memory"]["counts"]
    assert produced["expected"] == produced["sent"] == produced["acked"] == 20000
    assert produced["errors"] == 0
    consumed = rows["consume/hot"]["counts"]
    assert consumed["acked"] == consumed["expected"] == consumed["consumed"] == 20000
    assert rows["consume/hot"]["sources"].get("ring", 0) == 20000
    assert set(rows["produce/memory"]["cpu"]["broker"]) >= {"router", "flusher", "worker-0", "worker-1"}
    assert rows["produce/memory"]["cpu"]["loadgen"]["processes"] == 2


def test_bench_durable_single_and_e2e_latency_report_every_message():
    doc = run_bench("durable-single", "e2e-latency", "--single-producers", "1,4", "--single-messages", "200",
                    "--single-seconds", "20", "--rate", "500", "--duration", "1", "--partitions", "2")
    rows = by_case(doc)
    for k in (1, 4):
        row = rows[f"durable-single/{k}"]
        assert row["counts"]["sent"] == row["counts"]["acked"] == row["latency"]["count"] == 200
    e2e = rows["e2e/500"]
    assert e2e["counts"]["sent"] == e2e["counts"]["acked"] == e2e["counts"]["consumed"] == 500
    assert e2e["latency"]["count"] == 500


def test_bench_e2e_latency_through_the_asyncio_client_reports_every_message_on_both_transports():
    """``--client async``: gen_aio's producer and AsyncConsumer, over ZeroMQ and on the same host
    (ring reads woken by the WATCH doorbell)."""
    doc = run_bench("e2e-latency", "--client", "async", "--rate", "500", "--duration", "1", "--partitions", "2",
                    "--transports", "zmq,same-host")
    rows = by_case(doc)
    for case in ("e2e/500/async", "e2e/500/same-host/async"):
        counts = rows[case]["counts"]
        assert counts["sent"] == counts["acked"] == counts["consumed"] == 500, (case, counts)
        assert counts["errors"] == 0 and rows[case]["latency"]["count"] == 500


def test_bench_work_queue_acknowledges_every_message_once_through_the_share_group():
    """``work-queue`` (share groups): 4 ShareConsumer processes drain what was loaded, each
    record acknowledged on its own; every id comes back, none twice, none unknown."""
    doc = run_bench("work-queue", "--queue-messages", "2000", "--queue-batch", "100", timeout_s=120)
    row = by_case(doc)["work-queue/4"]
    c = row["counts"]
    assert c["expected"] == c["loaded"] == c["distinct"] == 2000, c
    assert c["duplicates"] == c["missing"] == c["unknown"] == 0 and c["acked"] == 2000, c
    assert len(row["consumers"]) == 4 and sum(x["acked"] for x in row["consumers"]) == 2000
    assert all(x["refused_ranges"] == 0 for x in row["consumers"])
    assert row["latency"]["count"] == 2000 - sum(1 for x in row["consumers"] if x["acked"]) and row["msgs_per_s"] > 0


def test_bench_hop_reports_every_round_trip_of_both_transports():
    proc = subprocess.run([sys.executable, "-m", "tailrace.bench.probes.hop", "--round-trips", "300", "--in-flight", "1,8", "--json"],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(proc.stdout)
    assert {(r["transport"], r["in_flight"]) for r in rows} == {("zmq", 1), ("unix", 1), ("zmq", 8), ("unix", 8)}
    for r in rows:
        assert r["round_trips"] == 300 and r["round_trips_per_s"] > 0 and 0 < r["p50_us"] <= r["p99_us"]


def test_bench_against_a_running_broker_deletes_the_topics_it_made(make_broker):
    """``--bootstrap`` is someone's broker: its bench-* topics (32 MiB rings each at full size)
    once stayed, with their share of the shared-memory budget."""
    from tailrace import Admin

    b = make_broker()
    with Admin(b.bootstrap) as admin:
        admin.create_topic("mine", 1)
        before = admin.status()["shm_used_bytes"]
    doc = run_bench("produce", "consume-hot", "--bootstrap", b.bootstrap, "--messages", "4000", "--batch", "500",
                    "--partitions", "2", "--producers", "1", "--consumers", "1", "--hot-ring-bytes", str(4 << 20),
                    "--ring-bytes", str(4 << 20))
    assert by_case(doc)["produce/memory"]["counts"]["acked"] == 4000
    with Admin(b.bootstrap) as admin:
        assert [t.name for t in admin.list_topics()] == ["mine"]
        assert admin.status()["shm_used_bytes"] == before


def test_the_format_bench_runs_every_variant_and_reports_ratios():
    """bench/format_bench.py (docs/BENCHMARKS.md "Record format v2") end to end, tiny: every
    variant produces and consumes every record; zstd's journal bytes are below uncompressed."""
    from tailrace.bench import format_bench
    out = format_bench.main(["--messages", "8000", "--rounds", "1", "--json",
                             "--variants", "none,zstd,lz4,headers3,snappy,gzip,zstd1"])
    v = out["variants"]
    assert set(v) == {"none", "zstd", "lz4", "headers3", "snappy", "gzip", "zstd1"}
    assert all(x["median"]["produce"] > 0 and x["median"]["consume"] > 0 for x in v.values())
    assert v["zstd"]["ratio_to_none"]["bytes_per_record"] < 0.5 < v["headers3"]["ratio_to_none"]["bytes_per_record"]


def needs_etcd() -> None:
    """Skip, saying why, where the cluster extra or an etcd binary is missing."""
    pytest.importorskip("etcd3gw")
    from tailrace.cluster.etcd_server import etcd_binary
    try:
        etcd_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_the_cluster_bench_loads_metadata_and_times_a_broker_and_a_controller_death():
    """bench/cluster_bench.py (docs/BENCHMARKS.md "Cluster (issue 33)") end to end, tiny, its two
    cluster-only steps and the consume-alone one (the single-vs-cluster step runs format_bench's produce and consume and the
    e2e probe, smoke-tested above): a 3-broker cluster describes every partition; a killed broker's
    partitions go to NO_LEADER and a killed controller is replaced, within the ttl plus a margin."""
    needs_etcd()
    from tailrace.bench import cluster_bench
    out = cluster_bench.main(["--steps", "consume,metadata,failover", "--messages", "20000", "--read-rounds", "1",
                              "--meta-partitions", "30", "--meta-loads", "1", "--ttls", "2", "--deaths", "1"])
    c = out["consume"]
    assert len(c["single"]["runs"]) == len(c["cluster"]["runs"]) == 1 and c["ratio_cluster_to_single"] > 0
    m = out["metadata"]
    assert "create_error" not in m and "settle_error" not in m, m
    assert sum(m["partitions_by_leader"].values()) == 30 and len(m["admin_s"]["runs"]) == 1
    f = out["failover"]["2"]
    assert f["notes"] == [], f
    assert 0 < f["broker_death_to_unavailable_s"]["median"] < 2 + 3
    assert 0 < f["controller_death_to_new_controller_s"]["median"] < 2 + 3


def test_the_replication_bench_produces_with_every_acks_level_and_times_a_follower_s_catch_up():
    """bench/replication_bench.py (docs/BENCHMARKS.md "Replication (issue 34)") end to end, tiny,
    on three brokers: acks=all leaves every record on all three, the 64 durable single senders
    get every answer OK, and a follower whose router was paused copies nothing meanwhile and then
    catches up to exactly the leaders' ends."""
    needs_etcd()
    from tailrace.bench import replication_bench
    out = replication_bench.main(["--messages", "20000", "--rounds", "1", "--single-seconds", "1",
                                  "--catchup-messages", "20000", "--steps", "produce,single,catchup"])
    # (its failover step is tests/cluster/test_failover.py's kill at a shorter TTL)
    modes = out["produce"]["modes"]
    assert set(modes) == {"all/RF3", "memory/RF1", "durable/RF3"}
    assert modes["all/RF3"]["runs"][0]["held_by_broker"] == [20000] * 3
    assert all(r > 0 for r in out["produce"]["ratio_to_memory_rf1"].values())
    for rf in ("RF3", "RF1"):
        s = out["single"][rf]
        assert s["errors"] == 0 and s["acked"] == s["sent"] > 0, s
    k = out["catchup"]
    assert "error" not in k, k
    assert k["copied_while_paused"] == 0 and k["behind_at_resume"] == 20000 and k["records_per_s"] > 0
