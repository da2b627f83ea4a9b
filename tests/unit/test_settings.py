"""broker/settings.py and the names of broker/datadir.py: one struct from TAILRACE_* variables."""

from __future__ import annotations

import os

import pytest

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod


def test_every_field_round_trips_through_the_environment():
    s = settings_mod.Settings(data_dir="/d", workers=3, ring_bytes=1 << 20, data_mode="0750", ipc_dir="/r",
                              shm_budget_bytes=3 << 30, disk_max_used_ratio=0.7)
    env = settings_mod.to_env(s)
    assert env["TAILRACE_WORKERS"] == "3" and env["TAILRACE_DATA_MODE"] == "0750"
    assert settings_mod.from_env(env) == s


def test_a_budget_of_0_is_the_machines_default_and_goes_to_the_programs_resolved():
    s = settings_mod.from_env({"TAILRACE_SHM_BUDGET_BYTES": "0"})
    assert s.shm_budget_bytes == settings_mod.default_shm_budget() > 0
    assert settings_mod.from_env(settings_mod.to_env(s)).shm_budget_bytes == s.shm_budget_bytes


def test_overrides_win_over_the_environment_and_none_means_not_given():
    env = {"TAILRACE_WORKERS": "5", "TAILRACE_BIND": "tcp://127.0.0.1:1"}
    s = settings_mod.from_env(env, workers=2, bind=None)
    assert s.workers == 2 and s.bind == "tcp://127.0.0.1:1"
    assert settings_mod.from_env({}).data_dir == "./data"  # the embedded default


@pytest.mark.parametrize("bad", [
    dict(segment_bytes=1 << 20, max_batch_bytes=1 << 20),  # segment < 4 x batch
    dict(segment_bytes=(8 << 20) + 1),  # not a multiple of 4096
    dict(write_buffer_bytes=1 << 20, max_batch_bytes=1 << 20),  # buffer < 2 x batch
    dict(workers=0),
    dict(data_mode="0600"),  # the owner must keep rwx
    dict(data_mode="1777"),  # beyond 0777
])
def test_inconsistent_settings_are_refused_with_the_numbers(bad):
    with pytest.raises(ValueError):
        settings_mod.from_env({}, **bad)


def test_the_instance_is_a_hash_of_the_data_directorys_real_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    a = settings_mod.Settings(data_dir=str(tmp_path / "real"))
    b = settings_mod.Settings(data_dir=str(tmp_path / "link"))
    c = settings_mod.Settings(data_dir=str(tmp_path / "other"))
    assert a.instance == b.instance != c.instance and len(a.instance) == 10


def test_run_directory_paths_come_from_datadir_names_and_fit_a_unix_socket():
    s = settings_mod.Settings(data_dir="/d", ipc_dir="/run/x")
    assert s.worker_endpoint(3) == "ipc:///run/x/worker-3.ipc"
    assert s.worker_unix_endpoint(3) == "unix:///run/x/worker-3.sock"
    assert s.worker_bell_path(3) == "/run/x/worker-3.bell" and s.flusher_bell_path() == "/run/x/flusher.bell"
    assert datadir.worker_id_of("worker-12.bell", "bell") == 12
    assert datadir.worker_id_of("worker-x.bell", "bell") is None and datadir.worker_id_of("flusher.bell", "bell") is None
    default = settings_mod.Settings(data_dir="/some/where").ipc_path()
    assert len(os.path.join(default, "worker-9999.sock")) <= datadir.UNIX_PATH_MAX


def test_max_frame_bytes_leaves_room_for_headers_above_the_largest_batch():
    s = settings_mod.Settings(max_batch_bytes=64 * 1024)
    assert s.max_frame_bytes == 64 * 1024 + (1 << 20)


def test_data_mode_gives_the_umask_and_the_file_mode():
    assert datadir.umask_for(datadir.parse_mode("0700")) == 0o077
    assert datadir.umask_for(datadir.parse_mode("0750")) == 0o027


def test_a_stats_write_never_makes_a_missing_run_directory_or_its_parents(tmp_path):
    """A process that writes its stats after its broker removed the run directory used to make it
    again with os.makedirs, parents included, at the default mode: the run base (/run/tailrace
    for root) then came back 0755, and every later broker refused it as not private."""
    from tailrace.broker.stats import StatsFile

    run_dir = tmp_path / "base" / "instance"
    stats = StatsFile(str(run_dir), "flusher")
    assert stats.maybe_write(lambda: ({}, {}, {}), force=True) is False
    assert not (tmp_path / "base").exists()
    run_dir.mkdir(parents=True, mode=0o700)
    assert stats.maybe_write(lambda: ({}, {}, {}), force=True) is True
    assert (os.stat(stats.dir).st_mode & 0o777) == 0o700
