"""The executor's range fetcher against a real broker, no JVM: exact ranges, direct fetch, data loss."""

from __future__ import annotations

import numpy as np
import pytest

from tailrace import Admin, Producer
from tailrace.spark_bridge.errors import DataLossError
from tailrace.spark_bridge.fetch import RangeFetcher, reachable
from tailrace.spark_bridge.offsets import OffsetRange


@pytest.fixture(scope="module")
def filled(spark_broker):
    """A 2-partition topic with 5000 records of 100 bytes per partition; returns its name and
    the worker endpoint owning each partition."""
    topic = "fetch-ranges"
    admin = Admin(spark_broker.bootstrap)
    admin.create_topic(topic, 2)
    with Producer(spark_broker.bootstrap, acks="durable") as prod:
        for p in range(2):
            for first in range(0, 5000, 1000):
                values = np.full((1000, 100), p, dtype=np.uint8)
                values[:, 1:9] = np.arange(first, first + 1000, dtype=np.int64)[:, None].view(np.uint8)
                prod.send_buffers(topic, values.reshape(-1), np.arange(1001, dtype=np.int32) * 100, partition=p)
        prod.flush()
    endpoints = {pi.partition: pi.endpoint for pi in admin.describe_topic(topic).partitions}
    admin.close()
    return topic, endpoints


def read(fetcher: RangeFetcher) -> tuple[np.ndarray, np.ndarray]:
    got = list(fetcher)
    return np.concatenate([c.offsets for c in got]), np.concatenate([c.values for c in got])


def test_a_range_is_read_exactly_through_the_router_and_direct_from_the_worker(spark_broker, filled):
    topic, endpoints = filled
    r = OffsetRange(topic, 1, 1234, 4321)
    via_router = RangeFetcher(spark_broker.bootstrap, r, max_bytes=64 * 1024)
    direct = RangeFetcher(spark_broker.bootstrap, r, endpoint=endpoints[1], max_bytes=64 * 1024)
    assert reachable(endpoints[1], spark_broker.bootstrap) and direct.endpoint == endpoints[1]
    offsets, values = read(via_router)
    assert np.array_equal(offsets, np.arange(1234, 4321))
    assert np.array_equal(values.reshape(-1, 100)[:, 1:9].copy().view(np.int64).ravel(), np.arange(1234, 4321))
    d_offsets, d_values = read(direct)
    assert np.array_equal(offsets, d_offsets) and np.array_equal(values, d_values)


def test_a_worker_that_does_not_own_the_partition_sends_the_fetch_back_through_the_router(spark_broker, filled):
    topic, endpoints = filled
    other = endpoints[0] if endpoints[0] != endpoints[1] else None
    if other is None:
        pytest.skip("both partitions landed on one worker")
    fetcher = RangeFetcher(spark_broker.bootstrap, OffsetRange(topic, 1, 0, 5000), endpoint=other)
    offsets, _ = read(fetcher)
    assert np.array_equal(offsets, np.arange(5000))
    assert fetcher.endpoint == spark_broker.bootstrap


def test_worker_endpoints_are_used_only_where_they_surely_are_this_brokers(spark_broker, filled):
    _topic, endpoints = filled
    assert reachable(endpoints[0], spark_broker.bootstrap)
    # the same ipc path under a bootstrap on another host may be another broker's: never use it
    assert not reachable(endpoints[0], "tcp://192.0.2.1:7420")
    assert not reachable("ipc:///nonexistent/worker-0.ipc", spark_broker.bootstrap)
    assert not reachable("tcp://127.0.0.1:9000", "tcp://192.0.2.5:7420")
    assert reachable("tcp://192.0.2.5:9000", "tcp://192.0.2.5:7420")


def test_a_range_past_the_watermark_is_data_loss_unless_told_to_read_what_is_left(spark_broker, filled):
    topic, _ = filled
    beyond = OffsetRange(topic, 0, 4990, 5100)
    with pytest.raises(DataLossError, match=r"offset 5000 of the planned range \[4990, 5100\)"):
        read(RangeFetcher(spark_broker.bootstrap, beyond))
    offsets, _ = read(RangeFetcher(spark_broker.bootstrap, beyond, fail_on_data_loss=False))
    assert np.array_equal(offsets, np.arange(4990, 5000))
