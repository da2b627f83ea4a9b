"""The built wheel is the product: one top-level package, and it serves without the source tree.

The wheel is built from the tracked files alone (copied out of the checkout), installed into a
fresh venv, and run from a directory that holds no source. The venv sees the machine's
site-packages for the dependencies (pyzmq, numpy, supervisor...), so that listing its own
site-packages before and after shows exactly what the wheel adds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tailrace.bench.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(argv, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)
    assert r.returncode == 0, f"{argv}: {r.stdout}\n{r.stderr}"
    return r


def _site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def _listing(venv: Path) -> set[str]:
    return set(os.listdir(_site_packages(venv))) | {f"bin/{n}" for n in os.listdir(venv / "bin")}


def test_the_wheel_installs_one_package_serves_without_the_source_tree_and_uninstalls_clean(tmp_path):
    src = tmp_path / "src"
    files = _run(["git", "ls-files"], cwd=ROOT).stdout.split()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(ROOT / f):
            os.symlink(os.readlink(ROOT / f), src / f)
        else:
            shutil.copy2(ROOT / f, src / f)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)])
    wheel = next(dist.glob("tailrace-*.whl"))

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    py, tailrace = venv / "bin" / "python", venv / "bin" / "tailrace"
    before = _listing(venv)
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)])
    added = _listing(venv) - before
    assert {a for a in added if not a.startswith("bin/")} == {"tailrace", f"{wheel.name.split('-py3')[0]}.dist-info"}, added
    assert {a for a in added if a.startswith("bin/")} == {"bin/tailrace"}, added

    work = tmp_path / "elsewhere"  # no source here: everything comes from the venv
    work.mkdir()
    where = _run([str(py), "-c", "import tailrace, tailrace.client.records as r; print(tailrace.__file__); print(r.__file__)"],
                 cwd=work).stdout.split()
    assert all(w.startswith(str(_site_packages(venv))) for w in where), where

    bootstrap = f"tcp://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILRACE_")}
    env["TAILRACE_BOOTSTRAP"] = bootstrap
    metrics = f"127.0.0.1:{free_port()}"  # not the default 9420: a developer's own broker may hold it
    serve = subprocess.Popen([str(tailrace), "serve", "--bind", bootstrap, "--workers", "1", "--metrics-bind", metrics,
                              "--segment-bytes", str(8 << 20), "--shm-budget-bytes", str(256 << 20)],
                             cwd=work, env=env, stdout=open(tmp_path / "serve.out", "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(tailrace), "status"], cwd=work, env=env, capture_output=True).returncode != 0:
            assert serve.poll() is None, (tmp_path / "serve.out").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.out").read_text()
            time.sleep(0.3)
        _run([str(tailrace), "topic", "create", "wheel", "--partitions", "2"], cwd=work, env=env)
        _run([str(tailrace), "produce", "wheel", "--acks", "durable"], cwd=work, env=env, input="one\ntwo\nthree\n")
        out = _run([str(tailrace), "consume", "wheel", "--from", "earliest", "--timeout-ms", "1000"], cwd=work, env=env).stdout
        assert sorted(out.split()) == ["one", "three", "two"], out
        assert (work / "data" / "journal").is_dir()  # the embedded default: ./data
        # the metrics program runs from the wheel too (supervisord.conf inside the package)
        until = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
                    text = r.read().decode()
                if 'tailrace_partition_records_appended_total{partition="0",topic="wheel"}' in text:
                    break
            except OSError:
                pass
            assert time.monotonic() < until, "no metrics from the wheel's broker"
            time.sleep(0.5)
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(120) == 0, (tmp_path / "serve.out").read_text()

    _run([str(py), "-m", "pip", "uninstall", "-y", "tailrace"])
    assert _listing(venv) == before, _listing(venv) ^ before
