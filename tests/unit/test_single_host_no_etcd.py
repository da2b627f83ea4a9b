"""Single host unchanged: without ``--cluster`` nothing of etcd is imported (issue 33). Every
module a single-host broker, client, CLI or Spark bridge loads is imported in a fresh
interpreter, and neither etcd's client nor ``tailrace.cluster``'s etcd wrapper may be among them."""

from __future__ import annotations

import json
import subprocess
import sys

SINGLE_HOST = ["tailrace.cli", "tailrace.router.server", "tailrace.actors.worker", "tailrace.persistence.flusher",
               "tailrace.client.producer", "tailrace.client.consumer", "tailrace.client.aio", "tailrace.client.admin",
               "tailrace.admin_commands", "tailrace.console", "tailrace.cluster_commands", "tailrace.reassign_commands"]


def test_a_single_host_imports_nothing_of_etcd():
    code = ("import importlib, json, sys\n"
            f"for m in {SINGLE_HOST!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules\n"
            "                         if m.split('.')[0] == 'etcd3gw' or m.startswith(('tailrace.cluster.', 'cluster.'))\n"
            "                         or m == 'tailrace.cluster')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
