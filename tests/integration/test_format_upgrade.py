"""Upgrade in place: a data directory the release before record format v2 wrote (every batch
version 1; tests/fixtures/make_v1_datadir.py says how it was made) starts under this release with
no rewrite. Its batches come back byte-identical (fetch), its committed group offsets are there,
time lookups find its batches, new batches in the same partitions are version 2, a restart
recovers the mixed journal, and retention by time drops the old batches when their time comes."""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

from tailrace import Admin, Consumer, Producer
from tailrace.client.records import iter_batches

FIXTURE = Path(__file__).parent.parent / "fixtures" / "v1_datadir.tar.gz"
COUNTS = {0: 30, 1: 21, 2: 12}


def _unpack(tmp_path: Path) -> tuple[Path, dict, dict[int, bytes]]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    # The fixture's group commits are as old as the fixture, and __consumer_offsets keeps records
    # group_offsets_retention_ms (6 h, fixed in its config when it was made): past that, retention
    # rightly drops them at the first start. Their expiry is not what this test is about, so the
    # copy's internal topic keeps its records for ever (the catalog's config only; no batch touched).
    catalog = tmp_path / "data" / "topics.json"
    doc = json.loads(catalog.read_text())
    doc["topics"]["__consumer_offsets"]["config"]["retention.ms"] = -1
    catalog.write_text(json.dumps(doc))
    expected = json.loads((tmp_path / "expected.json").read_text())["topics"]["old"]
    bodies = {p: (tmp_path / "expected" / f"old-{p}.bin").read_bytes() for p in COUNTS}
    return tmp_path / "data", expected, bodies


def _read_raw(bootstrap: str, want: dict[int, int]) -> dict[int, bytes]:
    """Every partition's fetch bodies from the earliest offset, until ``want`` records each."""
    got = {p: bytearray() for p in want}
    counts = dict.fromkeys(want, 0)
    with Consumer(bootstrap, max_wait_ms=100) as c:
        c.assign("old", start="earliest")
        deadline = time.monotonic() + 30
        while counts != want and time.monotonic() < deadline:
            for a, _start, _info, body in c.poll_raw(200):
                buf = bytes(body.buffer if hasattr(body, "buffer") else body)
                got[a.partition] += buf
                counts[a.partition] += sum(v.record_count for v in iter_batches(buf))
    assert counts == want
    return {p: bytes(b) for p, b in got.items()}


def test_a_v1_data_directory_reads_back_byte_identical_and_takes_v2_batches(make_broker, tmp_path):
    data, expected, bodies = _unpack(tmp_path)
    assert all(v.version == 1 for b in bodies.values() for v in iter_batches(b))  # the fixture is what it says
    b = make_broker(data_dir=data)
    assert _read_raw(b.bootstrap, COUNTS) == bodies  # fetch: the very bytes the old release served
    with Consumer(b.bootstrap, group="g") as c:  # the group's offsets, committed as v1 batches
        assert c.committed([("old", p) for p in COUNTS]) == {("old", p): n for p, n in COUNTS.items()}
    with Admin(b.bootstrap) as a:  # time lookup over v1 batches: their append times, as before
        for p in COUNTS:
            times = expected[str(p)]["append_times_us"]
            size = COUNTS[p] // len(times)
            for i, t_us in enumerate(times):
                assert a.list_offsets("old", t_us // 1000)[p].time_offset == i * size, (p, i)

    # New batches into the same partitions are version 2, headers, compression and all.
    future_ms = int(time.time() * 1000) + 600_000  # create times 10 min ahead (within the 1 h bound)
    with Producer(b.bootstrap, acks="durable", linger_ms=0, compression="zstd") as p:
        for part in COUNTS:
            p.send_batch("old", [b"new-%d-%d" % (part, j) for j in range(5)], partition=part,
                         headers=[[("n", b"%d" % j)] for j in range(5)], timestamps_ms=[future_ms + j for j in range(5)])
        assert p.flush() == 15
    total = {p: n + 5 for p, n in COUNTS.items()}
    after = _read_raw(b.bootstrap, total)
    for p, body in after.items():
        assert body.startswith(bodies[p])  # the old bytes still first, untouched
        new = iter_batches(body[len(bodies[p]):])
        assert [(v.version, v.codec, v.base_offset) for v in new] == [(2, 4, COUNTS[p])]
        assert [new[0].timestamp_us(i) // 1000 for i in range(5)] == [future_ms + j for j in range(5)]
        assert new[0].headers.lists() == [(("n", b"%d" % j),) for j in range(5)]
    with Admin(b.bootstrap) as a:  # the first v2 batch is the first record at or after its create time
        assert {o.partition: o.time_offset for o in a.list_offsets("old", future_ms)} == COUNTS

    # A restart recovers the mixed journal: the same bytes again.
    b.stop()
    b.cleanup_shm()
    b.start()
    assert _read_raw(b.bootstrap, total) == after

    # Retention by time: the v1 batches' append times are older than a minute, the v2 records'
    # create times lie ahead, so the log start moves to the first v2 batch and stays there.
    with Admin(b.bootstrap) as a:
        a.alter_configs("old", {"retention.ms": 60_000})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            starts = {o.partition: o.log_start_offset for o in a.list_offsets("old")}
            if starts == COUNTS:
                break
            time.sleep(0.5)
        assert starts == COUNTS
