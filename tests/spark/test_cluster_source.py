"""The Spark bridge on a cluster: a topic whose partitions live on two brokers (real etcd, real
``tailrace serve`` brokers on loopback) is written through one broker and read back through the
other, each partition fetched from its leader (a broker that does not lead it says which does)."""

from __future__ import annotations

import pytest

from tailrace.client.admin import Admin
from tailrace.cluster.etcd_server import EtcdServer

from ..cluster.harness import cluster_fixture, wait_until


@pytest.fixture
def make_cluster(tmp_path, request):
    yield from cluster_fixture(tmp_path, request)


@pytest.fixture
def etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd", fsync=False).start()
    yield server
    server.stop()


def test_spark_writes_and_reads_a_topic_spread_over_two_brokers(spark, make_cluster, etcd):
    from pyspark.sql import functions as F

    c = make_cluster(etcd.endpoint, 2)
    with Admin(c.bootstrap(1)) as a:
        a.create_topic("spread", 4)
    assert sorted(set(c.leaders("spread").values())) == [0, 1]
    wait_until(lambda: _described(c.bootstrap(0), "spread"), 10)
    df = spark.range(400).select(F.format_string("v%d", "id").cast("binary").alias("value"),
                                 (F.col("id") % 4).cast("int").alias("partition"))
    df.write.format("tailrace").option("bootstrap", c.bootstrap(0)).option("topic", "spread").mode("append").save()
    got = spark.read.format("tailrace").option("bootstrap", c.bootstrap(1)).option("topic", "spread").load()
    rows = got.select("partition", "value").collect()
    assert len(rows) == 400
    assert sorted(bytes(r.value) for r in rows) == sorted(b"v%d" % i for i in range(400))
    assert {r.partition for r in rows} == {0, 1, 2, 3}


def _described(bootstrap: str, topic: str) -> bool:
    try:
        with Admin(bootstrap) as a:
            return len(a.describe_topic(topic).partitions) > 0
    except Exception:  # noqa: BLE001 - not there yet
        return False
