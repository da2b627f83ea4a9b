"""CurveZMQ authentication with real processes: keys, the allow-list, the router's proven
identity towards the workers, safe-by-default binding and the same-host uid check."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailrace import Admin, Consumer, Producer
from tailrace.client import ShareConsumer
from tailrace.aio import AsyncProducer
from tailrace.broker import quota as quota_mod
from tailrace.broker.auth import AllowList, ZapHandler, auth_dir, default_allow_dir, generate_keys
from tailrace.client import protocol as P
from tailrace.client import unixwire
from tailrace.client.connection import Connection
from tailrace.client.errors import AuthenticationFailedError, BrokerUnavailableError, NotAuthorizedError
from tailrace.client.security import curve_keys


def _tailrace(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailrace", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_keys_generate_writes_a_pair_and_never_overwrites_it(tmp_path):
    out = _tailrace("keys", "generate", "alice", "--dir", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr
    public, secret = tmp_path / "k" / "alice.key", tmp_path / "k" / "alice.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    keys = curve_keys(secret, public)  # a pair the client takes as it is
    assert len(keys.public) == len(keys.secret) == 40
    before = secret.read_bytes()
    again = _tailrace("keys", "generate", "alice", "--dir", str(tmp_path / "k"))
    assert again.returncode == 1 and "never overwritten" in again.stderr
    assert secret.read_bytes() == before
    assert _tailrace("keys", "generate", "../up", "--dir", str(tmp_path / "k")).returncode == 2


def test_keys_allow_list_and_revoke_on_a_data_dir_and_the_router_name_is_reserved(tmp_path):
    """``tailrace keys allow|list|revoke`` edit the data dir's allow-list one file at a time; a
    client may never be allowed as ``router`` (the principal the workers obey as the router), and
    a ``router.key`` planted in the directory is skipped."""
    assert _tailrace("keys", "generate", "bob", "--dir", str(tmp_path / "k")).returncode == 0
    data = str(tmp_path / "data")
    planted = tmp_path / "k" / "bob.key"
    assert _tailrace("keys", "allow", "bob", str(planted), "--data-dir", data).returncode == 0
    listed = _tailrace("keys", "list", "--json", "--data-dir", data)
    assert listed.returncode == 0 and set(json.loads(listed.stdout)) == {"bob"}
    refused = _tailrace("keys", "allow", "router", str(planted), "--data-dir", data)
    assert refused.returncode == 2 and "reserved" in refused.stderr
    assert _tailrace("keys", "allow", "x/y", str(planted), "--data-dir", data).returncode == 2
    assert _tailrace("keys", "allow", "z", "~" * 40, "--data-dir", data).returncode == 2  # not Z85
    shutil.copy(planted, os.path.join(default_allow_dir(data), "router.key"))
    assert set(AllowList(default_allow_dir(data)).keys.values()) == {"bob"}
    assert "revoked: bob" in _tailrace("keys", "revoke", "bob", "--data-dir", data).stderr
    assert set(AllowList(default_allow_dir(data)).keys.values()) == set()


def test_a_non_loopback_bind_without_auth_is_refused_unless_insecure(tmp_path):
    """Checked before anything starts (no port is opened here: --print-env stops before serving)."""
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--bind", "tcp://0.0.0.0:17420", "--print-env"]
    refused = _tailrace(*base)
    assert refused.returncode == 2 and "--auth curve" in refused.stderr and "--insecure" in refused.stderr
    assert _tailrace(*base, "--insecure").returncode == 0
    assert _tailrace(*base, "--auth", "curve").returncode == 0
    assert _tailrace("serve", "--data-dir", str(tmp_path / "d"), "--print-env").returncode == 0  # loopback default


@pytest.fixture
def secured(make_broker, tmp_path):
    """A broker with --auth curve; alice is allowed, mallory has a key the broker does not know."""
    b = make_broker(workers=2, start=False, auth="curve")
    allow = default_allow_dir(str(b.data_dir))
    generate_keys(str(tmp_path / "alice"), "alice")
    os.makedirs(allow, exist_ok=True)
    shutil.copy(tmp_path / "alice" / "alice.key", allow)
    generate_keys(str(tmp_path / "mallory"), "mallory")
    b.alice = {"key_file": str(tmp_path / "alice" / "alice.key_secret"),
               "server_key": os.path.join(auth_dir(str(b.data_dir)), "server.key")}
    b.mallory = {**b.alice, "key_file": str(tmp_path / "mallory" / "mallory.key_secret")}
    b.client = b.alice
    b.start()
    return b


def test_only_allowed_keys_get_in_and_a_removed_key_is_refused_at_once(secured):
    b = secured
    pids = b.pids()
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("locked", 2)
    with Producer(b.bootstrap, acks="durable", linger_ms=0, **b.alice) as p:  # direct: the workers are CURVE servers too
        for i in range(100):
            p.send("locked", b"v%d" % i)
        assert p.flush() == 100

    async def produce_async():
        async with AsyncProducer(b.bootstrap, acks="memory", **b.alice) as ap:
            return await ap.send("locked", b"async")
    assert asyncio.run(produce_async()).offset >= 0
    with Consumer(b.bootstrap, max_wait_ms=100, **b.alice) as c:
        c.assign("locked", start="earliest")
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 101 and time.monotonic() < deadline:
            got += c.poll(200)
    assert len(got) == 101

    # no key, an unknown key, a wrong server key: refused at the handshake, nothing done
    wrong_server = {**b.alice, "server_key": b.mallory["key_file"].replace(".key_secret", ".key")}
    for who, refused in (({}, (AuthenticationFailedError, BrokerUnavailableError)), (b.mallory, AuthenticationFailedError),
                         (wrong_server, (AuthenticationFailedError, BrokerUnavailableError))):
        with Admin(b.bootstrap, **who) as a, pytest.raises(refused):
            a.create_topic("intruder", 1)
    worker = Connection(b.settings.worker_endpoint(0), keys=curve_keys(**b.mallory))
    try:
        with pytest.raises(AuthenticationFailedError):  # straight at a worker: the same wall
            worker.request(P.Op.LIST_OFFSETS, "locked")
    finally:
        worker.close()
    with Admin(b.bootstrap, **b.alice) as a:
        assert [t.name for t in a.list_topics()] == ["locked"]

    # a key taken out of the allow-list: its open connections are refused from the next request
    with Admin(b.bootstrap, **b.alice) as a, Producer(b.bootstrap, acks="memory", linger_ms=0, **b.alice) as p:
        p.send("locked", b"still-in", partition=0)
        p.flush()
        a.list_topics()  # both connections open and allowed
        os.remove(os.path.join(default_allow_dir(str(b.data_dir)), "alice.key"))
        time.sleep(1.5)  # the router and the workers re-read the list every heartbeat (0.5 s)
        with pytest.raises(NotAuthorizedError):
            a.list_topics()
        p.send("locked", b"after-removal", partition=0)
        with pytest.raises(NotAuthorizedError):
            p.flush(5000)
    with Admin(b.bootstrap, **b.alice) as a, pytest.raises(AuthenticationFailedError):  # and no new connection
        a.list_topics()
    assert b.pids() == pids, "a refused client cost a process"
    shutil.copy(b.alice["key_file"].replace(".key_secret", ".key"), default_allow_dir(str(b.data_dir)))
    time.sleep(1.0)
    with Admin(b.bootstrap, **b.alice) as a:  # allowed again, without a restart
        assert [t.name for t in a.list_topics()] == ["locked"]
        assert sum(o.high_watermark for o in a.list_offsets("locked")) == 102


def _forge_adopt(endpoint: str, keys, slot: int) -> tuple[bool, list | None]:
    """Connect to a worker as "router" with ``keys`` and send what a forged router would: take
    the partition over (ADOPT, a huge epoch). (handshake completed, the reply or None)."""
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.IDENTITY, P.ROUTER_IDENTITY)
        d.setsockopt(zmq.LINGER, 0)
        keys.apply(d)
        mon = d.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        d.connect(endpoint)
        assert mon.poll(5000)
        shook = recv_monitor_message(mon)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
        try:
            d.send_multipart([b"client", P.ASSIGN.pack(slot, 1 << 62), P.pack_routing(P.Op.ADOPT, 0, 1, b"guarded"),
                              P.EMPTY_MAP], zmq.NOBLOCK)
        except zmq.Again:  # the refused handshake left no connection to send on
            return shook, None
        return shook, (d.recv_multipart() if d.poll(3000) else None)
    finally:
        ctx.destroy(linger=0)


def test_a_process_posing_as_the_router_on_a_worker_socket_is_refused(secured):
    """The worker socket obeys assignments and ADOPT from the router's proven key only: an
    unknown key never completes the handshake; an allowed key declaring the router's identity
    (the real router stopped, so the identity is free) gets NOT_AUTHORIZED; nothing of the
    partition changes."""
    b = secured
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("guarded", 1)
        before = a.describe_topic("guarded").partitions[0]
    endpoint = b.settings.worker_endpoint(before.worker)
    pids = b.pids()
    shook, reply = _forge_adopt(endpoint, curve_keys(**b.mallory), before.slot)
    assert not shook and reply is None
    b.supervisorctl("stop", "router")
    try:
        time.sleep(0.5)
        shook, reply = _forge_adopt(endpoint, curve_keys(**b.alice), before.slot)
        assert shook
        assert reply is not None and reply[0] == b"client", reply
        _v, op, code, _p, rid, topic = P.unpack_routing(reply[1])
        assert (op, code, rid, topic) == (P.Op.ADOPT, P.ErrorCode.NOT_AUTHORIZED, 1, b"guarded")
    finally:
        b.supervisorctl("start", "router")
    b.wait_ready()
    with Producer(b.bootstrap, acks="durable", linger_ms=0, **b.alice) as p:  # the real owner still serves
        p.send("guarded", b"after", partition=0)
        assert p.flush() == 1
    with Admin(b.bootstrap, **b.alice) as a:
        after = a.describe_topic("guarded").partitions[0]
    assert after.worker == before.worker and after.high_watermark == before.high_watermark + 1
    assert {k: v for k, v in b.pids().items() if k != "router"} == {k: v for k, v in pids.items() if k != "router"}


def test_same_host_sockets_serve_only_the_allowed_user_ids(make_broker):
    """SO_PEERCRED: the broker's own user by default; here only a uid that is not ours, so this
    process (the broker's user) is turned away, and ZeroMQ clients are unaffected."""
    b = make_broker(workers=1, local_uids="65534")
    Admin(b.bootstrap).create_topic("local", 1)
    path = unixwire.path_of(b.settings.worker_unix_endpoint(0))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        try:
            s.sendall(b"".join(unixwire.encode([P.pack_routing(P.Op.LIST_OFFSETS, -1, 1, b"local"), P.EMPTY_MAP])))
            answer = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):  # closed before or with the request unread
            answer = b""
        assert answer == b"", "a Unix-socket client of another uid was served"
    with Producer(b.bootstrap, acks="memory", same_host=True, linger_ms=0) as p:  # falls back to ZeroMQ
        p.send("local", b"x")
        assert p.flush() == 1
    with open(os.path.join(b.data_dir, "logs", "worker-0.log")) as f:
        assert f"refused a Unix-socket client of uid {os.geteuid()}" in f.read()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(max_size=80), max_size=9))
def test_the_zap_handler_answers_any_request_and_never_raises(tmp_path_factory, frames):
    """Hostile ZAP traffic (what libzmq would never send, too): every request gets an answer or is
    dropped, the handler keeps serving, and only a listed key is ever allowed."""
    d = tmp_path_factory.mktemp("allow")
    ctx = zmq.Context()
    zap = ZapHandler(ctx, AllowList(str(d)))
    zap.start()
    req = ctx.socket(zmq.DEALER)
    req.connect("inproc://zeromq.zap.01")
    try:
        if frames:  # (an envelope with no request in it never reaches the handler)
            req.send_multipart([b"", *frames])
            zap.service()
            assert req.poll(1000), "a ZAP request left unanswered (the REP socket would take no other)"
            reply = req.recv_multipart()
            assert reply[3] != b"200"  # nothing is allowed by an empty list
        # still serving: a well-formed CURVE request for an unknown key is refused
        req.send_multipart([b"", b"1.0", b"7", b"", b"127.0.0.1", b"", b"CURVE", os.urandom(32)])
        zap.service()
        assert req.poll(1000)
        assert req.recv_multipart()[3] == b"400"
    finally:
        req.close(0)
        zap.stop()
        ctx.term()


def test_hostile_handshakes_on_the_router_port_cost_nothing(secured):
    b = secured
    pids = b.pids()
    port = int(b.bootstrap.rsplit(":", 1)[1])
    junk = [b"\xff" + b"\x00" * 8 + b"\x7f\x03", os.urandom(64), b"\xff" * 1024,
            b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03\x00CURVE" + b"\x00" * 100]
    for j in junk * 5:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            try:
                s.sendall(j)
                s.recv(64)
            except OSError:
                pass
    with Admin(b.bootstrap, **b.alice) as a:
        assert a.status()["workers"]
    assert b.pids() == pids


def _acl(b, *args: str) -> None:
    out = _tailrace("acl", *args, "--data-dir", str(b.data_dir))
    assert out.returncode == 0, out.stderr


def test_acl_matrix_every_operation_allowed_and_denied_changes_nothing_when_denied(secured, tmp_path):
    """Every operation, allowed and denied, through the router and straight to a worker: a denied
    request gets NOT_AUTHORIZED and leaves no topic, record or worker change behind."""
    from tailrace.broker.catalog import Catalog

    b = secured
    generate_keys(str(tmp_path / "bob"), "bob")
    shutil.copy(tmp_path / "bob" / "bob.key", default_allow_dir(str(b.data_dir)))
    bob = {**b.alice, "key_file": str(tmp_path / "bob" / "bob.key_secret")}
    alice = b.alice
    with Admin(b.bootstrap, **bob) as a:  # no rule yet: authorization is off, an allowed key does anything
        a.create_topic("b-free", 1)
    _acl(b, "add", "alice", "--prefix", "a-", "--ops", "create,produce,consume,describe")
    _acl(b, "add", "alice", "--topic", "*", "--ops", "admin")
    _acl(b, "add", "bob", "--topic", "a-shared", "--ops", "consume,describe")
    time.sleep(1.5)  # the router and the workers re-read acls.json every heartbeat

    def denied(fn):
        with pytest.raises(NotAuthorizedError):
            fn()

    with Admin(b.bootstrap, **alice) as a, Admin(b.bootstrap, **bob) as bb:
        a.create_topic("a-shared", 2)                                   # create: allowed
        denied(lambda: bb.create_topic("a-bob", 1))                     # create: denied
        denied(lambda: a.create_topic("b-alice", 1))                    # outside alice's prefix
        assert [t.name for t in bb.list_topics()] == ["a-shared"]       # describe filters the listing
        assert bb.describe_topic("a-shared").topic.name == "a-shared"   # describe: allowed
        denied(lambda: bb.describe_topic("b-free"))                     # describe: denied
        denied(lambda: bb.list_offsets("b-free"))
        assert a.status()["workers"]                                    # admin: allowed
        denied(bb.status)                                               # admin: denied
        denied(lambda: bb.set_workers(1))
    for direct in (True, False):                                        # produce: worker and router paths
        with Producer(b.bootstrap, acks="durable", linger_ms=0, direct=direct, **alice) as p:
            for i in range(10):
                p.send("a-shared", b"ok-%d" % i)
            assert p.flush() == 10
        with Producer(b.bootstrap, acks="durable", linger_ms=0, direct=direct, **bob) as p:
            p.send("a-shared", b"forbidden")
            denied(lambda: p.flush(10_000))
        with Producer(b.bootstrap, acks="durable", linger_ms=0, direct=direct, **alice) as p:
            p.send("b-free", b"forbidden", partition=0)
            denied(lambda: p.flush(10_000))
    for who in (bob, alice):                                            # consume: allowed for both on a-shared
        with Consumer(b.bootstrap, max_wait_ms=100, **who) as c:
            c.assign("a-shared", start="earliest")
            got, deadline = [], time.monotonic() + 15
            while len(got) < 20 and time.monotonic() < deadline:
                got += c.poll(200)
            assert sorted(r.value for r in got) == sorted([b"ok-%d" % i for i in range(10)] * 2)
    with Consumer(b.bootstrap, max_wait_ms=100, **alice) as c:          # consume: denied (b-free is not alice's)
        denied(lambda: c.assign("b-free", start="earliest"))
    pids = b.pids()
    with Admin(b.bootstrap, **alice) as a:
        assert sum(o.high_watermark for o in a.list_offsets("a-shared")) == 20  # nothing of bob's got in
    assert sorted(Catalog(str(b.data_dir)).data.topics) == ["a-shared", "b-free"]
    assert b.pids() == pids
    with Admin(b.bootstrap, **alice) as a:                              # alter, delete: denied, then allowed
        denied(lambda: a.create_partitions("a-shared", 3))
        denied(lambda: a.delete_topic("a-shared"))
    assert sorted(Catalog(str(b.data_dir)).data.topics) == ["a-shared", "b-free"]
    _acl(b, "add", "alice", "--topic", "a-shared", "--ops", "alter,delete")
    _acl(b, "remove", "bob", "--topic", "a-shared", "--ops", "consume,describe")
    time.sleep(1.5)
    with Admin(b.bootstrap, **alice) as a:
        assert a.create_partitions("a-shared", 3).partitions == 3
    with Admin(b.bootstrap, **bob) as bb:
        denied(lambda: bb.describe_topic("a-shared"))
        denied(lambda: bb.delete_topic("a-shared"))
    with Admin(b.bootstrap, **alice) as a:
        assert a.delete_topic("a-shared").name == "a-shared"
    assert sorted(Catalog(str(b.data_dir)).data.topics) == ["b-free"]
    with Admin(b.bootstrap, **alice) as a, Admin(b.bootstrap, **bob) as bb:  # group: on the group's name
        denied(lambda: a.reset_offsets("a-group", {("b-free", 0): 1}))
        denied(lambda: bb.committed("a-group"))
        denied(bb.list_groups)                                          # listing groups is admin
        assert a.list_groups() == []
    _acl(b, "add", "alice", "--prefix", "a-", "--ops", "group")
    time.sleep(1.5)
    with Admin(b.bootstrap, **alice) as a, Admin(b.bootstrap, **bob) as bb:
        assert a.reset_offsets("a-group", {("b-free", 0): 1}) == {("b-free", 0): 1}
        assert a.committed("a-group") == {("b-free", 0): 1}
        denied(lambda: bb.committed("a-group"))


def _principal(b, tmp_path, name: str) -> dict:
    """Another allowed principal of ``secured``: its client options."""
    generate_keys(str(tmp_path / name), name)
    shutil.copy(tmp_path / name / f"{name}.key", default_allow_dir(str(b.data_dir)))
    return {**b.alice, "key_file": str(tmp_path / name / f"{name}.key_secret")}


QUOTA_BPS = 1_000_000


@pytest.mark.parametrize("direct", [False, True], ids=["through-router", "straight-to-workers"])
def test_a_producer_over_its_quota_is_slowed_to_it_and_others_are_not(secured, tmp_path, direct):
    """slow's quota is 1 MB/s; it offers as much as it can (2 MB unacked at any time, far over
    10x its quota) to 4 partitions on 2 workers, beside alice (no quota) producing too. slow's acked bytes over the run stay within
    1.1x of its quota, its acks say they were held (throttle_ms), nothing is refused or lost,
    and alice is never held. (The throughput comparison is bench/probes/quota.py's.)"""
    b = secured
    slow = _principal(b, tmp_path, "slow")
    _tailrace("quota", "set", "slow", "--producer-byte-rate", str(QUOTA_BPS), "--data-dir", str(b.data_dir))
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("q", 4)
    time.sleep(1.5)  # the workers re-read quotas.json every half second
    value = b"v" * 1000
    run_s = 4.0
    with Producer(b.bootstrap, acks="memory", linger_ms=1, batch_records=32, direct=direct, **slow) as ps, \
            Producer(b.bootstrap, acks="memory", linger_ms=1, batch_records=32, direct=direct, **b.alice) as pa:
        start = time.monotonic()
        sent = {id(ps): 0, id(pa): 0}
        while time.monotonic() - start < run_s:
            for p in (ps, pa):  # each keeps up to 2 MB unacked, as a producer's buffer would
                if sent[id(p)] - p.acked_records < 2000:
                    for _ in range(64):
                        p.send("q", value)
                    sent[id(p)] += 64
                p.poll(1)
        slow_acked_in_run = ps.acked_records
        assert ps.flush(30_000) == sent[id(ps)] and pa.flush(30_000) == sent[id(pa)]
        assert not ps.errors and not pa.errors
        ratio = slow_acked_in_run * len(value) / (QUOTA_BPS * run_s)
        print(f"slow: {ratio:.3f}x its quota, held {ps.throttle_ms} ms; alice {pa.acked_records} records")
        assert 0.5 < ratio <= 1.1, f"slow got {ratio:.2f}x its quota"
        assert ps.throttle_ms > 0 and pa.throttle_ms == 0
        assert pa.acked_records > 2 * slow_acked_in_run  # alice was not held to slow's rate
    with Admin(b.bootstrap, **b.alice) as a:  # everything sent was stored
        assert sum(o.high_watermark for o in a.list_offsets("q")) == sum(sent.values())


def test_a_consumer_over_its_fetch_quota_is_slowed_to_it(secured, tmp_path):
    """A fetch quota holds replies back, and caps what a fetch reads so a hold stays short: a
    consumer with default fetch sizes reads a full topic at its quota, and then everything."""
    b = secured
    reader = _principal(b, tmp_path, "reader")
    _tailrace("quota", "set", "reader", "--consumer-byte-rate", str(QUOTA_BPS), "--data-dir", str(b.data_dir))
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("qf", 2)
    value = b"f" * 1000
    with Producer(b.bootstrap, acks="durable", linger_ms=5, **b.alice) as p:
        for _ in range(8000):
            p.send("qf", value)
        assert p.flush(30_000) == 8000
    time.sleep(1.0)
    with Consumer(b.bootstrap, max_wait_ms=100, **reader) as c:
        c.assign("qf", start="earliest")
        got, start = 0, time.monotonic()
        while time.monotonic() - start < 3.0:
            got += len(c.poll(100))
        window = time.monotonic() - start
        ratio = got * len(value) / (QUOTA_BPS * window)
        # At most the quota plus the credit a new principal may spend at once (BURST_S of its
        # rate), over the window: (window + BURST_S) / window, 1.33x for 3 s; a reply held past
        # the window's end moves a little more in or out of it (5 %). Unthrottled would be ~10x.
        limit = (window + quota_mod.BURST_S) / window * 1.05
        print(f"reader: {ratio:.3f}x its quota (limit {limit:.2f}x), held {c.throttle_ms} ms")
        assert 0.5 < ratio <= limit, f"reader got {ratio:.2f}x its quota"
        assert c.throttle_ms > 0
        deadline = time.monotonic() + 30
        while got < 8000 and time.monotonic() < deadline:
            got += len(c.poll(200))
        assert got == 8000
    with Consumer(b.bootstrap, max_wait_ms=100, **b.alice) as c:  # alice has no quota
        c.assign("qf", start="earliest")
        n, start = 0, time.monotonic()
        while n < 8000 and time.monotonic() - start < 10:
            n += len(c.poll(100))
        assert n == 8000 and c.throttle_ms == 0


def test_same_host_clients_are_under_the_acls_and_quotas_as_unix_user(secured):
    """On the same-host Unix socket a client's principal is its user's (``unix:NAME``, from
    SO_PEERCRED), whatever key it holds for ZeroMQ: ACL rules and quotas apply to that name."""
    import pwd

    b = secured
    me = f"unix:{pwd.getpwuid(os.geteuid()).pw_name}"
    with Admin(b.bootstrap, **b.alice) as a, Producer(b.bootstrap, linger_ms=0, **b.alice) as p:
        a.create_topic("local", 1)
        p.send("local", b"first")  # through the router: the owner adopts the partition (same-host
        assert p.flush() == 1      # clients go to an owner's Unix socket from then on)
    _acl(b, "add", "alice", "--topic", "*", "--ops", "describe,admin")  # alice: metadata only
    time.sleep(1.5)
    with Producer(b.bootstrap, acks="durable", linger_ms=0, same_host=True, **b.alice) as p:
        p.routes.describe("local")
        assert p.routes.endpoint("local", 0).startswith("unix")  # the Unix socket, not ZeroMQ
        p.send("local", b"no rule for the local user")
        with pytest.raises(NotAuthorizedError, match=me):
            p.flush(10_000)
    with Admin(b.bootstrap, **b.alice) as a:
        assert a.list_offsets("local")[0].high_watermark == 1
    _acl(b, "add", me, "--topic", "local", "--ops", "produce")
    _tailrace("quota", "set", me, "--producer-byte-rate", "100000", "--data-dir", str(b.data_dir))
    time.sleep(1.5)
    with Producer(b.bootstrap, acks="durable", linger_ms=0, batch_records=10, same_host=True, **b.alice) as p:
        for _ in range(100):
            p.send("local", b"x" * 1000)
        assert p.flush(30_000) == 100
        assert p.throttle_ms > 0  # 100 kB at 100 kB/s: held, over the Unix socket
    with Admin(b.bootstrap, **b.alice) as a:
        assert a.list_offsets("local")[0].high_watermark == 101


def test_a_refusal_names_the_operation_the_request_was_for_and_produce_or_consume_implies_describe(secured, tmp_path):
    """A denied produce says ``may not produce to topic``, a denied group ``may not use group``,
    a denied fetch ``may not consume from topic``; a principal with produce (or consume) on a
    topic may describe it, as in Kafka, so its producer is refused at the produce, not before."""
    b = secured
    carol = _principal(b, tmp_path, "carol")
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("events", 1)
    _acl(b, "add", "alice", "--topic", "*", "--ops", "create,describe,admin")  # alice: no produce, no group
    _acl(b, "add", "carol", "--topic", "events", "--ops", "produce")            # carol: produce only
    time.sleep(1.5)
    for direct in (False, True):
        with Producer(b.bootstrap, acks="durable", linger_ms=0, direct=direct, **b.alice) as p:
            p.send("events", b"refused")
            with pytest.raises(NotAuthorizedError, match="principal 'alice' may not produce to topic 'events'"):
                p.flush(10_000)
        with Producer(b.bootstrap, acks="durable", linger_ms=0, direct=direct, **carol) as p:
            p.send("events", b"carol's")  # describes the topic first: implied by produce
            assert p.flush(10_000) == 1
    with Consumer(b.bootstrap, max_wait_ms=100, **carol) as c:
        with pytest.raises(NotAuthorizedError, match="principal 'carol' may not consume from topic 'events'"):
            c.assign("events", start="earliest")
            c.poll(1000)
    with Admin(b.bootstrap, **b.alice) as a:
        with pytest.raises(NotAuthorizedError, match="principal 'alice' may not use group 'gg'"):
            a.committed("gg")
        assert a.list_offsets("events")[0].high_watermark == 2
    with Admin(b.bootstrap, **carol) as c:
        assert [t.name for t in c.list_topics()] == ["events"]  # listed: carol may describe it
        with pytest.raises(NotAuthorizedError, match="principal 'carol' may not create topic 'other'"):
            c.create_topic("other", 1)
        with pytest.raises(NotAuthorizedError, match="principal 'carol' may not administer the broker"):
            c.status()
    with ShareConsumer(b.bootstrap, group="sg", topics=["events"], **carol) as sc:  # share groups: share on the group...
        with pytest.raises(NotAuthorizedError, match="principal 'carol' may not use share group 'sg'"):
            sc.poll(100)
        _acl(b, "add", "carol", "--topic", "sg", "--ops", "share")
        time.sleep(1.5)
        with pytest.raises(NotAuthorizedError, match="principal 'carol' may not consume from topic 'events'"):
            sc.poll(100)  # ... and consume on each topic read (the share coordinator's check)


def test_acl_and_quota_files_are_private_whatever_the_operator_s_umask(make_broker):
    """``tailrace acl add`` and ``tailrace quota set`` run under the operator's umask (022 here),
    not the broker's: acls.json and quotas.json are still 0600, as every data file is (README)."""
    b = make_broker(workers=1)
    old = os.umask(0o022)
    try:
        for args in (("acl", "add", "alice", "--topic", "t", "--ops", "produce"),
                     ("quota", "set", "alice", "--producer-byte-rate", "1000")):
            out = _tailrace(*args, "--data-dir", str(b.data_dir))
            assert out.returncode == 0, out.stderr
    finally:
        os.umask(old)
    for name in ("acls.json", "quotas.json"):
        mode = stat.S_IMODE(os.stat(os.path.join(auth_dir(str(b.data_dir)), name)).st_mode)
        assert mode == 0o600, f"{name} is {mode:04o}"


def test_the_readme_acl_example_followed_lets_alice_produce_and_consume_in_a_group(secured):
    """The README's ``tailrace acl add`` lines, run as they are: alice then creates an
    ``orders.`` topic, produces to it and reads it back in group ``orders.billing``, committing."""
    b = secured
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    lines = [ln for ln in readme.splitlines() if ln.startswith("tailrace acl add ") and "--cluster" not in ln]  # one host's
    assert lines and 'group="orders.billing"' in readme
    for ln in lines:
        _acl(b, *shlex.split(ln)[2:])
    time.sleep(1.5)
    with Admin(b.bootstrap, **b.alice) as a:
        a.create_topic("orders.eu", 2)
    with Producer(b.bootstrap, acks="durable", linger_ms=0, **b.alice) as p:
        for i in range(20):
            p.send("orders.eu", b"o%d" % i)
        assert p.flush(10_000) == 20
    with Consumer(b.bootstrap, group="orders.billing", auto_offset_reset="earliest", auto_commit=False,
                  max_wait_ms=50, **b.alice) as c:
        c.subscribe("orders.eu")
        got, deadline = [], time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got += c.poll(100)
        assert sorted(r.value for r in got) == sorted(b"o%d" % i for i in range(20))
        assert sum(c.commit().values()) == 20


def _every_op(topic: bytes, group: bytes) -> list[tuple[P.Op, list[bytes]]]:
    """One well-formed request of every op of the spec (client/ops.py), as a client would send it."""
    from tailrace.client import ops
    from tailrace.client.records import encode_batch

    out = []
    for rid, row in enumerate(ops.SPEC, start=1):
        names = {ops.TOPIC: topic, ops.GROUP: group, ops.NOTHING: b""}[row.names]
        frames = [P.pack_routing(row.op, 0 if row.served == ops.OWNER else -1, rid, names), P.EMPTY_MAP]
        if row.frames == 3:
            frames.append(encode_batch([b"never"]))
        out.append((row.op, frames))
    return out


def test_a_principal_with_no_rights_is_refused_every_op_on_the_router_and_on_a_worker(secured, tmp_path):
    """Access control fails closed: with rules in place, an allowed key with no rule of its own
    gets NOT_AUTHORIZED for every op of the spec, PING and ADOPT included, through the router,
    on a worker's ZeroMQ endpoint and on its Unix socket; nothing changes."""
    b = secured
    zed = _principal(b, tmp_path, "zed")
    with Admin(b.bootstrap, **b.alice) as a, Producer(b.bootstrap, linger_ms=0, acks="durable", **b.alice) as p:
        a.create_topic("held", 1)
        p.send("held", b"first", partition=0)  # through the router: the owner adopts the partition
        assert p.flush() == 1
        where = a.describe_topic("held").partitions[0]
    _acl(b, "add", "alice", "--topic", "*", "--ops", ",".join(("produce", "consume", "create", "delete", "alter",
                                                               "describe", "group", "admin")))
    time.sleep(1.5)
    pids = b.pids()
    for endpoint in (b.bootstrap, where.endpoint, where.local_endpoint):
        if endpoint.startswith(unixwire.SCHEME):
            sock = unixwire.UnixSocket(endpoint)
            send, recv = sock.send_frames, lambda: sock.recv_frames() if sock.poll(5000) else None
        else:
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            curve_keys(**zed).apply(sock)
            sock.connect(endpoint)
            send, recv = sock.send_multipart, lambda: sock.recv_multipart() if sock.poll(5000) else None
        try:
            for op, frames in _every_op(b"held", b"g"):
                send(frames)
                reply = recv()
                assert reply is not None, f"{op.name} at {endpoint}: no answer"
                _v, rop, code, _p, _rid, _t = P.unpack_routing(reply[0])
                message = P.decoder(P.ErrorReply).decode(reply[1]).message if code else "(answered OK)"
                assert (rop, code) == (op, P.ErrorCode.NOT_AUTHORIZED), f"{op.name} at {endpoint}: {P.ErrorCode(code).name} {message}"
        finally:
            sock.close() if endpoint.startswith(unixwire.SCHEME) else (sock.close(0), ctx.term())
    with Admin(b.bootstrap, **b.alice) as a:
        assert [t.name for t in a.list_topics()] == ["held"] and a.list_offsets("held")[0].high_watermark == 1
        assert a.describe_topic("held").partitions[0].worker == where.worker
    assert b.pids() == pids
