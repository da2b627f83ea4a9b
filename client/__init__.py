"""tailrace client: the formats (records, protocol) and the Python client."""

from .admin import Admin
from .alloc import keep_large_blocks
from .consumer import Consumer, Record
from .producer import Producer
from .share import ShareConsumer, ShareRecord

__all__ = ["Admin", "Consumer", "Producer", "Record", "ShareConsumer", "ShareRecord", "keep_large_blocks"]
