"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and a wrong import fails them.

import-linter (through grimp) finds a package's modules by walking its directory, and the
``tailrace`` package is assembled from several top-level folders (pyproject's package-dir): the
test copies them into the shape a wheel has, then runs ``lint-imports`` on that copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def assemble(into: Path) -> Path:
    """The ``tailrace`` package as installed: package-dir's folders copied under one root."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(mapping.items()):
        shutil.copytree(ROOT / folder, into.joinpath(*name.split(".")), symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    return into


def lint(tree: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=str(tree),
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_import_follows_the_layers(tmp_path):
    r = lint(assemble(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 3 kept, 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("where, planted", [
    ("shm/ring.py", "from tailrace.client import records"),  # the ground knows no record field
    ("client/producer.py", "from tailrace.persistence import journal"),  # a client opens no journal
    ("persistence/flusher.py", "from tailrace.actors import worker"),  # the flusher is below the workers
    ("actors/worker.py", "from tailrace.router import server"),  # workers and router are independent
    ("router/server.py", "import tests.conftest"),  # shipped code never imports the tests
    ("client/consumer.py", "import pyspark"),  # only the Spark bridge and the benchmarks do
])
def test_a_planted_wrong_import_breaks_a_contract(tmp_path, where, planted):
    tree = assemble(tmp_path)
    target = tree / "tailrace" / where
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = lint(tree)
    assert r.returncode != 0, r.stdout
    assert "BROKEN" in r.stdout and "0 broken" not in r.stdout, r.stdout
