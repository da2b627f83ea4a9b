"""The exceptions the client raises: one class per protocol error code (``tailrace.client.errors``)."""

from tailrace.client.errors import *  # noqa: F401,F403
from tailrace.client.errors import __all__  # noqa: F401
