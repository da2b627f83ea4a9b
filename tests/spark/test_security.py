"""The Spark source and sink against a broker with ``--auth curve``: keyFile and serverKey."""

from __future__ import annotations

import os
import shutil

import pytest

from tailrace.bench.launcher import Broker
from tailrace.broker.auth import auth_dir, default_allow_dir, generate_keys


@pytest.fixture(scope="module")
def curve_broker(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark-curve")
    b = Broker(root / "broker", workers=2, auth="curve", segment_bytes=16 << 20, shm_budget_bytes=256 << 20)
    generate_keys(str(root / "keys"), "spark")
    os.makedirs(default_allow_dir(str(b.data_dir)), exist_ok=True)
    shutil.copy(root / "keys" / "spark.key", default_allow_dir(str(b.data_dir)))
    b.client = {"key_file": str(root / "keys" / "spark.key_secret"),
                "server_key": os.path.join(auth_dir(str(b.data_dir)), "server.key")}
    b.start()
    yield b
    b.stop()
    b.cleanup_shm()


def test_the_sink_and_the_source_speak_curve_with_key_options_and_fail_without(spark, curve_broker):
    b = curve_broker
    keys = {"keyFile": b.client["key_file"], "serverKey": b.client["server_key"]}
    from tailrace import Admin

    with Admin(b.bootstrap, **b.client) as a:
        a.create_topic("secret-rows", 2)
    rows = [(b"k%d" % i, b"v%d" % i) for i in range(500)]
    df = spark.createDataFrame(rows, "key binary, value binary")
    df.write.format("tailrace").option("bootstrap", b.bootstrap).option("topic", "secret-rows").options(**keys) \
        .mode("append").save()
    back = spark.read.format("tailrace").option("bootstrap", b.bootstrap).option("topic", "secret-rows") \
        .options(**keys).load().select("key", "value").collect()
    assert sorted((bytes(r.key), bytes(r.value)) for r in back) == sorted(rows)
    with pytest.raises(Exception, match="AuthenticationFailed|requires CURVE|no broker answered"):
        spark.read.format("tailrace").option("bootstrap", b.bootstrap).option("topic", "secret-rows").load().collect()
    with pytest.raises(Exception, match="keyFile/serverKey"):
        spark.read.format("tailrace").option("bootstrap", b.bootstrap).option("topic", "secret-rows") \
            .option("keyFile", b.client["key_file"]).load().collect()
