"""The asyncio client: ``AsyncAdmin``, ``AsyncProducer``, ``AsyncConsumer`` (tailrace.client.aio).

    from tailrace.aio import AsyncProducer, AsyncConsumer, AsyncAdmin
"""

from tailrace.client.aio import Ack, AsyncAdmin, AsyncConsumer, AsyncProducer, Record

__all__ = ["Ack", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "Record"]
