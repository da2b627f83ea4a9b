"""tailrace benchmark suite."""
