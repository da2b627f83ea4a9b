"""tailrace spark_bridge package."""
