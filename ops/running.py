"""What the broker running on a data directory was started with, found from the directory alone.

Some facts this relies on:

- ``tailrace serve`` hands every setting to supervisord and the programs as ``TAILRACE_*``
  environment variables (ops/serve.py ``serve_env``), and every program of a live broker holds
  the data directory's broker lock open (broker/datadir.py ``BROKER_LOCK``).
- ``/proc/<pid>/environ`` is the environment a process was started with; it is readable by the
  process's own user and by root, the same people who may use the broker's run directory.

What this means for us: the settings of the live broker (its run directory, whether it runs
with ``--auth curve``) are in the environment of any process holding the lock. No file records
them, so none can go stale, and a directory with no live broker has no settings here (None).
A command that talks to the run directory (``tailrace workers set``) or must say whether the
broker enforces what it wrote (``tailrace acl add``) asks here instead of trusting its own
environment to match the broker's.
"""

from __future__ import annotations

import os

from tailrace.broker import datadir
from tailrace.broker import settings as settings_mod

ENV_PREFIX = "TAILRACE_"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:  # exited, or another user's
        return {}
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name.startswith(ENV_PREFIX.encode()):
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def live_env(data_dir: str) -> dict[str, str] | None:
    """The ``TAILRACE_*`` environment of a live broker on ``data_dir``, or None if none runs
    there (or its processes belong to another user)."""
    real = os.path.realpath(data_dir)
    lock = datadir.lock_path(real, datadir.BROKER_LOCK)
    if not lock.exists():
        return None
    for pid in datadir.holders(lock):
        env = _environ(pid)
        if env.get(ENV_PREFIX + "DATA_DIR") and os.path.realpath(env[ENV_PREFIX + "DATA_DIR"]) == real:
            return env
    return None


def live_settings(data_dir: str) -> settings_mod.Settings | None:
    """The settings of the live broker on ``data_dir`` (None if none runs there)."""
    env = live_env(data_dir)
    if env is None:
        return None
    try:
        return settings_mod.from_env(env=env)
    except (ValueError, TypeError):  # a broker of another version with settings we do not know
        return None
