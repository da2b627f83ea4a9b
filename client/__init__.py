"""tailrace client: the formats (records, protocol) and the Python client."""

from .admin import Admin
from .consumer import Consumer, Record
from .producer import Producer
from .share import ShareConsumer, ShareRecord

__all__ = ["Admin", "Consumer", "Producer", "Record", "ShareConsumer", "ShareRecord"]
