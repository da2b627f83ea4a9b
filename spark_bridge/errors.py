"""The Spark bridge's exceptions: a shallow hierarchy, each class "Raised when...".

Broker replies keep their own classes (client/errors.py); these cover what only the bridge can
get wrong: options, offsets that fell out of the log, DataFrames the sink cannot write.
"""

from __future__ import annotations


class SparkBridgeError(Exception):
    """Raised when the Spark bridge cannot plan, read or write (base class, never raised itself)."""


class OptionError(SparkBridgeError, ValueError):
    """Raised when a data source option is missing, malformed, or contradicts another option."""


class DataLossError(SparkBridgeError):
    """Raised when offsets a query must read are no longer (or no longer yet) in a partition's
    log, typically after retention deleted them, and ``failOnDataLoss`` is true (the default)."""


class SchemaError(SparkBridgeError, ValueError):
    """Raised when a DataFrame cannot be written to a topic: no ``value`` column, a column of an
    unsupported type, a null value, a missing topic or an out-of-range partition."""
