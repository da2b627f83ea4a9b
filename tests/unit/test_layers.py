"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and a wrong import fails them.

import-linter (through grimp) finds a package's modules by walking its directory. In a checkout,
``tailrace/`` holds links to the card's top-level folders (``tailrace/shm -> ../shm``, ...), so
plain ``lint-imports`` at the repository root sees the whole package; a planted import is tested
on a copy in the shape a wheel has (pyproject's package-dir), never on the checkout.
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


def _ignore(folder, names):
    """Caches, and the links to the other folders (each is copied from its own folder)."""
    return [n for n in names if n == "__pycache__" or n.endswith(".pyc")
            or (os.path.islink(os.path.join(folder, n)) and os.path.isdir(os.path.join(folder, n)))]


def assemble(into: Path) -> Path:
    """The ``tailrace`` package as installed: package-dir's folders copied under one root."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(mapping.items()):
        shutil.copytree(ROOT / folder, into.joinpath(*name.split(".")), symlinks=True, ignore=_ignore,
                        dirs_exist_ok=True)
    return into


def test_the_links_in_the_root_package_are_the_package_dir_mapping():
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in mapping.items():
        if name != "tailrace":
            link = ROOT / "tailrace" / name.split(".", 1)[1]
            assert link.is_symlink() and os.readlink(link) == f"../{folder}", link


def lint(tree: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=str(tree),
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_import_follows_the_layers_in_the_checkout_and_in_the_wheels_shape(tmp_path):
    for tree in (ROOT, assemble(tmp_path)):
        r = lint(tree)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Contracts: 4 kept, 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("where, planted", [
    ("shm/ring.py", "from tailrace.client import records"),  # the ground knows no record field
    ("client/producer.py", "from tailrace.persistence import journal"),  # a client opens no journal
    ("persistence/flusher.py", "from tailrace.actors import worker"),  # the flusher is below the workers
    ("actors/worker.py", "from tailrace.router import server"),  # workers and router are independent
    ("router/server.py", "import tests.conftest"),  # shipped code never imports the tests
    ("client/consumer.py", "import pyspark"),  # only the Spark bridge and the benchmarks do
    ("router/server.py", "import etcd3gw"),  # only cluster/etcd.py imports the etcd client
    ("cluster/controller.py", "import etcd3gw"),  # not even the rest of the cluster package
    ("cluster/membership.py", "from tailrace.router import placement"),  # the control plane is below the router
])
def test_a_planted_wrong_import_breaks_a_contract(tmp_path, where, planted):
    tree = assemble(tmp_path)
    target = tree / "tailrace" / where
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = lint(tree)
    assert r.returncode != 0, r.stdout
    assert "BROKEN" in r.stdout and "0 broken" not in r.stdout, r.stdout
