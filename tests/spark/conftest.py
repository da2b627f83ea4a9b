"""Fixtures for the Spark bridge: one broker and one local Spark session for the whole run.

Both are expensive (a supervisord-run broker, a JVM), so they are session-scoped and tests keep
apart by topic name. Spark runs ``local[2]`` on loopback with the UI off; its Python workers use
this interpreter and import the project from this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tailrace.bench.launcher import Broker


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory) -> Broker:
    b = Broker(tmp_path_factory.mktemp("spark-broker"), workers=2, segment_bytes=16 << 20, shm_budget_bytes=512 << 20)
    b.start()
    yield b
    b.stop()
    b.cleanup_shm()


def ensure_java() -> None:
    """PySpark 4 needs Java 17+. Install Debian's headless JRE when none is there and we may
    (root, apt-get): the project installs what it needs, nothing by hand. Otherwise fail: a
    skipped Spark suite would hide a broken bridge."""
    if shutil.which("java") is not None or os.environ.get("JAVA_HOME"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "openjdk-17-jre-headless"], check=False, env=env,
                       capture_output=True, timeout=900)
    if shutil.which("java") is None:
        pytest.fail("Spark needs Java 17+: install openjdk-17-jre-headless (or set JAVA_HOME)")


@pytest.fixture(scope="session")
def spark():
    ensure_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, from the JVM's first lookup on
    from pyspark.sql import SparkSession

    from tailrace.spark_bridge import TailraceDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tailrace-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(TailraceDataSource)
    yield session
    session.stop()


@pytest.fixture
def topic_name(request) -> str:
    """A topic name unique to the test (tests share one broker)."""
    return request.node.name.replace("[", "-").replace("]", "")[:100]
