"""Doorbells (shm/doorbell.py): the flusher's kicks and sync notices as Unix datagrams."""

from __future__ import annotations

import os
import stat

from tailrace.shm.doorbell import Doorbell, Ringer


def test_a_ring_wakes_the_bell_and_drain_returns_every_ring_once(tmp_path):
    bell, ringer = Doorbell(str(tmp_path / "a.bell")), Ringer()
    try:
        assert stat.S_IMODE(os.stat(bell.path).st_mode) & 0o077 == 0  # only its owner's processes ring it
        assert not bell.wait(0) and bell.drain() == b""
        assert ringer.ring(bell.path, b"D") and ringer.ring(bell.path, b"N")
        assert bell.wait(1.0)
        assert bell.drain() == b"DN"
        assert not bell.wait(0) and bell.drain() == b""
    finally:
        bell.close()
        ringer.close()


def test_ringing_a_bell_nobody_has_bound_says_so(tmp_path):
    ringer = Ringer()
    try:
        assert not ringer.ring(str(tmp_path / "missing.bell"), b"D")
        bell = Doorbell(str(tmp_path / "gone.bell"))
        bell.sock.close()  # its owner died: the path is left, nobody reads it
        assert not ringer.ring(bell.path, b"D")
    finally:
        ringer.close()


def test_a_full_bell_drops_rings_without_blocking_or_failing_and_wakes_its_owner(tmp_path):
    bell, ringer = Doorbell(str(tmp_path / "full.bell")), Ringer()
    try:
        for _ in range(20_000):  # far beyond a datagram queue
            assert ringer.ring(bell.path, b"D")
        got = bell.drain()
        assert 0 < len(got) < 20_000 and set(got) == {ord("D")}
        assert ringer.ring(bell.path, b"E") and bell.drain() == b"E"  # rings again once drained
    finally:
        bell.close()
        ringer.close()


def test_a_successor_takes_the_path_over_and_the_old_owner_leaves_it_alone(tmp_path):
    path = str(tmp_path / "worker-0.bell")
    old = Doorbell(path)
    new = Doorbell(path)  # a restarted process binds the same path (the stale one is unlinked)
    ringer = Ringer()
    try:
        old.close()  # the old owner's close must not unlink its successor's bell
        assert os.path.exists(path)
        assert ringer.ring(path, b"D") and new.wait(1.0) and new.drain() == b"D"
        new.close()
        assert not os.path.exists(path)
    finally:
        ringer.close()


def test_the_flusher_rings_every_workers_bell_after_a_sync_and_drops_gone_ones(tmp_path):
    from tailrace.client.records import encode_batch

    from tailrace.bench.inprocess import make_storage

    st = make_storage(tmp_path / "data", partitions=1)
    ipc = st.s.ipc_path()
    os.makedirs(ipc, mode=0o700, exist_ok=True)
    bells = [Doorbell(st.s.worker_bell_path(i)) for i in (0, 1)]
    st.flusher.ringer = Ringer()
    try:
        st.flusher.rescan()  # as at boot, or after a worker's kick b"N": it finds the bells
        assert st.flusher.worker_bells == [b.path for b in bells]
        assert st.actors[0].append(encode_batch([b"x"]), 1 << 14)[0] == 0
        st.flusher.durable_wanted = True
        st.flusher.do_work()  # stages, writes and syncs: every worker hears of it
        assert [b.drain() for b in bells] == [b"D", b"D"]
        bells[1].close()  # that worker is gone
        st.flusher.sync()
        assert bells[0].drain() == b"D" and st.flusher.worker_bells == [bells[0].path]
        bells[1] = Doorbell(st.s.worker_bell_path(1))  # it is back: found at the next rescan
        st.flusher.rescan()
        st.flusher._fail(OSError("disk gone"))  # a latched I/O error is rung as b"E"
        assert [b.drain() for b in bells] == [b"E", b"E"]
    finally:
        for b in bells:
            b.close()
        st.flusher.ringer.close()
        st.close()
        os.rmdir(ipc)
