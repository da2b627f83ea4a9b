"""tailrace for Spark: the ``tailrace`` PySpark data source (batch and streaming reads, writes).

    from tailrace.spark_bridge import TailraceDataSource
    spark.dataSource.register(TailraceDataSource)
    df = spark.read.format("tailrace").option("topic", "events").load()

Options, schema and delivery guarantees: docs/SPARK.md. Uses the client package only.
"""

from .arrow import ARROW_SCHEMA, SCHEMA
from .errors import DataLossError, OptionError, SchemaError, SparkBridgeError
from .source import NAME, TailraceDataSource

__all__ = [
    "ARROW_SCHEMA", "NAME", "SCHEMA", "DataLossError", "OptionError", "SchemaError", "SparkBridgeError",
    "TailraceDataSource",
]
