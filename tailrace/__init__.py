"""tailrace: a multi-process, actor-based message broker on shared memory.

The client library::

    from tailrace import Admin, Producer, Consumer
    from tailrace.errors import TailraceError, UnknownTopicError

The packages below ``tailrace`` are the broker's layers, ground first: ``shm`` (shared memory),
``client`` (the formats and the client), ``broker`` (settings, catalog, data directory),
``persistence`` (journal, indexes, the flusher), ``actors`` and ``router`` (the worker and router
processes), then ``ops`` (serve, scaling, the command line), ``spark_bridge`` and ``bench``.
"""

from tailrace.client.admin import Admin
from tailrace.client.consumer import Consumer, Record
from tailrace.client.producer import Producer

__version__ = "0.1.0"
__all__ = ["Admin", "Consumer", "Producer", "Record", "__version__"]
