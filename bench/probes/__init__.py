"""One-off probes: single measurements behind a figure or a decision in docs/BENCHMARKS.md, kept
runnable (``python -m tailrace.bench.probes.<name>``) but not part of the suite ``tailrace bench``
runs."""
