"""Storage faults. A disk past disk_max_used_ratio: produce is refused with STORAGE_FULL and
nothing acknowledged is deleted (the default policy), or the oldest segments go, never younger
than the minimum age, and are counted (delete_oldest, opt in). A full disk with the guard off:
durable acks fail with STORAGE_UNAVAILABLE, reads go on, the broker heals itself once there is
room. A journal segment of the wrong size at boot.

The journal directory is a small tmpfs of its own (logs, indexes and the catalog stay on the
ordinary disk, so the only thing that runs out of space is the journal), filled with a ballast
file until the next journal segment cannot be pre-written. The producer here retries a batch
that failed with the same bytes (same producer id and sequence) until it is acknowledged, so a
partition's acknowledged records are always its records ``0 .. acked - 1`` and the workload
audit applies. At the end every process is killed and the shared memory unlinked, as a host
crash would: what was acknowledged durable must still be there, read from the journal alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client import protocol as P
from tailrace.broker import settings as settings_mod
from tailrace.client.connection import Connection
from tailrace.client.errors import StorageUnavailableError
from tailrace.client.records import BatchError, encode_batch, encode_batch_buffers, validate_frame
from tailrace.persistence.flusher import Flusher
from tailrace.persistence.index import ENTRY_DTYPE, index_path
from tailrace.broker.datadir import JOURNAL_DIR, segment_name
from tailrace.shm import region
from tailrace.bench.inprocess import make_storage

from tests.helpers import hard_kill_all
from tailrace.bench.audit import Produced, audit, records

SEGMENT_BYTES = 1 << 20
JOURNAL_TMPFS_BYTES = 6 << 20
PRODUCER_ID = 0x5EED_F011
BATCH_RECORDS = 1500  # 54 KB frames: a segment's tail rarely fits one
CLIENT_BATCH_RECORDS = 900


def _mount_tmpfs(path, size_bytes: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if "permission denied" in r.stderr.lower() or "operation not permitted" in r.stderr.lower():
            pytest.skip(f"cannot mount a tmpfs here (EPERM): {r.stderr.strip()}")
        raise RuntimeError(f"mount failed: {r.stderr}")


def _umount(path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class DurableSender:
    """Per partition, one durable batch at a time; a failed batch is resent as is until acked."""

    def __init__(self, bootstrap: str, partitions: int):
        self.conn = Connection(bootstrap)
        self.admin = Admin(bootstrap)
        self.partitions = partitions
        self.acked = dict.fromkeys(range(partitions), 0)
        self.frames: dict[int, tuple[bytes, int]] = {}  # partition -> (batch frame, records) not acked yet
        self.codes: dict[str, int] = {}
        self.ack_beyond_durable = []  # (partition, end offset, durable watermark) seen right after an ack

    def _frame(self, p: int) -> tuple[bytes, int]:
        if p not in self.frames:
            values, offsets = records(p, self.acked[p], BATCH_RECORDS)
            self.frames[p] = (encode_batch_buffers(values, offsets, producer_id=PRODUCER_ID + p, base_sequence=self.acked[p]),
                              BATCH_RECORDS)
        return self.frames[p]

    def round(self, timeout_ms: int = 3000) -> int:
        """Send one batch to every partition and wait for the replies; return how many were acked."""
        header = P.encode(P.ProduceRequest(acks=P.Acks.DURABLE))
        rids = {self.conn.send(P.Op.PRODUCE, "full", p, header, self._frame(p)[0]): p for p in range(self.partitions)}
        ok = 0
        deadline = time.monotonic() + timeout_ms / 1000
        while rids and time.monotonic() < deadline:
            r = self.conn.recv(max(1, int((deadline - time.monotonic()) * 1000)))
            if r is None or r.request_id not in rids:
                continue
            p = rids.pop(r.request_id)
            name = P.ErrorCode(r.code).name
            self.codes[name] = self.codes.get(name, 0) + 1
            if r.code == P.ErrorCode.OK:
                rep = P.decoder(P.ProduceReply).decode(r.header)
                assert rep.base_offset == self.acked[p], (p, rep.base_offset, self.acked[p])
                self.acked[p] += self.frames.pop(p)[1]
                durable = self.admin.list_offsets("full")[p].durable_watermark
                if durable < self.acked[p]:
                    self.ack_beyond_durable.append((p, self.acked[p], durable))
                ok += 1
        self.codes["no reply"] = self.codes.get("no reply", 0) + len(rids)
        return ok

    def close(self) -> None:
        self.conn.close()
        self.admin.close()


def test_full_disk_fails_durable_acks_keeps_reads_and_recovers_without_losing_acked_data(make_broker):
    b = make_broker(workers=2, start=False, segment_bytes=SEGMENT_BYTES, max_batch_bytes=128 * 1024,
                    ring_bytes=2 << 20, disk_max_used_ratio=1.0)  # the guard off: a disk that fills (test below: on)
    journal = b.data_dir / "journal"
    _mount_tmpfs(journal, JOURNAL_TMPFS_BYTES)
    ballast = journal / "ballast"
    sender = None
    try:
        b.start()
        Admin(b.bootstrap).create_topic("full", 2)
        Admin(b.bootstrap).create_topic("full-client", 1)
        sender = DurableSender(b.bootstrap, 2)
        for _ in range(3):
            assert sender.round() == 2
        st = os.statvfs(journal)
        free = st.f_bavail * st.f_frsize
        with open(ballast, "wb") as f:
            f.write(b"\xba" * (free - SEGMENT_BYTES // 2))
        acked_at_full = dict(sender.acked)
        flusher_pid = b.pids()["flusher"]

        # Fill what is left of the pre-written segments until a segment cannot be pre-written.
        deadline = time.monotonic() + 60
        while not sender.codes.get("STORAGE_UNAVAILABLE") and time.monotonic() < deadline:
            sender.round()
        failed_after = {p: sender.acked[p] - acked_at_full[p] for p in sender.acked}
        assert sender.codes.get("STORAGE_UNAVAILABLE"), f"the disk never filled up: {sender.codes}"

        # The ordinary producer raises StorageUnavailableError for a durable batch. A flusher that
        # supervisord has just restarted may still find room (in the open segment, or a segment
        # it could pre-write) and make some batches durable: then each ack must be true (checked
        # against the durable watermark now and against the journal after the host crash below),
        # and the disk runs out before the producer has sent more than the tmpfs holds.
        client_acked, raised, client_batches = 0, None, 0
        most_batches = JOURNAL_TMPFS_BYTES // (CLIENT_BATCH_RECORDS * 100) + 1
        with Producer(b.bootstrap, acks="durable", request_timeout_ms=3000, delivery_timeout_ms=20_000) as prod:
            while client_batches < most_batches:
                prod.send_batch("full-client", [bytes(100)] * CLIENT_BATCH_RECORDS, partition=0)
                client_batches += 1
                try:
                    client_acked = prod.flush(30_000)
                except StorageUnavailableError as exc:
                    raised = exc
                    break
            prod.conn.close()
        assert raised is not None, (f"{client_batches} durable batches acked ({client_acked} records, "
                                    f"{client_acked * 100 >> 20} MiB of values) on a {JOURNAL_TMPFS_BYTES >> 20} MiB disk")
        client_durable = Admin(b.bootstrap).list_offsets("full-client")[0].durable_watermark
        assert client_durable >= client_acked, (client_durable, client_acked)

        # Reads are still served, from disk and from the rings, while writes fail.
        with Consumer(b.bootstrap, max_wait_ms=100) as cons:
            hw = {po.partition: po.high_watermark for po in cons.list_offsets("full")}
            cons.assign("full", start="earliest")
            read = dict.fromkeys(hw, 0)
            until = time.monotonic() + 20
            while any(read[p] < hw[p] for p in hw) and time.monotonic() < until:
                for _t, p, cols in cons.poll_columns(300):
                    read[p] += len(cols)
        assert all(read[p] >= sender.acked[p] for p in hw), (read, sender.acked)

        # Still full for a while: the flusher is restarted by supervisord and fails again.
        still_full_rounds = 0
        until = time.monotonic() + 3
        while time.monotonic() < until:
            sender.round(1000)
            still_full_rounds += 1
        failures_while_full = sender.codes.get("STORAGE_UNAVAILABLE", 0)

        ballast.unlink()
        freed_at = time.monotonic()
        while sender.round() < 2:
            assert time.monotonic() - freed_at < 30, f"no durable ack 30 s after freeing space: {sender.codes}"
        healed_s = time.monotonic() - freed_at
        assert b.pids()["flusher"] != flusher_pid, "the flusher should have exited after the latched error"
        log = (b.data_dir / "logs" / "supervisord.log").read_text()
        flusher_exits = log.count("exited: flusher (exit status 3")  # EXIT_STORAGE
        for _ in range(5):
            assert sender.round() == 2
        produced = Produced(acked=dict(sender.acked))
        live = audit(b.bootstrap, "full", produced, isolation="durable")
        assert live.ok and sum(live.lost.values()) == 0, live

        codes, beyond = dict(sender.codes), list(sender.ack_beyond_durable)
        assert not beyond, f"acked durable beyond the durable watermark: {beyond[:3]}"
        # Host crash: every process killed, shared memory gone; the journal alone must hold it all.
        sender.close()
        sender = None
        hard_kill_all(b)
        b.cleanup_shm()
        b.start()
        after_crash = audit(b.bootstrap, "full", produced, isolation="durable")
        client_after_crash = Admin(b.bootstrap).list_offsets("full-client")[0].durable_watermark
        assert client_after_crash >= client_acked, f"acked {client_acked} durable, the journal holds {client_after_crash}"
        print(f"\nfull disk: journal tmpfs {JOURNAL_TMPFS_BYTES >> 20} MiB, segments {SEGMENT_BYTES >> 20} MiB; "
              f"{sum(failed_after.values())} records acked after the ballast before the first STORAGE_UNAVAILABLE; "
              f"reply codes {codes}; the Producer got StorageUnavailableError after {client_acked} records acked ({client_batches} batches sent); STORAGE_UNAVAILABLE {failures_while_full}x over "
              f"{still_full_rounds} rounds while full, flusher exited with EXIT_STORAGE and was restarted {flusher_exits}x; reads while full {sum(read.values())} records; durable produce "
              f"healed {healed_s:.1f} s after the ballast went; acked {sum(produced.acked.values())}, found "
              f"{sum(live.found.values())} live / {sum(after_crash.found.values())} after a simulated host crash, "
              f"lost {sum(after_crash.lost.values())}, duplicated {sum(after_crash.duplicated.values())}")
        assert after_crash.ok and sum(after_crash.lost.values()) == 0, after_crash
        assert flusher_exits >= 1
    finally:
        if sender is not None:
            sender.close()
        if ballast.exists():
            ballast.unlink()
        b.stop()
        _umount(journal)


# --- a journal segment of the wrong size at boot -------------------------------------------------

SMALL_SEGMENT = 256 * 1024


def _boot_flusher(data_dir, segment_bytes: int) -> None:
    """Boot a real Flusher on ``data_dir`` (recovery, journal open) and close it again."""
    s = settings_mod.from_env(env={}, data_dir=str(data_dir), segment_bytes=segment_bytes,
                              max_batch_bytes=32 * 1024, write_buffer_bytes=128 * 1024)
    for name in region.list_instance_regions(s.instance):
        region.unlink(name)
    fl = Flusher(s)
    try:
        fl.boot()
    finally:
        fl.journal.close()
        if fl.table is not None:
            fl.table.close()
        for name in region.list_instance_regions(s.instance):
            region.unlink(name)


def _batches(data_dir) -> list[tuple[str, int]]:
    """(segment file name, byte in it) of every indexed batch, with the segment size it was written with."""
    ent = np.fromfile(index_path(data_dir, 0), dtype=ENTRY_DTYPE)
    pos = np.unique(ent["position"][ent["rel"] == 0]).tolist()
    return [(segment_name(p - p % SMALL_SEGMENT), p % SMALL_SEGMENT) for p in pos]


@pytest.mark.parametrize("case", ["segment cut short", "segment_bytes changed"])
def test_flusher_boot_never_destroys_journal_batches_that_recovery_indexed(tmp_path, case):
    st_ = make_storage(tmp_path / "data", partitions=1, ring_bytes=256 * 1024, segment_bytes=SMALL_SEGMENT,
                       write_buffer_bytes=128 * 1024, max_batch_bytes=32 * 1024)
    for i in range(60):
        assert st_.actors[0].append(encode_batch([bytes([i]) * 1000] * 10), 32 * 1024)[0] == 0
        st_.flusher.do_work()
    st_.flusher.sync()
    st_.flusher.checkpoint()
    data = Path(st_.s.data_dir)
    st_.close()
    batches = _batches(data)
    last_seg = data / JOURNAL_DIR / batches[-1][0]
    if case == "segment cut short":  # cut after the last batch: no data removed
        os.truncate(last_seg, batches[-1][1] + 16 * 1024)
        segment_bytes = SMALL_SEGMENT
    else:
        segment_bytes = 2 * SMALL_SEGMENT
    try:
        _boot_flusher(data, segment_bytes)
    except Exception as exc:  # refusing to boot, with a reason, keeps the data
        print(f"\n{case}: boot refused: {exc}")
    bad = []
    for name, at in batches:
        raw = (data / JOURNAL_DIR / name).read_bytes()
        try:
            validate_frame(raw, at, len(raw), 32 * 1024)
        except BatchError:
            bad.append((name, at))
    print(f"\n{case}: {len(bad)} of {len(batches)} indexed batches unreadable after the flusher booted")
    assert not bad, bad[:3]


def test_the_delete_oldest_disk_guard_deletes_the_oldest_segments_inside_retention_and_durable_produce_goes_on(make_broker):
    """--disk-full-policy delete_oldest (opt in), minimum age 0, --disk-max-used-ratio 0.6 on an
    8 MiB journal disk, 7-day retention: 24 MiB of durable produce is all acknowledged, the oldest
    segments go (log starts move, the flusher says so), and every record from the log starts on
    reads back byte-identical."""
    b = make_broker(workers=2, start=False, segment_bytes=SEGMENT_BYTES, max_batch_bytes=128 * 1024,
                    ring_bytes=2 << 20, disk_max_used_ratio=0.6, retention_check_ms=200,
                    disk_full_policy="delete_oldest", disk_force_delete_min_age_ms=0)
    journal = b.data_dir / "journal"
    _mount_tmpfs(journal, 8 << 20)
    try:
        b.start()
        with Admin(b.bootstrap) as a:
            a.create_topic("g", 2)  # the default retention: 7 days
        n, size = 24_000, 1000
        with Producer(b.bootstrap, acks="durable", linger_ms=1, batch_bytes=64 << 10) as p:
            for i in range(n):
                p.send("g", b"%d-%08d" % (i % 2, i // 2) + b"." * (size - 10), partition=i % 2)
            assert p.flush(120_000) == n and not p.errors
        st = os.statvfs(journal)
        assert 1 - st.f_bavail / st.f_blocks <= 0.6 + SEGMENT_BYTES / (8 << 20)
        with Admin(b.bootstrap) as a:  # the guard may still be deleting one segment: read once it has settled
            offs, deadline = a.list_offsets("g"), time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(1.0)  # ten of the guard's checks
                now = a.list_offsets("g")
                if [po.log_start_offset for po in now] == [po.log_start_offset for po in offs]:
                    break
                offs = now
        assert all(po.high_watermark == n // 2 and 0 < po.log_start_offset < n // 2 for po in offs), offs
        with Consumer(b.bootstrap, max_wait_ms=100) as c:
            c.assign("g", start="earliest")
            got, want = {}, sum(po.high_watermark - po.log_start_offset for po in offs)
            deadline = time.monotonic() + 30
            while len(got) < want and time.monotonic() < deadline:
                for r in c.poll(200):
                    got[(r.partition, r.offset)] = r.value
        assert len(got) == want
        assert all(v == b"%d-%08d" % k + b"." * (size - 10) for k, v in got.items())
        assert "disk guard" in (b.data_dir / "logs" / "flusher.log").read_text()
    finally:
        b.stop()
        _umount(journal)


def test_serve_refuses_to_start_on_a_disk_smaller_than_a_segment_in_one_line_leaving_nothing(make_broker):
    """Issue item 4: a journal disk that cannot hold one segment. ``serve`` used to print that it
    was serving while the flusher crash-looped on ENOSPC every few seconds, and a shared-memory
    region stayed after the stop. Now it refuses at once: one line naming what it needs and where,
    exit code 6, no shared memory made."""
    from tailrace.ops.serve import EXIT_NO_SPACE

    b = make_broker(workers=1, start=False, segment_bytes=SEGMENT_BYTES * 4)
    journal = b.data_dir / "journal"
    _mount_tmpfs(journal, SEGMENT_BYTES * 2)
    try:
        proc = b.spawn()
        assert proc.wait(30) == EXIT_NO_SPACE
        out = [line for line in (b.data_dir / "serve.out").read_text().splitlines() if line.strip()]
        assert len(out) == 1 and "refused: the journal needs" in out[0] and str(journal) in out[0], out
        assert "Traceback" not in out[0]
        assert not b.shm_regions()
        assert not (b.data_dir / "logs" / "flusher.log").exists()
    finally:
        _umount(journal)


# --- storage full: refuse (the default) or delete_oldest (opt in) ------------------------------

def _value(i: int, size: int = 1000) -> bytes:
    return b"%08d" % i + b"." * (size - 8)


def _fill_to(path, used: float, ballast) -> None:
    """Write ``ballast`` so the filesystem under ``path`` is ``used`` full."""
    st = os.statvfs(path)
    want = int(used * st.f_blocks) - (st.f_blocks - st.f_bavail)
    with open(ballast, "wb") as f:
        f.write(b"\xba" * (want * st.f_frsize))


def _produce_raw(bootstrap: str, topic: str, partition: int, value: bytes) -> int:
    """One durable batch of one record, sent once: the reply code (no client retry)."""
    conn = Connection(bootstrap)
    try:
        rid = conn.send(P.Op.PRODUCE, topic, partition, P.encode(P.ProduceRequest(acks=P.Acks.DURABLE)),
                        encode_batch([value]))
        return conn.wait_for(rid, 10_000).code
    finally:
        conn.close()


def _wait(what, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def _metric(b, name: str) -> float | None:
    import urllib.request
    text = urllib.request.urlopen(b.metrics_url, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _read_all(bootstrap: str, topic: str, want: int) -> dict[tuple[int, int], bytes]:
    with Consumer(bootstrap, max_wait_ms=100) as c:
        c.assign(topic, start="earliest")
        got = {}
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for r in c.poll(200):
                got[(r.partition, r.offset)] = r.value
    return got


def test_by_default_a_disk_past_the_ratio_refuses_produce_with_storage_full_deletes_nothing_and_resumes_when_freed(make_broker):
    """Issue item 2: on a filesystem already filled by another file, the disk guard deleted
    durably acknowledged records seconds after the ack. Now, with the default policy and ratio
    (refuse, 0.85): produce is answered STORAGE_FULL (retriable), every acknowledged record stays
    readable from offset 0 through several retention passes, status and the metrics say storage
    is full, and once the other file goes produce is taken again without a restart, a client
    batch sent while full included (it retried)."""
    b = make_broker(workers=2, start=False, segment_bytes=SEGMENT_BYTES, max_batch_bytes=128 * 1024,
                    ring_bytes=2 << 20, retention_check_ms=200, checkpoint_interval_ms=200)
    assert b.settings.disk_full_policy == "refuse" and b.settings.disk_max_used_ratio == 0.85
    journal = b.data_dir / "journal"
    _mount_tmpfs(journal, 16 << 20)
    ballast = journal / "ballast"
    try:
        b.start()
        with Admin(b.bootstrap) as a:
            a.create_topic("keep", 2)
        n = 3000  # 3 MB: three segments below the checkpoint, all deletable by the old guard
        with Producer(b.bootstrap, acks="durable", linger_ms=1, batch_bytes=64 << 10) as p:
            for i in range(n):
                p.send("keep", _value(i), partition=i % 2)
            assert p.flush(60_000) == n and not p.errors
        time.sleep(0.5)  # a checkpoint past the acked records: the old guard could delete them all
        _fill_to(journal, 0.95, ballast)
        assert _wait(lambda: Admin(b.bootstrap).status()["storage_full"]), Admin(b.bootstrap).status()
        code = _produce_raw(b.bootstrap, "keep", 0, b"refused")
        assert code == P.ErrorCode.STORAGE_FULL and P.ErrorCode.STORAGE_FULL in P.RETRIABLE, P.ErrorCode(code).name
        assert _wait(lambda: _metric(b, "tailrace_storage_full") == 1.0), _metric(b, "tailrace_storage_full")
        st = Admin(b.bootstrap).status()
        assert st["disk_used_ratio"] > 0.85 and st["records_force_deleted"] == 0, st
        out = subprocess.run([sys.executable, "-m", "tailrace.cli", "status", "--bootstrap", b.bootstrap],
                             capture_output=True, text=True, timeout=30).stdout
        assert "STORAGE FULL: produce refused" in out, out
        time.sleep(2)  # ten retention passes: the old guard deleted inside retention here
        with Admin(b.bootstrap) as a:
            offs = a.list_offsets("keep")
        assert all(po.log_start_offset == 0 and po.high_watermark == n // 2 for po in offs), offs
        got = _read_all(b.bootstrap, "keep", n)
        assert len(got) == n and all(v == _value(o * 2 + p) for (p, o), v in got.items())
        assert "storage full" in (b.data_dir / "logs" / "flusher.log").read_text()

        # a client batch sent while full is retried (STORAGE_FULL is retriable) and taken once there is room
        with Producer(b.bootstrap, acks="durable", delivery_timeout_ms=30_000) as p:
            p.send("keep", b"after", partition=0)
            time.sleep(1)
            assert not p.errors
            ballast.unlink()
            assert p.flush(30_000) == 1 and not p.errors, p.errors
        assert _produce_raw(b.bootstrap, "keep", 1, b"again") == P.ErrorCode.OK
        assert _wait(lambda: not Admin(b.bootstrap).status()["storage_full"])  # status: the flusher's figures of <= 1 s ago
        assert _wait(lambda: _metric(b, "tailrace_storage_full") == 0.0)
        with Admin(b.bootstrap) as a:
            assert [po.high_watermark for po in a.list_offsets("keep")] == [n // 2 + 1, n // 2 + 1]
    finally:
        if ballast.exists():
            ballast.unlink()
        b.stop()
        _umount(journal)


MIN_AGE_MS = 6000


def test_delete_oldest_never_deletes_records_younger_than_the_minimum_age_and_counts_what_it_deleted(make_broker):
    """Opt-in delete_oldest with a 6 s minimum age, ratio 0.6 on a 16 MiB journal disk: 3 MB of
    records, then (after the minimum age) 2 MB more, then another file fills the disk to 85%.
    The guard deletes old segments and counts their records in status and the metrics (the count
    is exactly how far the log starts moved); no record of the young 2 MB goes, although the
    disk stays over the ratio, so produce is refused with STORAGE_FULL instead."""
    b = make_broker(workers=2, start=False, segment_bytes=SEGMENT_BYTES, max_batch_bytes=128 * 1024,
                    ring_bytes=2 << 20, retention_check_ms=200, checkpoint_interval_ms=200, disk_max_used_ratio=0.6,
                    disk_full_policy="delete_oldest", disk_force_delete_min_age_ms=MIN_AGE_MS)
    journal = b.data_dir / "journal"
    _mount_tmpfs(journal, 16 << 20)
    ballast = journal / "ballast"
    try:
        b.start()
        with Admin(b.bootstrap) as a:
            a.create_topic("aged", 2)
        old, young = 3000, 2000
        with Producer(b.bootstrap, acks="durable", linger_ms=1, batch_bytes=64 << 10) as p:
            for i in range(old):
                p.send("aged", _value(i), partition=i % 2)
            assert p.flush(60_000) == old and not p.errors
            time.sleep(MIN_AGE_MS / 1000 + 0.5)
            young_from = time.monotonic()
            for i in range(old, old + young):
                p.send("aged", _value(i), partition=i % 2)
            assert p.flush(60_000) == old + young and not p.errors
        time.sleep(0.5)  # a checkpoint past them all: only the minimum age keeps the young ones
        _fill_to(journal, 0.85, ballast)
        st = _wait(lambda: (s := Admin(b.bootstrap).status())["storage_full"] and s["records_force_deleted"] and s)
        assert st, Admin(b.bootstrap).status()
        code = _produce_raw(b.bootstrap, "aged", 0, b"refused")
        with Admin(b.bootstrap) as a:
            offs = a.list_offsets("aged")
        checked_within_s = time.monotonic() - young_from
        assert checked_within_s < MIN_AGE_MS / 1000, f"too slow to tell: {checked_within_s:.1f} s"
        starts = {po.partition: po.log_start_offset for po in offs}
        print(f"\ndelete_oldest: log starts {starts}, status {st['records_force_deleted']} records force-deleted, "
              f"disk {st['disk_used_ratio']:.0%} used, produce answered {P.ErrorCode(code).name}")
        assert all(0 < s <= old // 2 for s in starts.values()), starts  # old ones went, no young one
        assert code == P.ErrorCode.STORAGE_FULL, P.ErrorCode(code).name
        assert st["records_force_deleted"] == sum(starts.values()), (st, starts)
        assert _wait(lambda: _metric(b, "tailrace_journal_records_forced_total") == sum(starts.values()))
        assert _metric(b, "tailrace_journal_segments_forced_total") >= 1
        got = _read_all(b.bootstrap, "aged", old + young - sum(starts.values()))
        assert all((p, o) in got for p in (0, 1) for o in range(old // 2, (old + young) // 2))
        assert all(v == _value(o * 2 + p) for (p, o), v in got.items())
        ballast.unlink()
        assert _wait(lambda: _produce_raw(b.bootstrap, "aged", 1, b"again") == P.ErrorCode.OK)
    finally:
        if ballast.exists():
            ballast.unlink()
        b.stop()
        _umount(journal)
