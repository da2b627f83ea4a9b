"""One broker per data directory: no orphans, no second start, a private run directory, private
data, and bounded input on every socket (broker/datadir.py, ops/serve.py)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.broker import datadir
from tailrace.client import protocol as P
from tailrace.ops import serve
from tailrace.client.errors import InvalidRequestError
from tailrace.client.records import encode_batch
from tailrace.shm import region
from tailrace.bench.launcher import Broker

from tests.helpers import Raw, _alive, bounded_producer, reply_code, rss_kib, running_pids
from tailrace.bench.audit import Produced, audit, produce_until

NOBODY = 65534


def _gone_within(pids, timeout_s: float) -> float:
    """Seconds until every pid has exited; fails past ``timeout_s``."""
    t0 = time.monotonic()
    while any(_alive(p) for p in pids):
        assert time.monotonic() - t0 < timeout_s, {p: _alive(p) for p in pids}
        time.sleep(0.02)
    return time.monotonic() - t0


def _as_nobody(fn) -> int:
    """Run ``fn()`` in a forked child that dropped to uid/gid nobody; its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os._exit(fn())
        except BaseException:
            os._exit(99)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def open_tmp():
    """A temporary directory whose path every user can walk (pytest's tmp_path is 0700: a test
    of the broker's own modes must not be passed by its parent's)."""
    d = tempfile.mkdtemp(prefix="tailrace-test-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def broker(module_broker):
    """One broker for the module's tests that take ``broker`` (tests/conftest.py): they leave its
    programs as they found them and make topics of their own names. The tests that stop or kill
    it, or see everything it holds, take ``make_broker``."""
    return module_broker


# --- no orphans ----------------------------------------------------------------------------


def test_supervisord_killed_under_durable_load_takes_every_program_with_it_and_loses_no_durable_ack(make_broker):
    # Workers linger 2.5 s in their stop: orphans that still live when the second start comes.
    b = make_broker(workers=2, ring_bytes=1 << 20, max_batch_bytes=256 * 1024, debug_stop_delay_ms=2500)
    Admin(b.bootstrap).create_topic("owned", 4)
    stop = threading.Event()
    produced = Produced()
    producer = threading.Thread(target=produce_until, args=(b.bootstrap, "owned", 4, "durable", stop),
                                kwargs={"out": produced, "producer": bounded_producer(Producer)})
    producer.start()
    try:
        time.sleep(1.5)
        programs = running_pids(b)
        os.kill(b.supervisord_pid(), signal.SIGKILL)
        killed = time.monotonic()

        # A second start while the orphans live: refused at once, naming them, disturbing nothing.
        other = make_broker(start=False, data_dir=b.data_dir)
        proc = other.spawn(stdout=subprocess.PIPE)
        out = proc.communicate(timeout=30)[0].decode()
        other.proc = None
        assert proc.returncode == serve.EXIT_IN_USE, out
        assert "worker 0" in out and str(programs["worker-0"]) in out and "kill" in out, out

        took = _gone_within(programs.values(), 5.0 - (time.monotonic() - killed))
        print(f"\nevery program gone {time.monotonic() - killed:.2f} s after supervisord's SIGKILL")
        assert b.proc.wait(30) == serve.EXIT_SUPERVISOR_DIED
        assert not os.path.exists(b.run_dir), "a stopped broker left its run directory"
        b.proc = None
        b.start()  # the producer, retrying, goes on against the new broker
        time.sleep(1.5)
    finally:
        stop.set()
        producer.join(180)
    b.stop()
    b.start()  # a final start: recovery from what the stops left
    result = audit(b.bootstrap, "owned", produced)
    acked = sum(produced.acked.values())
    print(f"durable acks {acked}, found {sum(result.found.values())}")
    assert not produced.errors, produced.errors
    assert result.ok, result
    assert sum(result.found.values()) >= acked > 0


def test_two_serves_on_one_data_directory_started_at_the_same_moment_exactly_one_serves(make_broker, tmp_path):
    a = make_broker(start=False, data_dir=tmp_path / "shared")
    b = make_broker(start=False, data_dir=tmp_path / "shared")
    pa, pb = a.spawn(stdout=subprocess.PIPE), b.spawn(stdout=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while pa.poll() is None and pb.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    loser, winner = (a, b) if pa.poll() is not None else (b, a)
    assert loser.proc.poll() == serve.EXIT_IN_USE, loser.proc.communicate()[0]
    out = loser.proc.communicate()[0].decode()
    assert "in use" in out and str(winner.proc.pid) in out, out
    loser.proc = None
    winner.wait_ready()
    threading.Thread(target=winner.proc.stdout.read, daemon=True).start()  # keep its output flowing
    with Admin(winner.bootstrap) as admin:
        admin.create_topic("one", 1)
    with Producer(winner.bootstrap, acks="durable") as p:
        p.send("one", b"x")
        assert p.flush() == 1
    assert winner.stop() == 0  # before the fixture's teardown, which would clean up after both


@pytest.mark.parametrize("role", ["flusher", "router", "worker"])
def test_a_second_program_started_by_hand_refuses_and_the_broker_keeps_serving(broker, role):
    before = broker.pids()
    module = {"flusher": "tailrace.persistence.flusher", "router": "tailrace.router.server", "worker": "tailrace.actors.worker"}[role]
    argv = [sys.executable, "-m", module] + (["--id", "0"] if role == "worker" else [])
    t0 = time.monotonic()
    r = subprocess.run(argv, env=broker.env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == datadir.EXIT_REFUSED, r.stderr
    assert time.monotonic() - t0 < 2.0 + 2.0  # within 2 s of the lock wait, plus interpreter start
    holder = before["worker-0" if role == "worker" else role]
    assert "in use" in r.stderr and str(holder) in r.stderr, r.stderr
    assert broker.pids() == before
    topic = f"still-{role}"
    Admin(broker.bootstrap).create_topic(topic, 2)
    with Producer(broker.bootstrap, acks="durable") as p:
        p.send_batch(topic, [b"a", b"b", b"c"])
        assert p.flush() == 3
    with Consumer(broker.bootstrap) as c:
        c.assign(topic, start="earliest")
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += c.poll(500)
    assert sorted(r.value for r in got) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGINT with a broken stdout"])
def test_serve_stops_cleanly_on_term_hup_and_ctrl_c_and_leaves_no_run_directory(make_broker, how):
    b = make_broker(start=False)
    proc = b.spawn(stdout=subprocess.PIPE)
    reader = threading.Thread(target=proc.stdout.read, daemon=True)
    if how.startswith("SIGINT"):
        b.wait_ready()
        proc.stdout.close()  # `tailrace serve | tee`: tee died of the same Ctrl-C
    else:
        reader.start()
        b.wait_ready()
    Admin(b.bootstrap).create_topic("t", 1)
    with Producer(b.bootstrap, acks="memory") as p:
        p.send("t", b"kept")
        p.flush()
    programs = b.pids()
    proc.send_signal(getattr(signal, how.split()[0]))
    assert proc.wait(60) == 0
    _gone_within(programs.values(), 1.0)
    assert not os.path.exists(b.run_dir), sorted(os.listdir(b.run_dir))
    assert not b.shm_regions()  # the flusher drained every ring and unlinked them
    b.proc = None
    b.start()
    with Consumer(b.bootstrap) as c:
        c.assign("t", start="earliest")
        assert [r.value for r in c.poll(5000)] == [b"kept"]


# --- the run directory ------------------------------------------------------------------


def test_the_default_run_directory_is_private_under_a_base_only_its_user_can_create_in(broker):
    run_dir = broker.run_dir
    for d in (run_dir, os.path.dirname(run_dir)):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700, d
    assert len(os.path.join(run_dir, "worker-9999.sock")) <= datadir.UNIX_PATH_MAX
    names = set(os.listdir(run_dir))
    assert {"supervisor.sock", "supervisord.pid", "flusher.bell"} <= names, names


@pytest.mark.parametrize("planted", ["by another user", "with mode 0777", "as a symlink"])
def test_a_run_directory_someone_else_could_use_is_refused_and_nothing_starts(make_broker, open_tmp, planted):
    base = open_tmp / "base"
    base.mkdir(mode=0o777)
    os.chmod(base, 0o777)
    run_dir = base / "run"
    if planted == "by another user":
        assert _as_nobody(lambda: (os.mkdir(run_dir, 0o777), os.chmod(run_dir, 0o777), 0)[-1]) == 0
        assert os.stat(run_dir).st_uid == NOBODY
    elif planted == "with mode 0777":
        run_dir.mkdir()
        os.chmod(run_dir, 0o777)
    else:
        (open_tmp / "elsewhere").mkdir(mode=0o700)
        run_dir.symlink_to(open_tmp / "elsewhere")
    b = make_broker(start=False, ipc_dir=str(run_dir))
    proc = b.spawn(stdout=subprocess.PIPE)
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == serve.EXIT_UNSAFE, out
    assert "refused" in out and str(run_dir) in out, out
    b.proc = None
    assert not (run_dir / "supervisord.pid").exists() and not (run_dir / "workers.d").exists()
    assert not os.listdir(open_tmp / "elsewhere") if planted == "as a symlink" else True
    assert not region.list_instance_regions(b.settings.instance)
    assert not datadir.holders(datadir.lock_path(b.data_dir, datadir.BROKER_LOCK))


# --- private data ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["0700", "0750"])
def test_data_files_are_private_and_an_unprivileged_user_cannot_read_them(make_broker, open_tmp, mode):
    b = make_broker(data_dir=open_tmp / "data", data_mode=mode)
    Admin(b.bootstrap).create_topic("secret", 2)
    with Producer(b.bootstrap, acks="durable") as p:
        p.send_batch("secret", [b"credit card %d" % i for i in range(100)])
        p.flush()
    b.stop()  # a clean stop: every file written, logs included
    dir_mode, file_mode = int(mode, 8), int(mode, 8) & 0o666
    files = []
    for root, dirs, names in os.walk(b.data_dir):
        assert stat.S_IMODE(os.stat(root).st_mode) == dir_mode, root
        for n in names:
            path = os.path.join(root, n)
            if n == "serve.out":  # the test's own capture of serve's output
                continue
            files.append(path)
            assert stat.S_IMODE(os.stat(path).st_mode) == file_mode, path
    kinds = {Path(f).parent.name if Path(f).parent != b.data_dir else Path(f).name for f in files}
    assert {"journal", "index", "topics.json", "logs"} <= kinds, kinds
    targets = [f for f in files if "journal" in f or "index" in f or f.endswith("topics.json") or "logs" in f]

    def try_read() -> int:
        readable = 0
        for f in targets:
            try:
                with open(f, "rb") as fh:
                    fh.read(1)
                readable += 1
            except PermissionError:
                pass
        return min(readable, 100)

    assert _as_nobody(try_read) == 0


# --- bounded input ----------------------------------------------------------------------------


def _router_rss(b) -> int:
    return rss_kib(b.pids()["router"])


def test_huge_frames_are_dropped_before_python_sees_them_and_deep_nesting_is_malformed(make_broker):
    b = make_broker()  # of its own: it checks the broker holds its one topic
    Admin(b.bootstrap).create_topic("big", 1)
    huge = bytes(64 << 20)
    ok_head = P.pack_routing(P.Op.CREATE_TOPIC, 0, 1, b"x")
    for target, endpoint in (("router", b.bootstrap), ("worker-0", b.settings.worker_endpoint(0))):
        pid = b.pids()[target]
        before = rss_kib(pid)
        raw = Raw(endpoint)
        for i in range(8):  # sent without reading any reply
            raw.send([P.pack_routing(P.Op.PRODUCE, 0, 100 + i, b"big"), huge])
            raw.send([ok_head + huge[: 1]])
        time.sleep(1.5)
        grew = rss_kib(pid) - before
        raw.close()
        print(f"\n{target}: RSS grew {grew} KiB after 8 frames of 64 MiB")
        assert grew < 8 * 1024, f"{target} grew {grew} KiB"
    with Admin(b.bootstrap) as a:  # still serving
        assert [t.name for t in a.list_topics()] == ["big"]

    raw = Raw(b.bootstrap)
    try:
        deep = b"\x91" * 1000 + b"\x90"  # an array in an array ... 1,000 deep
        for rid, (op, topic) in enumerate([(P.Op.CREATE_TOPIC, b"deep"), (P.Op.SET_WORKERS, b""),
                                           (P.Op.PRODUCE, b"big"), (P.Op.FETCH, b"big")], start=1):
            body = [encode_batch([b"x"])] if op == P.Op.PRODUCE else []  # the right frame count: the header is what fails
            raw.send([P.pack_routing(op, 0, rid, topic), deep, *body])
            frames = raw.recv(5000)
            if frames is not None and op == P.Op.PRODUCE:
                assert b"undecodable header" in frames[-1], frames[-1][:200]
            assert frames is not None, op
            assert reply_code(frames, False) == (op, P.ErrorCode.MALFORMED, rid), (op, frames[:2])
        # The largest topic name a frame can carry: a short reply, no echo.
        name = b"n" * (b.settings.max_frame_bytes - 1000)
        raw.send([P.pack_routing(P.Op.CREATE_TOPIC, 0, 9, name), P.encode(P.CreateTopicRequest(partitions=1))])
        frames = raw.recv(5000)
        assert frames is not None
        assert reply_code(frames, False) == (P.Op.CREATE_TOPIC, P.ErrorCode.INVALID_REQUEST, 9)
        assert sum(len(f) for f in frames) < 4096, [len(f) for f in frames]
    finally:
        raw.close()
    t0 = time.monotonic()
    with pytest.raises(InvalidRequestError):  # 64 MiB: refused by the client, at once, never sent
        Admin(b.bootstrap).create_topic("n" * (64 << 20), 1)
    assert time.monotonic() - t0 < 2.0
