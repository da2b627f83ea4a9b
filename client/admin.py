"""Admin: create, list and describe topics; list offsets; broker status."""

from __future__ import annotations

import msgspec

from . import protocol as P
from .connection import CONNECT_TIMEOUT_MS, DEFAULT_BOOTSTRAP, Connection


class Admin:
    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, timeout_ms: int = 10_000,
                 connect_timeout_ms: int = CONNECT_TIMEOUT_MS):
        self.conn = Connection(bootstrap, connect_timeout_ms)
        self.timeout_ms = timeout_ms

    def create_topic(self, name: str, partitions: int, ring_bytes: int = 0) -> P.TopicInfo:
        r = self.conn.request(P.Op.CREATE_TOPIC, name, -1, P.encode(P.CreateTopicRequest(partitions, ring_bytes)),
                              timeout_ms=self.timeout_ms)
        return P.decoder(P.TopicInfo).decode(r.header)

    def list_topics(self) -> list[P.TopicInfo]:
        r = self.conn.request(P.Op.LIST_TOPICS, timeout_ms=self.timeout_ms)
        return P.decoder(P.ListTopicsReply).decode(r.header).topics

    def describe_topic(self, name: str) -> P.DescribeReply:
        r = self.conn.request(P.Op.DESCRIBE_TOPIC, name, timeout_ms=self.timeout_ms)
        return P.decoder(P.DescribeReply).decode(r.header)

    def list_offsets(self, name: str) -> list[P.PartitionOffsets]:
        """Log start, high watermark and durable watermark of every partition, one round trip."""
        r = self.conn.request(P.Op.LIST_OFFSETS, name, timeout_ms=self.timeout_ms)
        return P.decoder(P.ListOffsetsReply).decode(r.header).partitions

    def status(self) -> dict:
        r = self.conn.request(P.Op.STATUS, timeout_ms=self.timeout_ms)
        return msgspec.msgpack.decode(r.header)

    def set_workers(self, workers: int) -> dict:
        """Tell the router to place partitions on workers 0..workers-1 (it does not start or stop
        processes: ``tailrace workers set`` does both). Returns the router's status."""
        r = self.conn.request(P.Op.SET_WORKERS, "", -1, P.encode(P.SetWorkersRequest(workers)), timeout_ms=self.timeout_ms)
        return msgspec.msgpack.decode(r.header)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
