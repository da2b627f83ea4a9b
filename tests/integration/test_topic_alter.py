"""Growing a topic (``tailrace topic alter NAME --partitions N``, ``Admin.create_partitions``)
with real processes, under produce load: old partitions keep their records and offsets, the new
ones are served at once, producers pick them up, a restart keeps them; shrinking is refused."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tailrace import Admin, Consumer, Producer
from tailrace.client import routes
from tailrace.client.errors import InvalidRequestError, UnknownTopicError


def _tailrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailrace", *args], capture_output=True, text=True, timeout=60)


def test_a_topic_grows_under_load_and_keeps_what_it_had(broker, monkeypatch):
    monkeypatch.setattr(routes, "METADATA_MAX_AGE_S", 0.5)  # producers look again soon (default 30 s)
    with Admin(broker.bootstrap) as a:
        a.create_topic("g", 2)
    sent = 0
    with Producer(broker.bootstrap, acks="memory", linger_ms=1) as p:
        for i in range(2000):
            p.send("g", b"before-%d" % i)
        sent += 2000
        assert p.flush() == sent
        with Admin(broker.bootstrap) as a:
            before = {po.partition: po.high_watermark for po in a.list_offsets("g")}
        out = _tailrace("topic", "alter", "g", "--partitions", "4", "--bootstrap", broker.bootstrap)
        assert out.returncode == 0 and "now has 4 partitions (had 2)" in out.stdout, out.stderr
        deadline = time.monotonic() + 10  # the same producer, round robin: within the metadata age it uses 4
        while time.monotonic() < deadline:
            for i in range(100):
                p.send("g", b"after-%d" % (sent + i))
            sent += 100
            p.flush()
            with Admin(broker.bootstrap) as a:
                if all(po.high_watermark > 0 for po in a.list_offsets("g")):
                    break
        assert p.flush() == sent and not p.errors
    with Admin(broker.bootstrap) as a:
        offs = a.list_offsets("g")
        assert [po.partition for po in offs] == [0, 1, 2, 3] and all(po.high_watermark > 0 for po in offs)
        assert sum(po.high_watermark for po in offs) == sent
        with pytest.raises(InvalidRequestError, match="only grows"):
            a.create_partitions("g", 4)
        with pytest.raises(UnknownTopicError):
            a.create_partitions("nope", 8)
        with pytest.raises(InvalidRequestError, match="a single host holds one copy"):  # replicas need a cluster
            a.create_topic("copied", 1, replication_factor=2)
        assert a.create_topic("copied", 1, replication_factor=1).replication_factor == 1
        assert a.create_partitions("g", 5).partitions == 5
    with Consumer(broker.bootstrap, max_wait_ms=100) as c:  # old partitions: their records, their offsets
        c.assign("g", start="earliest")
        got, deadline = [], time.monotonic() + 20
        while len(got) < sent and time.monotonic() < deadline:
            got += c.poll(200)
        assert len(got) == sent and {r.partition for r in got} == {0, 1, 2, 3}
        for part, hw in before.items():
            old = sorted(r.offset for r in got if r.partition == part and r.value.startswith(b"before-"))
            assert old == list(range(hw))
    refused = _tailrace("topic", "alter", "g", "--partitions", "3", "--bootstrap", broker.bootstrap)
    assert refused.returncode == 1 and "only grows" in refused.stderr
    broker.stop()  # the catalog was written before the reply: a restart has 5 partitions, records kept
    broker.start()
    with Admin(broker.bootstrap) as a, Producer(broker.bootstrap, acks="durable", linger_ms=0) as p:
        assert len(a.list_offsets("g")) == 5
        p.send("g", b"to the fifth", partition=4)
        assert p.flush() == 1
        assert sum(po.high_watermark for po in a.list_offsets("g")) == sent + 1
