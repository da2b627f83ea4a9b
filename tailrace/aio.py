"""The asyncio client: ``AsyncAdmin``, ``AsyncProducer``, ``AsyncConsumer``, ``AsyncShareConsumer``
(tailrace.client.aio).

    from tailrace.aio import AsyncProducer, AsyncConsumer, AsyncAdmin, AsyncShareConsumer
"""

from tailrace.client.aio import Ack, AsyncAdmin, AsyncConsumer, AsyncProducer, AsyncShareConsumer, Record, ShareRecord

__all__ = ["Ack", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "AsyncShareConsumer", "Record", "ShareRecord"]
