"""client/alloc.py: with ``keep_large_blocks`` a process that copies bursts of large blocks (fetch
replies out of a ring, messages ZeroMQ receives) stops taking a page fault per page of each one;
every broker program sets it at start (broker/datadir.py ``enter_program``)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

BURSTS = """
import resource, sys
if sys.argv[1] == "tuned":
    from tailrace.client.alloc import keep_large_blocks
    assert keep_large_blocks()
src = b"x" * 200_000
def burst():  # twenty 200 KB replies alive at once, then all freed
    live = [bytearray(src) for _ in range(20)]
    del live
for _ in range(3):
    burst()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    burst()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout)


def test_bursts_of_large_blocks_reuse_the_heap_instead_of_faulting_in_fresh_pages():
    pages = 50 * 20 * 200_000 // 4096
    default, tuned = _faults("default"), _faults("tuned")
    assert default > pages // 2, default  # glibc's defaults: the freed burst goes back to the kernel, every time
    assert tuned < pages // 50, tuned  # kept: the next burst lands on pages already mapped


def test_every_broker_program_keeps_large_blocks_from_its_first_step(tmp_path, monkeypatch):
    from tailrace.broker import datadir
    from tailrace.broker import settings as settings_mod

    called = []
    monkeypatch.setattr(datadir, "die_with_parent", lambda: None)  # not the test process's own parent
    monkeypatch.setattr(datadir, "keep_large_blocks", lambda: called.append(True))
    s = settings_mod.from_env(env={}, data_dir=str(tmp_path / "data"), bind="tcp://127.0.0.1:1")
    claim = datadir.enter_program(s, datadir.worker_role(0), None)
    try:
        assert called == [True]
    finally:
        claim.release()


def test_procstat_counts_the_faults_of_pages_touched_for_the_first_time():
    import mmap
    import os

    from tailrace.bench.procstat import minor_faults

    before = minor_faults(os.getpid())
    with mmap.mmap(-1, 64 * 4096) as m:  # anonymous: every page faults in when first written
        for i in range(64):
            m[i * 4096] = 1
    assert minor_faults(os.getpid()) - before >= 64
    assert minor_faults(2**22 + 12345) is None  # no such process
