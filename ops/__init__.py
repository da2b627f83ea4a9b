"""Operator tooling: ``tailrace serve`` (runs supervisord over the broker's programs), worker
scaling through supervisord, and the ``tailrace`` command line."""
